// kvlab calibrate chelsea | duo: the offline calibration runs of methods that need one.
//
// chelsea: Chelsea's outlier heads (App. B, §5.4).
//
//   kvlab calibrate chelsea --model M --text ../shared/data/wikitext2/wiki.test.raw
//                           [--samples 8] [--tokens 2048] [--seed 0] [--threshold 0.8] --out F.json
//
// Tokenises the text once, draws `samples` windows of `tokens` tokens at seeded random offsets,
// runs each through the model's prefill with a tap on every layer's post-RoPE keys, and scores
// every (layer, KV head) as App. B does: with the chunked soft matching's partition (n_sink,
// n_recent, chunk as chelsea's defaults), the fraction of A entries whose best edge to B has cosine
// similarity below `threshold` (chelsea_outlier_scores); averaged over the windows. High = outlier
// head. The JSON ({"scores": [[layer 0 heads], ...], ...}) is what chelsea's `outliers` parameter
// reads; its `outlier_fraction` (4%) picks the top heads.
//
//   kvlab calibrate duo --model M --text ../shared/data/wikitext2/wiki.test.raw
//                       [--samples 50] [--tokens 2048] [--seed 0] [--q-len 500] --out F.json
//
// duo: DuoAttention's head scores as kvpress's on-the-fly variant makes them (duo_attention.h:
// per window and layer, the mean query and key of each head, the area under the cumulated
// attention curve of the last of q_len synthetic queries), averaged over the windows; kvpress
// draws 50 BookSum chapters, this draws 50 windows of the given text. The JSON
// ({"kind": "duo_head_scores", "scores": [[layer 0 heads], ..., null for sliding window layers]})
// is what duo_attention's `heads` parameter reads.
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/compress/chelsea.h"
#include "kvlab/compress/duo_attention.h"
#include "kvlab/core/check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"

namespace kvlab::cli {
namespace {

// What every calibration reads and writes: `samples` windows of `tokens` tokens of --text at seeded
// offsets through --model, and one --out JSON file (shared by calibrate chelsea and duo).
struct CalibrationWindows {
  std::string model;
  std::string text;
  int64_t samples;
  int64_t tokens = 2048;
  int64_t seed = 0;
  std::string device = "cpu";
  std::string out;
  bool overwrite = false;

  explicit CalibrationWindows(int64_t default_samples) : samples(default_samples) {}
  void window_fields(FieldList& f, const std::string& text_help, const std::string& samples_help) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)").required();
    f.add("text", text, text_help).required();
    f.add("samples", samples, samples_help);
    f.add("tokens", tokens, "tokens per window");
    f.add("seed", seed, "seed of the window offsets");
  }
  void output_fields(FieldList& f, const std::string& out_help) {
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("out", out, out_help).required();
    f.add("overwrite", overwrite, "replace an existing --out file");
  }
  // Windows are forwarded one by one (seconds each on a CPU): a count no run can finish is refused
  // before the model loads (issue 50: --samples 1e9 started with an ETA of 139 days).
  void check_windows() const {
    constexpr int64_t kMaxWindows = 100000;
    KVLAB_CHECK(samples >= 1 && samples <= kMaxWindows, "--samples must be in [1, {}] (windows; kvpress calibrates "
                "on 50), got {}", kMaxWindows, samples);
    KVLAB_CHECK(tokens >= 1, "--tokens must be >= 1, got {}", tokens);
    parse_device(device, "--device");
  }
};

struct CalibrateChelseaOptions : CalibrationWindows {
  double threshold = 0.8;
  int64_t n_sink = 16;
  int64_t n_recent = 64;
  int64_t chunk = 256;
  CalibrateChelseaOptions() : CalibrationWindows(8) {}
  void fields(FieldList& f) {
    window_fields(f, "calibration text (the paper: WikiText-2, ../shared/data/wikitext2/wiki.test.raw)",
                  "windows drawn from the text (seeded)");
    f.add("threshold", threshold, "edge similarity below which an A entry counts as unconnected (App. B: 0.8)");
    f.add("n_sink", n_sink, "first entries outside the matching (chelsea's n_sink)");
    f.add("n_recent", n_recent, "last entries outside the matching (chelsea's n_recent)");
    f.add("chunk", chunk, "chunk size of the soft matching (chelsea's chunk)");
    output_fields(f, "output JSON (chelsea's `outliers` parameter reads it)");
  }
  void check() const {
    check_windows();
    KVLAB_CHECK(threshold > -1 && threshold <= 1, "--threshold must be a cosine in (-1, 1], got {}", threshold);
    KVLAB_CHECK(chunk >= 2, "--chunk must be >= 2, got {}", chunk);
    KVLAB_CHECK(n_sink >= 0 && n_sink < tokens, "--n-sink must be in [0, --tokens), got {}", n_sink);
    KVLAB_CHECK(n_recent >= 0 && n_recent < tokens, "--n-recent must be in [0, --tokens), got {}", n_recent);
    KVLAB_CHECK(tokens > n_sink + n_recent + 1, "--tokens ({}) must exceed --n-sink + --n-recent + 1 = {}", tokens,
                n_sink + n_recent + 1);
  }
};

// Accumulates every layer's outlier scores over the windows.
struct ScoreTap : QkvTap {
  ChelseaConfig cfg;
  double threshold = 0.8;
  at::Tensor sum;  // [n_layers, n_kv_heads] float64
  void on_qkv(int layer, const at::Tensor&, const at::Tensor& k, const at::Tensor&) override {
    auto s = chelsea_outlier_scores(k.to(at::kCPU, at::kFloat), cfg, threshold);  // [Hkv]
    sum[layer] += s;
  }
};

// The model, its tokenizer's ids of --text, and `samples` windows of `tokens` ids at seeded random
// offsets (each starting with the model's BOS, like a prompt), run through the prefill with `tap`.
struct CalibrationRun {
  Model model;
  std::vector<int64_t> offsets;
};

CalibrationRun run_windows(const CalibrationWindows& w, QkvTap& tap, const std::function<void(const Model&)>& on_loaded) {
  std::ifstream in(w.text, std::ios::binary);
  KVLAB_CHECK(in.good(), "--text '{}': cannot open", w.text);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  KVLAB_CHECK(!text.empty(), "--text '{}': the file is empty", w.text);

  ModelSource src = resolve_model(w.model, "--model");
  ModelLoadOptions lo;
  lo.device = parse_device(w.device, "--device");
  CalibrationRun run{load_model(src, lo), {}};
  const ModelConfig& c = run.model.config;
  const int64_t ctx = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  KVLAB_CHECK(w.tokens <= ctx, "--tokens {} exceeds the model's context of {} tokens", w.tokens, ctx);
  Tokenizer tok = load_model_tokenizer(src);
  const std::vector<int64_t> ids = tok.encode(text, /*add_bos=*/false);
  KVLAB_CHECK(static_cast<int64_t>(ids.size()) >= w.tokens, "--text '{}' has {} tokens, fewer than --tokens {}",
              w.text, ids.size(), w.tokens);
  on_loaded(run.model);
  ExactAttention attn(c.n_layers);
  ForwardOptions fo;
  fo.tap = &tap;
  fo.logits = false;
  std::mt19937_64 gen(static_cast<uint64_t>(w.seed));
  std::uniform_int_distribution<int64_t> offset(0, static_cast<int64_t>(ids.size()) - w.tokens);
  Progress progress("calibrate", w.samples);
  for (int64_t s = 0; s < w.samples; ++s) {
    const int64_t off = offset(gen);
    run.offsets.push_back(off);
    std::vector<int64_t> window(ids.begin() + off, ids.begin() + off + w.tokens);
    if (c.bos_token_id >= 0) window.front() = c.bos_token_id;  // each window starts like a prompt
    attn.reset();
    forward(run.model, at::tensor(window, at::kLong), 0, attn, fo);
    progress.advance(1, fmt::format("window at token {}", off));
  }
  progress.finish();
  return run;
}

void run_calibrate_chelsea(const CalibrateChelseaOptions& o, const nlohmann::json& effective) {
  check_output_file(o.out, "--out", {o.model, o.text}, o.overwrite);
  c10::InferenceMode guard;
  ScoreTap tap;
  tap.cfg.n_sink = o.n_sink;
  tap.cfg.n_recent = o.n_recent;
  tap.cfg.chunk = o.chunk;
  tap.threshold = o.threshold;
  CalibrationRun run = run_windows(o, tap, [&](const Model& m) {
    tap.sum = at::zeros({m.config.n_layers, m.config.n_kv_heads}, at::kDouble);
  });
  const Model& model = run.model;
  const ModelConfig& c = model.config;
  const std::vector<int64_t>& offsets = run.offsets;
  auto scores = tap.sum / static_cast<double>(o.samples);  // [L, Hkv]
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::vector<double> r(c.n_kv_heads);
    for (int64_t h = 0; h < c.n_kv_heads; ++h) r[h] = scores[l][h].item<double>();
    rows.push_back(r);
  }
  nlohmann::json j = {{"kind", "chelsea_outlier_scores"},
                      {"model", model.id},
                      {"model_key", model_key(run.model)},
                      {"text", o.text},
                      {"n_layers", c.n_layers},
                      {"n_kv_heads", c.n_kv_heads},
                      {"window_offsets", offsets},
                      {"scores", rows},
                      {"context", context_block(o.device, static_cast<uint64_t>(o.seed), effective)}};
  write_json_atomic(o.out, j);
  // The top heads, for the log.
  auto top = chelsea_select_outlier_heads(scores, 0.04);
  std::string names;
  for (const auto& [l, h] : top) names += fmt::format(" {}:{}", l, h);
  fmt::print(stderr, "[calibrate] wrote {}: {} layers x {} KV heads over {} windows of {} tokens; top 4%:{}\n", o.out,
             c.n_layers, c.n_kv_heads, o.samples, o.tokens, names.empty() ? " (none)" : names);
}

struct CalibrateDuoOptions : CalibrationWindows {
  int64_t q_len = 500;
  CalibrateDuoOptions() : CalibrationWindows(50) {}
  void fields(FieldList& f) {
    window_fields(f, "calibration text (kvpress: BookSum chapters; here e.g. ../shared/data/wikitext2/wiki.test.raw)",
                  "windows drawn from the text (seeded; kvpress: 50 chapters)");
    f.add("q_len", q_len, "synthetic positions the mean query and key are rotated over (kvpress: 500)");
    output_fields(f, "output JSON (duo_attention's `heads` parameter reads it)");
  }
  void check() const {
    check_windows();
    // One position: the softmax over one key is 1 and every head scores 1.0 (issue 50).
    KVLAB_CHECK(q_len >= 2, "--q-len must be >= 2 (over one position every head scores 1), got {}", q_len);
  }
};

// Accumulates every compressed layer's DuoAttention head scores over the windows.
struct DuoTap : QkvTap {
  const Model* model = nullptr;
  int64_t q_len = 500;
  at::Tensor sum;  // [n_layers, n_kv_heads] float64
  bool wants(int layer) const override { return model->config.layer_window(layer) == 0; }
  void on_qkv(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor&) override {
    sum[layer] += duo_head_scores(q, k, model->layer_inv_freq(layer), q_len);  // [Hkv]
  }
};

void run_calibrate_duo(const CalibrateDuoOptions& o, const nlohmann::json& effective) {
  check_output_file(o.out, "--out", {o.model, o.text}, o.overwrite);
  c10::InferenceMode guard;
  DuoTap tap;
  tap.q_len = o.q_len;
  CalibrationRun run = run_windows(o, tap, [&](const Model& m) {
    tap.model = &m;
    tap.sum = at::zeros({m.config.n_layers, m.config.n_kv_heads}, at::kDouble);
  });
  const ModelConfig& c = run.model.config;
  const at::Tensor scores = tap.sum / static_cast<double>(o.samples);  // [L, Hkv]
  nlohmann::json rows = nlohmann::json::array();
  int64_t window_layers = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.layer_window(l) > 0) {  // held exactly, never compressed: left out of the ranking
      rows.push_back(nullptr);
      ++window_layers;
      continue;
    }
    std::vector<double> r(c.n_kv_heads);
    for (int64_t h = 0; h < c.n_kv_heads; ++h) r[h] = scores[l][h].item<double>();
    rows.push_back(r);
  }
  nlohmann::json j = {{"kind", "duo_head_scores"},
                      {"model", run.model.id},
                      {"model_key", model_key(run.model)},
                      {"text", o.text},
                      {"n_layers", c.n_layers},
                      {"n_kv_heads", c.n_kv_heads},
                      {"q_len", o.q_len},
                      {"window_offsets", run.offsets},
                      {"scores", rows},
                      {"context", context_block(o.device, static_cast<uint64_t>(o.seed), effective)}};
  write_json_atomic(o.out, j);
  fmt::print(stderr, "[calibrate] wrote {}: DuoAttention scores of {} layers x {} KV heads ({} sliding window layers "
             "left out) over {} windows of {} tokens\n", o.out, c.n_layers - window_layers, c.n_kv_heads,
             window_layers, o.samples, o.tokens);
}

}  // namespace

void setup_calibrate(CLI::App& app) {
  auto* group = app.add_subcommand("calibrate", "Offline calibration runs of methods that need one");
  group->require_subcommand(1);
  add_command<CalibrateChelseaOptions>(*group, "chelsea",
                                       "Chelsea's outlier heads (App. B): per (layer, KV head), the fraction of "
                                       "tokens whose best soft-matching edge has cosine < threshold",
                                       run_calibrate_chelsea);
  add_command<CalibrateDuoOptions>(*group, "duo",
                                   "DuoAttention's head scores (kvpress's on-the-fly variant): per (layer, KV head), "
                                   "the area under the cumulated attention of the mean query over the mean key",
                                   run_calibrate_duo);
}

}  // namespace kvlab::cli
