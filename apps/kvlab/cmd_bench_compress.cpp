// kvlab bench compress: milliseconds per (layer, KV head) of each compressor on one capture, the
// growth exponent of that time in n, and the exponent each method's paper claims.
//
//   kvlab bench compress [--capture F.h5 --sample 0 --layer L] [--method all|a,b] [--tokens 4096]
//                        [--sizes 1024,2048,4096,8192,16384] [--max-tokens N] [--reps 3]
//                        [--ratio 0.2] [--T 2] [--queries 256] [--max-call-seconds 60]
//                        [--json] [--out F.json]
//
// Protocol (all on CPU, float32, one (sample, layer), all KV heads in one compress() call):
//   - region = the first n tokens of the capture (keys, values [n_kv_heads, n, head_dim]);
//   - queries = the last `--queries` captured queries of the sample; every one sits after the
//     largest region, so each n sees the same queries (sizes above the first query position are
//     dropped and the note says so). Without --capture: a synthetic clustered capture made in
//     memory (SyntheticSpec kind=clustered, head_dim 64, 9 query / 3 KV heads, 8 clusters,
//     seed --seed) of max(size) + `--queries` tokens whose last `--queries` positions are the
//     queries, so every size up to 16k is covered;
//   - budget = --ratio of the region per KV head, except for halving methods (the registry marks
//     them: balancekv, balancekv-mr, uniform-halving), which get T = --T halvings
//     (T = 2 keeps n/4; given the ratio-0.2 budget they would pick T = 3, n/8, instead);
//   - time = median of --reps wall-clock timings of compress() (one untimed warm-up call per
//     method at its first size), divided by n_kv_heads for "ms per (layer, head)";
//   - exponent = least-squares slope of log(time) vs log(n) over --sizes (fit_power_law);
//     sizes over --max-tokens or beyond the capture are dropped, and once one call of a method
//     takes longer than --max-call-seconds its larger sizes are skipped (both said in the note).
// Timings are figures, not assertions: they depend on the machine, --threads and other load.
//
// The claimed exponents (each method's registry entry, CompressorInfo::cost) are the time of compressing (or streaming) n tokens
// under each paper's own parameters held fixed; where kvlab's ratio → parameter mapping makes a
// parameter grow with n, the note says what the paper's bound then gives.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>

#include "command.h"
#include "commands.h"
#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/core/fit.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/io/capture.h"
#include "kvlab/io/synthetic.h"
#include "kvlab/replay/plan.h"
#include "kvlab/replay/replay.h"

namespace kvlab::cli {
namespace {

constexpr double kNotStated = std::numeric_limits<double>::quiet_NaN();

struct CompressBenchOptions {
  std::string capture;  // empty = synthetic
  int64_t sample = 0;
  int layer = -1;
  std::string method = "all";
  std::vector<std::string> param;
  int64_t tokens = 4096;
  std::vector<int64_t> sizes = {1024, 2048, 4096, 8192, 16384};
  int64_t max_tokens = 0;
  int reps = 3;
  double ratio = 0.2;
  int T = 2;
  int64_t queries = 256;
  double max_call_seconds = 60;
  int64_t seed = 0;
  bool json = false;
  std::string out;
  bool quiet = false;
  bool overwrite = false;
  void fields(FieldList& f) {
    f.add("capture", capture, "capture file (.h5); empty = a synthetic clustered capture in memory "
                              "(head_dim 64, 9 query / 3 KV heads)");
    f.add("sample", sample, "sample of the capture");
    f.add("layer", layer, "layer of the capture (-1 = the first captured layer)");
    f.add("method", method, "comma-separated method names, or 'all'");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("tokens", tokens, "n at which ms per (layer, head) is reported (the region = first n tokens)");
    f.add("sizes", sizes, "region sizes n for the growth exponent");
    f.add("max_tokens", max_tokens, "drop sizes (and --tokens) above this; 0 = no cap");
    f.add("reps", reps, "timed repetitions per size (median reported)");
    f.add("ratio", ratio, "fraction of the region kept (budget methods)");
    f.add("T", T, "halvings for halving methods (balancekv, balancekv-mr, uniform-halving)");
    f.add("queries", queries, "queries given to the methods: the last N captured (or synthetic) positions");
    f.add("max_call_seconds", max_call_seconds,
          "once one call of a method takes longer, its larger sizes are skipped; 0 = never");
    f.add("seed", seed, "compression seed (and the synthetic capture's seed)");
    f.add("json", json, "print JSON instead of the text table");
    f.add("out", out, "also write the JSON to this file");
    f.add("quiet", quiet, "no progress on stderr");
    f.add("overwrite", overwrite, "replace an existing --out file");
  }
};

// The tensors every method sees: keys/values of the longest region, and the fixed queries.
struct BenchInput {
  at::Tensor k, v;      // [n_kv_heads, n_avail, head_dim] float32
  at::Tensor q;         // [n_q_heads, n_obs, head_dim]
  at::Tensor query_pos; // [n_obs] int64, all >= n_avail
  at::Tensor inv_freq;  // [head_dim / 2] the RoPE frequencies (expected_attention, compactor read them)
  int64_t n_avail = 0;  // largest region the queries allow
  int layer = 0, n_layers = 1;
  nlohmann::json source;
};

BenchInput load_input(const CompressBenchOptions& o, int64_t n_needed) {
  BenchInput in;
  if (o.capture.empty()) {
    SyntheticSpec s;
    s.kind = "clustered";
    s.n_layers = 1;
    s.n_q_heads = 9;
    s.n_kv_heads = 3;
    s.head_dim = 64;
    s.n_tokens = n_needed + o.queries;
    s.n_q = o.queries;
    s.seed = static_cast<uint64_t>(o.seed);
    auto qkv = synthetic_layer(s, 0, 0);
    in.q = qkv.q;
    in.k = qkv.k.narrow(1, 0, n_needed).contiguous();
    in.v = qkv.v.narrow(1, 0, n_needed).contiguous();
    in.query_pos = at::arange(n_needed, n_needed + o.queries, at::kLong);
    in.n_avail = n_needed;
    in.inv_freq = rope_inv_freq(10000.0, s.head_dim, RopeScaling{});  // Llama's theta: timing only
    in.source = {{"synthetic", {{"kind", s.kind}, {"n_q_heads", s.n_q_heads}, {"n_kv_heads", s.n_kv_heads},
                                {"head_dim", s.head_dim}, {"n_clusters", s.n_clusters},
                                {"cluster_noise", s.cluster_noise}, {"n_tokens", s.n_tokens},
                                {"n_q", s.n_q}, {"seed", s.seed}}}};
    return in;
  }
  CaptureReader cap(o.capture);
  const auto& meta = cap.meta();
  KVLAB_CHECK(o.sample >= 0 && o.sample < cap.n_samples(), "--sample {} out of range: {} has {} samples",
              o.sample, o.capture, cap.n_samples());
  KVLAB_CHECK(!meta.layers.empty(), "{} has no captured layers", o.capture);
  in.layer = o.layer < 0 ? meta.layers.front() : o.layer;
  KVLAB_CHECK(std::find(meta.layers.begin(), meta.layers.end(), in.layer) != meta.layers.end(),
              "--layer {} was not captured in {} (captured: {})", in.layer, o.capture, fmt::join(meta.layers, ","));
  in.n_layers = meta.n_layers;
  const auto& si = cap.sample(o.sample);
  auto qkv = cap.read_layer(o.sample, in.layer);
  const int64_t n_obs = std::min<int64_t>(o.queries, si.n_q);
  KVLAB_CHECK(n_obs >= 1, "sample {} of {} has no captured queries", o.sample, o.capture);
  in.q = qkv.q.narrow(1, si.n_q - n_obs, n_obs).contiguous();  // [Hq, n_obs, d]
  const int64_t first_q = si.n_tokens - n_obs;
  in.query_pos = at::arange(first_q, si.n_tokens, at::kLong);
  in.n_avail = std::min(first_q, n_needed);
  in.k = qkv.k.narrow(1, 0, in.n_avail).contiguous();
  in.v = qkv.v.narrow(1, 0, in.n_avail).contiguous();
  in.inv_freq = capture_inv_freq(cap);
  in.source = {{"capture", {{"file", o.capture}, {"model_id", meta.model_id},
                            {"source_dataset", meta.source_dataset}, {"sample", o.sample},
                            {"sample_id", si.sample_id}, {"layer", in.layer}, {"n_tokens", si.n_tokens},
                            {"n_q", n_obs}, {"n_q_heads", meta.n_q_heads}, {"n_kv_heads", meta.n_kv_heads},
                            {"head_dim", meta.head_dim}}}};
  return in;
}

std::string fmt_exp(double e) { return std::isnan(e) ? "-" : fmt::format("{:.2f}", e); }

nlohmann::json num_or_null(double x) { return std::isnan(x) ? nlohmann::json() : nlohmann::json(x); }

void run_compress_bench(const CompressBenchOptions& o, const nlohmann::json& effective) {
  // Never over its own capture, a non-regular file, or an existing file without --overwrite.
  if (!o.out.empty()) check_output_file(o.out, "--out", {o.capture}, o.overwrite);
  KVLAB_CHECK(o.reps >= 1, "--reps must be >= 1, got {}", o.reps);
  const Budget by_ratio = Budget::of_ratio(o.ratio), by_halvings = Budget::of_halvings(o.T);
  KVLAB_CHECK(o.queries >= 1, "--queries must be >= 1, got {}", o.queries);
  KVLAB_CHECK(o.tokens >= 2, "--tokens must be >= 2, got {}", o.tokens);
  KVLAB_CHECK(o.max_tokens >= 0, "--max-tokens must be >= 0 (0 = no cap), got {}", o.max_tokens);
  KVLAB_CHECK(o.max_call_seconds >= 0, "--max-call-seconds must be >= 0, got {}", o.max_call_seconds);
  for (int64_t n : o.sizes) KVLAB_CHECK(n >= 2, "--sizes: every size must be >= 2, got {}", n);
  auto methods = without_question(without_model_weights(build_methods(o.method, o.param, nlohmann::json::object()),
                                                        o.method, "bench compress"),
                                  o.method, "bench compress");
  require_run_keeps(methods, "the bench's own flags");

  // Sizes to run: --sizes under the cap, plus --tokens (reported, fitted only if listed).
  const int64_t cap = o.max_tokens > 0 ? o.max_tokens : std::numeric_limits<int64_t>::max();
  std::vector<int64_t> fit_sizes;
  for (int64_t n : o.sizes)
    if (n <= cap) fit_sizes.push_back(n);
  std::sort(fit_sizes.begin(), fit_sizes.end());
  fit_sizes.erase(std::unique(fit_sizes.begin(), fit_sizes.end()), fit_sizes.end());
  KVLAB_CHECK(o.tokens <= cap, "--tokens {} is above --max-tokens {}", o.tokens, o.max_tokens);
  const int64_t n_needed = std::max(o.tokens, fit_sizes.empty() ? o.tokens : fit_sizes.back());
  BenchInput in = load_input(o, n_needed);
  KVLAB_CHECK(o.tokens <= in.n_avail,
              "--tokens {}: the capture has only {} tokens before its last {} queries (lower --tokens "
              "or --queries)", o.tokens, in.n_avail, in.q.size(1));
  std::vector<std::string> notes_all;
  {
    std::vector<int64_t> dropped;
    for (int64_t n : fit_sizes)
      if (n > in.n_avail) dropped.push_back(n);
    if (!dropped.empty())
      notes_all.push_back(fmt::format("capture too short for n={} ({} tokens before the queries)",
                                      fmt::join(dropped, ","), in.n_avail));
    fit_sizes.erase(std::remove_if(fit_sizes.begin(), fit_sizes.end(), [&](int64_t n) { return n > in.n_avail; }),
                    fit_sizes.end());
    if (o.max_tokens > 0)
      for (int64_t n : o.sizes)
        if (n > cap) { notes_all.push_back(fmt::format("sizes capped at --max-tokens {}", o.max_tokens)); break; }
  }
  std::vector<int64_t> run_sizes = fit_sizes;
  if (std::find(run_sizes.begin(), run_sizes.end(), o.tokens) == run_sizes.end()) run_sizes.push_back(o.tokens);
  std::sort(run_sizes.begin(), run_sizes.end());
  const int64_t h_kv = in.k.size(0);
  if (!o.quiet)
    fmt::print(stderr, "[bench compress] {} methods, sizes {}, reps {}, threads {}, {}\n", methods.size(),
               fmt::join(run_sizes, ","), o.reps, at::get_num_threads(),
               o.capture.empty() ? "synthetic clustered capture" : o.capture);

  nlohmann::json rows = nlohmann::json::array();
  for (const auto& m : methods) {
    const CompressorInfo& info = compressor_info(m.name);
    const bool halving = info.halving;
    std::vector<std::string> notes = notes_all;
    nlohmann::json per_size = nlohmann::json::array();
    std::vector<double> xs, ys;
    double ms_at_tokens = kNotStated;
    bool warmed = false, skipping = false;
    for (int64_t n : run_sizes) {
      if (skipping) continue;
      LayerKV kv;
      kv.keys = in.k.narrow(1, 0, n);    // [Hkv, n, d]
      kv.values = in.v.narrow(1, 0, n);  // [Hkv, n, d]
      kv.queries = in.q;                 // [Hq, n_obs, d]
      kv.query_pos = in.query_pos;       // [n_obs]
      kv.pos0 = 0;
      kv.layer = in.layer;
      kv.n_layers = in.n_layers;
      kv.context.provide(inputs::rope_inv_freq, in.inv_freq);
      CompressOptions opt;
      opt.seed = static_cast<uint64_t>(o.seed);
      opt.budget = halving ? by_halvings : by_ratio;
      double entries = 0;
      auto once = [&] {
        auto t0 = std::chrono::steady_clock::now();
        CompressedKV c = m.compressor->compress(kv, opt);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        entries = c.mean_memory_entries();
        return s;
      };
      if (!warmed) {
        double s = once();
        warmed = true;
        if (o.max_call_seconds > 0 && s > o.max_call_seconds) {
          // Too slow to repeat: record the warm-up as the only timing and stop growing n.
          skipping = true;
          notes.push_back(fmt::format("n>{} skipped (one call {:.0f} s > --max-call-seconds)", n, s));
          std::vector<double> ms = {s * 1e3};
          per_size.push_back({{"n_tokens", n}, {"ms", ms}, {"median_ms", ms[0]}, {"entries", entries},
                              {"warmup_only", true}});
          if (std::find(fit_sizes.begin(), fit_sizes.end(), n) != fit_sizes.end()) xs.push_back(double(n)), ys.push_back(ms[0]);
          if (n == o.tokens) ms_at_tokens = ms[0] / double(h_kv);
          continue;
        }
      }
      std::vector<double> ms;
      for (int r = 0; r < o.reps; ++r) {
        double s = once();
        ms.push_back(s * 1e3);
        if (!o.quiet)
          fmt::print(stderr, "[bench compress] {} n={} rep {}/{}: {:.2f} ms\n", m.name, n, r + 1, o.reps, s * 1e3);
        if (o.max_call_seconds > 0 && s > o.max_call_seconds) skipping = true;
      }
      const double med = median(ms);
      if (skipping && n != run_sizes.back())
        notes.push_back(fmt::format("n>{} skipped (a call took > {} s)", n, o.max_call_seconds));
      per_size.push_back({{"n_tokens", n}, {"ms", ms}, {"median_ms", med}, {"entries", entries}});
      if (std::find(fit_sizes.begin(), fit_sizes.end(), n) != fit_sizes.end()) xs.push_back(double(n)), ys.push_back(med);
      if (n == o.tokens) ms_at_tokens = med / double(h_kv);
    }
    double exponent = kNotStated, r2 = kNotStated;
    if (xs.size() >= 2) {
      auto f = fit_power_law(xs, ys);
      exponent = f.exponent;
      r2 = f.r2;
    } else {
      notes.push_back("fewer than 2 sizes: no exponent");
    }
    const double claimed = info.cost.exponent;
    std::string note = info.cost.note;
    for (const auto& s : notes) note += "; " + s;
    nlohmann::json setting = halving ? nlohmann::json{{"T", o.T}} : nlohmann::json{{"ratio", o.ratio}};
    rows.push_back({{"method", m.label()},
                    {"params", m.compressor->params()},
                    {"setting", setting},
                    {"n_tokens", o.tokens},
                    {"n_kv_heads", h_kv},
                    {"ms_per_layer_head", num_or_null(ms_at_tokens)},
                    {"exponent", num_or_null(exponent)},
                    {"exponent_r2", num_or_null(r2)},
                    {"fit_sizes", xs},
                    {"exponent_claimed", num_or_null(claimed)},
                    {"claim_source", info.cost.source},
                    {"note", note},
                    {"sizes", per_size}});
  }

  nlohmann::json result = {{"context", context_block("cpu", static_cast<uint64_t>(o.seed), effective)},
                           {"input", in.source},
                           {"rows", rows}};
  if (!o.out.empty()) {
    write_json_atomic(o.out, result);
    if (!o.quiet) fmt::print(stderr, "[bench compress] wrote {}\n", o.out);
  }
  if (o.json) {
    std::cout << result.dump(2) << "\n";
    return;
  }
  // Aligned text table, from the rows.
  const std::string ms_head = fmt::format("ms/(layer,head) n={}", o.tokens);
  std::vector<std::vector<std::string>> cells = {{"method", ms_head, "exp measured", "exp claimed", "note"}};
  for (const auto& r : rows) {
    auto num = [](const nlohmann::json& j, const char* f) {
      return j.is_null() ? std::string("-") : fmt::format(fmt::runtime(f), j.get<double>());
    };
    cells.push_back({r["method"].get<std::string>(), num(r["ms_per_layer_head"], "{:.3f}"),
                     num(r["exponent"], "{:.2f}"),
                     r["exponent_claimed"].is_null() ? "-" : fmt_exp(r["exponent_claimed"].get<double>()),
                     r["note"].get<std::string>()});
  }
  std::vector<size_t> w(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i + 1 < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i == 0) line += fmt::format("{:<{}}", row[i], w[i]);
      else if (i + 1 < row.size()) line += fmt::format("  {:>{}}", row[i], w[i]);
      else line += "  " + row[i];
    }
    fmt::print("{}\n", line);
  }
  fmt::print("(CPU, {} threads; {}; budget methods at ratio {}, halving methods at T={}; exponent = "
             "slope of log median time vs log n over n={})\n",
             at::get_num_threads(),
             o.capture.empty() ? "synthetic clustered capture, head_dim 64, 9 q / 3 KV heads"
                               : fmt::format("{} sample {} layer {}", o.capture, o.sample, in.layer),
             o.ratio, o.T, fmt::join(fit_sizes, ","));
}

}  // namespace

void setup_bench_compress(CLI::App& app) {
  add_command<CompressBenchOptions>(bench_group(app), "compress",
                     "Compression time per (layer, head) and its growth exponent in n, "
                                 "beside each paper's claimed exponent",
                     run_compress_bench);
}

}  // namespace kvlab::cli
