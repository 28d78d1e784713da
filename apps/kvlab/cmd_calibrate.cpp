// kvlab calibrate chelsea: Chelsea's offline calibration of outlier heads (App. B, §5.4).
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
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <fstream>
#include <random>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/compress/chelsea.h"
#include "kvlab/core/check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"

namespace kvlab::cli {
namespace {

struct CalibrateChelseaOptions {
  bool overwrite = false;
  std::string model;
  std::string text;
  int64_t samples = 8;
  int64_t tokens = 2048;
  int64_t seed = 0;
  double threshold = 0.8;
  int64_t n_sink = 16;
  int64_t n_recent = 64;
  int64_t chunk = 256;
  std::string device = "cpu";
  std::string out;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)").required();
    f.add("text", text, "calibration text (the paper: WikiText-2, ../shared/data/wikitext2/wiki.test.raw)").required();
    f.add("samples", samples, "windows drawn from the text (seeded)");
    f.add("tokens", tokens, "tokens per window");
    f.add("seed", seed, "seed of the window offsets");
    f.add("threshold", threshold, "edge similarity below which an A entry counts as unconnected (App. B: 0.8)");
    f.add("n_sink", n_sink, "first entries outside the matching (chelsea's n_sink)");
    f.add("n_recent", n_recent, "last entries outside the matching (chelsea's n_recent)");
    f.add("chunk", chunk, "chunk size of the soft matching (chelsea's chunk)");
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("out", out, "output JSON (chelsea's `outliers` parameter reads it)").required();
    f.add("overwrite", overwrite, "replace an existing --out file");
  }
  void check() const {
    KVLAB_CHECK(samples >= 1, "--samples must be >= 1, got {}", samples);
    KVLAB_CHECK(threshold > -1 && threshold <= 1, "--threshold must be a cosine in (-1, 1], got {}", threshold);
    KVLAB_CHECK(chunk >= 2, "--chunk must be >= 2, got {}", chunk);
    KVLAB_CHECK(tokens >= 1, "--tokens must be >= 1, got {}", tokens);
    KVLAB_CHECK(n_sink >= 0 && n_sink < tokens, "--n-sink must be in [0, --tokens), got {}", n_sink);
    KVLAB_CHECK(n_recent >= 0 && n_recent < tokens, "--n-recent must be in [0, --tokens), got {}", n_recent);
    KVLAB_CHECK(tokens > n_sink + n_recent + 1, "--tokens ({}) must exceed --n-sink + --n-recent + 1 = {}", tokens,
                n_sink + n_recent + 1);
    parse_device(device, "--device");
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

void run_calibrate_chelsea(const CalibrateChelseaOptions& o, const nlohmann::json& effective) {
  check_output_file(o.out, "--out", {o.model, o.text}, o.overwrite);
  std::ifstream in(o.text, std::ios::binary);
  KVLAB_CHECK(in.good(), "--text '{}': cannot open", o.text);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  KVLAB_CHECK(!text.empty(), "--text '{}': the file is empty", o.text);

  c10::InferenceMode guard;
  ModelSource src = resolve_model(o.model, "--model");
  ModelLoadOptions lo;
  lo.device = parse_device(o.device, "--device");
  Model model = load_model(src, lo);
  const ModelConfig& c = model.config;
  const int64_t ctx = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  KVLAB_CHECK(o.tokens <= ctx, "--tokens {} exceeds the model's context of {} tokens", o.tokens, ctx);
  Tokenizer tok = load_model_tokenizer(src);
  const std::vector<int64_t> ids = tok.encode(text, /*add_bos=*/false);
  KVLAB_CHECK(static_cast<int64_t>(ids.size()) >= o.tokens, "--text '{}' has {} tokens, fewer than --tokens {}",
              o.text, ids.size(), o.tokens);

  ScoreTap tap;
  tap.cfg.n_sink = o.n_sink;
  tap.cfg.n_recent = o.n_recent;
  tap.cfg.chunk = o.chunk;
  tap.threshold = o.threshold;
  tap.sum = at::zeros({c.n_layers, c.n_kv_heads}, at::kDouble);
  ExactAttention attn(c.n_layers);
  ForwardOptions fo;
  fo.tap = &tap;
  fo.logits = false;
  std::mt19937_64 gen(static_cast<uint64_t>(o.seed));
  std::uniform_int_distribution<int64_t> offset(0, static_cast<int64_t>(ids.size()) - o.tokens);
  std::vector<int64_t> offsets;
  Progress progress("calibrate", o.samples);
  for (int64_t s = 0; s < o.samples; ++s) {
    const int64_t off = offset(gen);
    offsets.push_back(off);
    std::vector<int64_t> window(ids.begin() + off, ids.begin() + off + o.tokens);
    if (c.bos_token_id >= 0) window.front() = c.bos_token_id;  // each window starts like a prompt
    attn.reset();
    forward(model, at::tensor(window, at::kLong), 0, attn, fo);
    progress.advance(1, fmt::format("window at token {}", off));
  }
  progress.finish();
  auto scores = tap.sum / static_cast<double>(o.samples);  // [L, Hkv]
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::vector<double> r(c.n_kv_heads);
    for (int64_t h = 0; h < c.n_kv_heads; ++h) r[h] = scores[l][h].item<double>();
    rows.push_back(r);
  }
  nlohmann::json j = {{"kind", "chelsea_outlier_scores"},
                      {"model", model.id},
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

}  // namespace

void setup_calibrate(CLI::App& app) {
  auto* group = app.add_subcommand("calibrate", "Offline calibration runs of methods that need one");
  group->require_subcommand(1);
  add_command<CalibrateChelseaOptions>(*group, "chelsea",
                                       "Chelsea's outlier heads (App. B): per (layer, KV head), the fraction of "
                                       "tokens whose best soft-matching edge has cosine < threshold",
                                       run_calibrate_chelsea);
}

}  // namespace kvlab::cli
