// kvlab dump --model M (--dataset SPEC | --prompt-file F | --prompt TEXT) [--samples N]
//            [--max-tokens N] [--layers all|0,1,4] [--queries all|last:256]
//            [--dtype float32|float16|bfloat16] [--generate N] [--out F.h5]
// Runs one prefill per prompt with a QkvTap that hands each wanted layer's post-RoPE q/k/v to the
// CaptureWriter as soon as the layer produces it, so memory never holds more than one layer's
// q/k/v (peak memory is nearly independent of the number of captured layers).
// Prompts longer than --max-tokens keep their first and last max_tokens/2 tokens (LongBench rule;
// an odd N keeps N-1). A prompt longer than the model's context is an error naming the context and
// the prompt's length, unless --truncate asks for the same middle truncation to the context.
// --generate N first decodes N tokens greedily from each (truncated) prompt with the exact cache,
// EOS ignored, and captures prompt + those tokens in one prefill: exact attention is causal, so
// the last N positions hold the q/k/v the model made while generating them (to float rounding);
// clusterability and tsne select them with --last N (SubGen Fig. 1: keys of generated tokens).
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/config.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/check.h"
#include "kvlab/core/memory.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/report.h"
#include "kvlab/eval/datasets.h"
#include "kvlab/io/capture.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"

namespace kvlab::cli {
namespace {

int64_t parse_queries(const std::string& s);

struct DumpOptions {
  std::string model;
  std::string dataset;
  std::string prompt_file;
  std::string prompt;
  int64_t samples = -1;
  int64_t max_tokens = 0;
  std::string layers = "all";
  std::string queries = "all";
  std::string dtype = "float32";
  std::string compute_dtype = "fp32";
  std::string device = "cpu";
  std::string chat_template = "auto";
  std::string out = "capture.h5";
  bool overwrite = false;
  bool truncate = false;
  int64_t generate = 0;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)").required();
    f.add("dataset", dataset, "JSONL prompt source (LongBench, LongEval, XSUM or {prompt|text} records)");
    f.add("prompt_file", prompt_file, "a text file used as one prompt");
    f.add("prompt", prompt, "one prompt given inline");
    f.add("samples", samples, "number of records to dump from --dataset (-1 = all)");
    f.add("max_tokens", max_tokens, "truncate longer prompts in the middle to N tokens (first and last N/2; "
                                    "0 = no limit below the model's context)");
    f.add("truncate", truncate, "truncate prompts longer than the model's context in the middle instead of failing");
    f.add("generate", generate, "append N tokens greedily generated from each prompt (exact cache, EOS ignored) and "
                                "capture them too: the last N positions are generated tokens (clusterability/tsne "
                                "--last N)");
    f.add("layers", layers, "'all' or comma-separated 0-based layer indices");
    f.add("queries", queries, "'all' or 'last:N': query positions stored per sample");
    f.add("dtype", dtype, "storage dtype of q/k/v").one_of({"float32", "float16", "bfloat16"});
    f.add("compute_dtype", compute_dtype, "forward-pass dtype: fp32 | bf16 | fp16");
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("chat_template", chat_template, "none | auto | a template name (records may opt out)");
    f.add("out", out, "output capture file (.h5); never one of the inputs");
    f.add("overwrite", overwrite, "replace an existing --out file");
  }
  void check() const {
    const int n_sources = !dataset.empty() + !prompt_file.empty() + !prompt.empty();
    KVLAB_CHECK(n_sources == 1, "give exactly one of --dataset, --prompt-file, --prompt (found {})", n_sources);
    KVLAB_CHECK(samples == -1 || samples >= 1, "--samples must be >= 1 or -1 (all), got {}", samples);
    KVLAB_CHECK(max_tokens == 0 || max_tokens >= 2, "--max-tokens must be 0 (no limit) or >= 2 (the first and "
                "last N/2 tokens are kept), got {}", max_tokens);
    KVLAB_CHECK(generate >= 0, "--generate must be >= 0 (0: the prompt only), got {}", generate);
    parse_storage_dtype(dtype, "--dtype");
    parse_queries(queries);
    parse_compute_dtype(compute_dtype, "--compute-dtype");
    parse_device(device, "--device");
  }
};

std::vector<int> parse_layers(const std::string& s, int64_t n_layers) {
  std::vector<int> out;
  if (s == "all") {
    for (int i = 0; i < n_layers; ++i) out.push_back(i);
    return out;
  }
  std::set<int> seen;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVLAB_CHECK(!item.empty() && used == item.size(), "--layers '{}': '{}' is not an integer "
                "(expected 'all' or e.g. 0,1,4)", s, item);
    KVLAB_CHECK(v >= 0 && v < n_layers, "--layers '{}': layer {} out of range [0, {}) for this "
                "model", s, v, n_layers);
    seen.insert(v);
  }
  KVLAB_CHECK(!seen.empty(), "--layers '{}': no layer given", s);
  return {seen.begin(), seen.end()};
}

// "all" -> -1; "last:N" -> N.
int64_t parse_queries(const std::string& s) {
  if (s == "all") return -1;
  const std::string prefix = "last:";
  int64_t n = 0;
  size_t used = 0;
  bool ok = s.compare(0, prefix.size(), prefix) == 0 && s.size() > prefix.size();
  if (ok) {
    try {
      n = std::stoll(s.substr(prefix.size()), &used);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  KVLAB_CHECK(ok && used == s.size() - prefix.size() && n >= 1,
              "--queries '{}': expected 'all' or 'last:N' with N >= 1", s);
  return n;
}

// Writes each wanted layer as it arrives; a layer holding NaN or Inf is refused (the writer's
// partial file is removed when the error unwinds it), so a capture never holds non-finite values.
struct CaptureTap : QkvTap {
  CaptureWriter* writer = nullptr;
  std::vector<bool> wanted;  // by layer
  Progress* progress = nullptr;
  int64_t sample = 0;        // the sample being written, for messages
  std::string sample_id;
  std::string out;
  bool wants(int layer) const override { return wanted.at(layer); }
  void on_qkv(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) override {
    // q [Hq, T, d] (every position: q_start 0), k/v [Hkv, T, d]
    const NonFinite nf = find_nonfinite(LayerQKV{q, k, v}, 0);
    KVLAB_CHECK(nf.count == 0, "sample {} ('{}'), layer {}: the forward pass produced {} non-finite value{} in "
                "q/k/v; the first is {}; nothing written to --out {} (check the model's weights and --compute-dtype)",
                sample, sample_id, layer, nf.count, nf.count == 1 ? "" : "s", describe_nonfinite(nf), out);
    writer->write_layer(layer, q, k, v);  // the writer keeps q's last n_q positions
    if (progress) progress->advance(1);
  }
};

void run_dump(const DumpOptions& o, const nlohmann::json& /*effective*/) {
#if defined(__GLIBC__)
  // glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, after which
  // the per-layer temporaries of the forward and the HDF5 compression buffers interleave on the
  // brk heap and fragment it: measured on SmolLM2 (2 x 2048 tokens), peak RSS 1541 MiB for 30
  // captured layers vs 940 MiB for 1. A fixed 1 MiB threshold sends every large tensor to mmap,
  // returned to the OS on free (30 layers: 864 MiB).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  const at::ScalarType storage = parse_storage_dtype(o.dtype, "--dtype");
  const int64_t last_q = parse_queries(o.queries);
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.compute_dtype, "--compute-dtype");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  check_output_file(o.out, "--out", {src.path, src.tokenizer_path, o.dataset, o.prompt_file}, o.overwrite);

  // Prompts first, so a bad --dataset fails before the model loads.
  std::vector<PromptRecord> records;
  std::string source_name;
  if (!o.dataset.empty()) {
    DatasetOptions dso;
    dso.max_samples = o.samples;
    records = read_dataset(o.dataset, dso).records;
    KVLAB_CHECK(!records.empty(), "--dataset {}: no records", o.dataset);
    source_name = o.dataset;
  } else {
    PromptRecord r;
    r.id = "prompt";
    if (!o.prompt_file.empty())
      KVLAB_CHECK(std::filesystem::is_regular_file(o.prompt_file), "--prompt-file {}: not a regular file",
                  o.prompt_file);
    r.prompt = o.prompt_file.empty() ? o.prompt : read_text_file(o.prompt_file, "--prompt-file");
    KVLAB_CHECK(r.prompt.find_first_not_of(" \t\r\n") != std::string::npos, "{}: the prompt is empty",
                o.prompt_file.empty() ? "--prompt" : "--prompt-file " + o.prompt_file);
    records.push_back(r);
    source_name = o.prompt_file.empty() ? "prompt" : o.prompt_file;
  }

  Model model = load_model(src, lo);
  const ModelConfig& c = model.config;
  Tokenizer tok = load_model_tokenizer(src);
  std::vector<int> layers = parse_layers(o.layers, c.n_layers);
  // A capture records no attention window: replay's exact reference is full causal attention, and
  // its RoPE frequencies are the global layers'. So a sliding layer is captured only for prompts
  // within its window; `--layers all` on a model that interleaves sliding and global layers
  // (gemma3) keeps the global ones and says so.
  int64_t slide_limit = 0;  // the smallest window among the captured layers (0 = none slides)
  if (o.layers == "all" && c.interleaved_windows()) {
    std::vector<int> global;
    for (int l : layers)
      if (c.layer_window(l) == 0) global.push_back(l);
    fmt::print(stderr, "[dump] note: {} layers of {} slide through a window of {} tokens, which a capture does not "
               "record; --layers all captures the {} global layers ({}); name sliding layers in --layers to capture "
               "them for prompts of at most {} tokens\n", layers.size() - global.size(), o.model, c.sliding_window,
               global.size(), fmt::join(global, ","), c.sliding_window);
    layers = global;
  }
  for (int l : layers)
    if (c.layer_window(l) > 0) slide_limit = slide_limit ? std::min(slide_limit, c.layer_window(l)) : c.layer_window(l);
  // The model's context: positions past it were never trained (RoPE scaling aside).
  const bool ctx_known = c.max_position_embeddings > 0;
  const int64_t ctx = ctx_known ? c.max_position_embeddings : 4096;
  const std::string ctx_what = ctx_known ? fmt::format("the model's context of {} tokens ({})", ctx, o.model)
                                         : fmt::format("an assumed context of {} tokens ({} gives none)", ctx, o.model);
  if (o.max_tokens % 2 == 1)
    fmt::print(stderr, "[dump] note: --max-tokens {} is odd; a longer prompt keeps its first and last {} tokens "
               "({} in all, LongBench's rule)\n", o.max_tokens, o.max_tokens / 2, o.max_tokens / 2 * 2);

  CaptureMeta meta;
  meta.model_id = model.id;
  meta.architecture = c.architecture;
  meta.n_layers = static_cast<int>(c.n_layers);
  meta.n_q_heads = static_cast<int>(c.n_q_heads);
  meta.n_kv_heads = static_cast<int>(c.n_kv_heads);
  meta.head_dim = static_cast<int>(c.head_dim);
  meta.rope_theta = c.rope_theta;
  meta.rope_scaling = c.rope_scaling.to_json();
  meta.dtype = storage_dtype_name(storage);
  meta.layers = layers;
  meta.queries = o.queries;
  meta.source_dataset = source_name;

  // A dump killed before it finished leaves "<out>.partial": a half-written HDF5 file that cannot
  // be continued safely, so it is removed and the capture made again from the start.
  if (remove_stale_partial(o.out))
    fmt::print(stderr, "[dump] removed {}.partial, left by an interrupted dump; dumping again from the start\n",
               o.out);
  CaptureWriter writer(o.out, meta);
  Progress progress("dump", static_cast<int64_t>(records.size() * layers.size()));
  CaptureTap tap;
  tap.writer = &writer;
  tap.wanted.assign(c.n_layers, false);
  for (int l : layers) tap.wanted[l] = true;
  tap.progress = &progress;
  tap.out = o.out;
  ExactAttention attn(c.n_layers);
  ForwardOptions fo;
  fo.tap = &tap;
  fo.logits = false;
  int64_t total_tokens = 0, n_truncated = 0, longest_truncated = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < records.size(); ++i) {
    const PromptRecord& r = records[i];
    const std::string tmpl = r.use_chat_template ? o.chat_template : "none";
    const std::string text = apply_model_chat_template(tmpl, src, tok, r.prompt);
    std::vector<int64_t> ids = tok.encode(text, /*add_bos=*/true);
    const int64_t n_prompt = static_cast<int64_t>(ids.size());
    if (o.max_tokens > 0 && static_cast<int64_t>(ids.size()) > o.max_tokens) ids = truncate_middle(ids, o.max_tokens);
    if (static_cast<int64_t>(ids.size()) > ctx) {
      KVLAB_CHECK(o.truncate, "sample {} ('{}'): the prompt has {} tokens{}, more than {}; pass --truncate to keep "
                  "its first and last {} tokens, or --max-tokens {} or less", i, r.id, n_prompt,
                  static_cast<int64_t>(ids.size()) != n_prompt ? fmt::format(" ({} after --max-tokens {})", ids.size(),
                                                                            o.max_tokens)
                                                              : "",
                  ctx_what, ctx / 2, ctx);
      ids = truncate_middle(ids, ctx);
    }
    KVLAB_CHECK(!ids.empty(), "sample {} ('{}'): the prompt has no tokens", i, r.id);
    const int64_t n_kept = static_cast<int64_t>(ids.size());  // the prompt as captured, before --generate
    if (o.generate > 0) {
      KVLAB_CHECK(static_cast<int64_t>(ids.size()) + o.generate <= ctx,
                  "sample {} ('{}'): {} prompt tokens + --generate {} exceed {}; give --max-tokens {} or less", i,
                  r.id, ids.size(), o.generate, ctx_what, ctx - o.generate);
      ExactAttention gen_attn(c.n_layers);
      GenerateOptions go;
      go.max_new_tokens = o.generate;
      go.stop_at_eos = false;  // every sample ends with exactly N generated tokens
      const std::vector<int64_t> gen = generate_greedy(model, ids, gen_attn, go);
      ids.insert(ids.end(), gen.begin(), gen.end());
    }
    KVLAB_CHECK(slide_limit == 0 || static_cast<int64_t>(ids.size()) <= slide_limit,
                "sample {} ('{}'): {} tokens, more than the {}-token sliding window of a layer in --layers {}; a "
                "capture records no window (replay would judge against full attention): give --max-tokens {} or "
                "less, or --layers with global layers only", i, r.id, ids.size(), slide_limit, o.layers, slide_limit);
    at::Tensor tokens = at::tensor(ids, at::kLong);  // [T]
    const int64_t T = tokens.numel();
    if (n_kept < n_prompt) {
      ++n_truncated;
      longest_truncated = std::max(longest_truncated, n_kept);
    }
    if (last_q > T)
      fmt::print(stderr, "[dump] warning: sample {} ('{}'): --queries {} asks for more positions than its {} tokens; "
                 "all {} are stored\n", i, r.id, o.queries, T, T);
    const int64_t n_q = last_q < 0 ? T : std::min(last_q, T);
    const std::string sid = r.id.empty() ? fmt::format("{}", i) : r.id;
    tap.sample = static_cast<int64_t>(i);
    tap.sample_id = sid;
    writer.begin_sample(sid, tokens, n_q);
    attn.reset();
    forward(model, tokens, 0, attn, fo);
    writer.end_sample();
    total_tokens += T;
  }
  writer.finish();
  progress.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The lengths as written: an odd --max-tokens N gives N-1 tokens, and the message says so.
  const std::string truncated =
      n_truncated ? fmt::format("{} truncated in the middle, the longest to {} tokens", n_truncated, longest_truncated)
                  : "none truncated";
  fmt::print(stderr, "[dump] wrote {}: {} samples, {} tokens ({}), {} layers, "
             "queries {}, {:.1f} s, peak RSS {:.1f} MiB\n", o.out, records.size(), total_tokens,
             truncated, layers.size(), o.queries, s, peak_rss_kib() / 1024.0);
}

}  // namespace

void setup_dump(CLI::App& app) {
  add_command<DumpOptions>(app, "dump",
                     "Capture post-RoPE q/k/v of a model's prefill into an HDF5 capture",
                     run_dump);
}

}  // namespace kvlab::cli
