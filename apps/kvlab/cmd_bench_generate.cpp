// kvlab bench generate --model M [--context 2048,4096,8192] [--method exact,h2o,snapkv,...] [--ratio 0.2]
//                      [--new-tokens 64] [--text FILE] [--obs-queries N] [--out DIR | --name N]
// Chelsea Table 3's columns for each method beside the full cache, measured in the same run: time
// to first token (the shared prefill + the method's compression), time per output token (median
// over --new-tokens greedy steps), the KV cache's bytes after prefill and at its peak, and the
// process's resident memory. One exact prefill per context is shared by every method
// (generate/branches.h); `prefills` in the output counts them. The prompt is the first `context`
// tokens of --text. `exact` (the full cache through the same decode path) is always run first and
// every ratio column is against it.
//
// --branches 1,4,10,20 (issue 25) adds, per context, decode throughput in branch-tokens per second
// of B branches (the non-exact methods in turn, at the first ratio) decoded one after another
// (run_branch) and in one batch (run_branches), measured in the same run on the same prefill, with
// their ratio and whether the ids agree: the `batch` table of result.json.
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/blas.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/memory.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/generate/branches.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct GenerateBenchOptions : RunFolderOptions {
  GenerateBenchOptions() : RunFolderOptions("bench_generate") {}
  std::string model = "smollm2-135m";
  std::vector<int64_t> context = {2048, 4096, 8192};
  std::string method = "exact,h2o,snapkv,streaming_llm,chelsea";
  std::vector<double> ratio = {0.2};
  std::vector<double> bytes;  // --bytes: instead of --ratio
  std::vector<int64_t> branches;  // --branches: batched vs sequential decoding at these branch counts
  int64_t new_tokens = 64;
  std::string text = shared_default("data/wikitext2/wiki.test.raw");
  int64_t obs_queries = 256;
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  std::string dtype = "fp32";
  std::string weights = "fp32";
  std::string device = "cpu";
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)");
    f.add("context", context, "prompt lengths in tokens, e.g. 2048,4096,8192");
    f.add("method", method, "comma-separated methods; exact is added first if missing");
    f.add("ratio", ratio, "fraction of the prompt each method keeps, e.g. 0.2");
    f.add("bytes", bytes, "instead of --ratio: the fraction of the full-precision K and V bytes each branch may hold, "
          "e.g. 0.125 (a quantized branch, snapkv+kivi4, keeps as many more entries as its bits allow)");
    f.add("branches", branches, "also measure decode throughput of this many branches batched vs one after another, "
          "e.g. 1,4,10,20");
    f.add("new_tokens", new_tokens, "greedy tokens decoded per method (TPOT = the median step; >= 2)");
    f.add("text", text, "the prompt text (its first `context` tokens)");
    f.add("obs_queries", obs_queries, "the last N prompt queries per layer that methods may score keys with");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("params", params, "config only: {\"method\": {\"key\": value}}");
    f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16");
    f.add("weights", weights, "a GGUF's matrices: stored = used as the file stores them (CPU, fp32; issue 51), fp32 = dequantized at load").one_of({"fp32", "stored"});
    f.add("device", device, "cpu | cuda | cuda:N");
    run_folder_fields(f);
  }
  std::vector<Budget> settings() const { return bytes.empty() ? budget_settings(ratio, {}, {}) : budget_settings({}, {}, {}, bytes); }
  void check() const {
    KVLAB_CHECK(new_tokens >= 2, "--new-tokens must be >= 2, got {}", new_tokens);
    KVLAB_CHECK(!context.empty(), "--context: give at least one length");
    for (int64_t c : context) KVLAB_CHECK(c >= 2, "--context {}: must be >= 2", c);
    for (int64_t b : branches) KVLAB_CHECK(b >= 1 && b <= 256, "--branches {}: must be in [1, 256]", b);
    std::string names = method;
    if (("," + names + ",").find(",exact,") == std::string::npos) names = "exact," + names;
    require_run_keeps(build_methods(names, param, params, "default", "", /*need_files=*/false), "the bench's own flags");
    settings();
    parse_compute_dtype(dtype, "--dtype");
    parse_device(device, "--device");
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Decode throughput of `nb` branches (the non-exact methods in turn at `budget`; exact if there is
// none) one after another and in one batch, on the same prefill: branch-tokens decoded per second
// of decode time (compression excluded; the first token of each branch comes from the prefill).
nlohmann::json batch_vs_sequential(const Model& model, const Prefill& pre, const std::vector<MethodSpec>& methods,
                                   const Budget& budget, int64_t nb, int64_t new_tokens, int64_t context) {
  std::vector<const MethodSpec*> pool;
  for (const auto& m : methods)
    if (m.name != "exact") pool.push_back(&m);
  if (pool.empty()) pool.push_back(&methods.front());
  std::vector<BranchSpec> specs;
  std::vector<BranchOptions> opts(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    const MethodSpec& m = *pool[static_cast<size_t>(i) % pool.size()];
    specs.push_back({m, m.name == "exact" ? Budget::of_ratio(1.0) : budget, 0, 0, 0});
    opts[static_cast<size_t>(i)].max_new_tokens = new_tokens;
    opts[static_cast<size_t>(i)].stop_at_eos = false;
  }
  double seq_s = 0, bat_s = 0;
  std::vector<std::vector<int64_t>> seq_ids;
  for (size_t i = 0; i < specs.size(); ++i) {
    BranchResult r = run_branch(model, pre, specs[i], opts[i]);
    seq_s += r.decode_seconds;
    seq_ids.push_back(r.ids);
  }
  bool same = true;
  const std::vector<BranchResult> batched = run_branches(model, pre, specs, opts);
  for (size_t i = 0; i < batched.size(); ++i) {
    bat_s += batched[i].decode_seconds;
    same = same && batched[i].ids == seq_ids[i];
  }
  const double tokens = double(nb * (new_tokens - 1));
  nlohmann::json row = {{"context", context},
                        {"branches", nb},
                        {"new_tokens", new_tokens},
                        {"sequential_tok_s", tokens / std::max(seq_s, 1e-9)},
                        {"batched_tok_s", tokens / std::max(bat_s, 1e-9)},
                        {"batched_vs_sequential", seq_s / std::max(bat_s, 1e-9)},
                        {"same_ids", same}};
  fmt::print(stderr, "[bench generate] context {}, {} branches: {:.1f} branch-tokens/s one after another, {:.1f} "
             "batched ({:.2f}x); ids {}\n", context, nb, row["sequential_tok_s"].get<double>(),
             row["batched_tok_s"].get<double>(), row["batched_vs_sequential"].get<double>(),
             same ? "identical" : "DIFFER");
  return row;
}

void run_generate_bench(const GenerateBenchOptions& o, const nlohmann::json& effective) {
  std::string names = o.method;
  if (("," + names + ",").find(",exact,") == std::string::npos) names = "exact," + names;
  auto methods = build_methods(names, o.param, o.params);
  check_quantized_methods(methods, true, "a prefill-only method (bench generate streams every streaming method)");
  for (const auto& m : methods)
    KVLAB_CHECK(!m.own_memory(), "--method {}: bench generate times branches at a budget, and {} keeps what its own "
                "threshold decides; time it with kvlab generate", m.label(), m.name);
  auto budgets = o.settings();
  KVLAB_CHECK(std::filesystem::is_regular_file(o.text), "--text {}: not a readable file", o.text);
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.stored_weights = parse_weights_flag(o.weights, "--weights");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  Model model = load_model(src, lo);
  std::ifstream f(o.text, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const Tokenizer tok = load_model_tokenizer(src);
  const std::vector<int64_t> ids = tok.encode(ss.str(), /*add_bos=*/true);
  const ReconstructionPrompt plain = reconstruction_prompt(tok, "none");  // kvzip's repeat prompt (raw text)
  const int64_t limit = model.config.max_position_embeddings;

  for (int64_t c : o.context) {
    KVLAB_CHECK(fits_context(c, o.new_tokens, limit), "--context {} + --new-tokens {} exceed {}'s context of {} "
                "positions", c, o.new_tokens, model.id, limit > 0 ? limit : kMaxTokens);
    KVLAB_CHECK(c <= int64_t(ids.size()), "--context {}: --text {} has only {} tokens", c, o.text, ids.size());
  }
  // Once the flags are known to be good, so that a bad one still gives a single error line.
  if (const std::string w = blas_core_warning(); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  RunDir run = o.open_run(effective);
  c10::InferenceMode guard;
  nlohmann::json rows = nlohmann::json::array(), batch_rows = nlohmann::json::array();
  int prefills = 0;
  for (int64_t c : o.context) {
    std::vector<int64_t> prompt(ids.begin(), ids.begin() + c);
    Prefill pre = run_prefill(model, prompt, o.obs_queries);
    pre.reconstruction = plain;
    ++prefills;
    fmt::print(stderr, "[bench generate] context {}: prefill {:.2f} s ({:.0f} tokens/s)\n", c, pre.seconds,
               c / std::max(pre.seconds, 1e-9));
    double exact_tpot = 0, exact_bytes = 0;
    for (const auto& m : methods)
      for (const auto& b : budgets) {
        BranchOptions bo;
        bo.max_new_tokens = o.new_tokens;
        bo.stop_at_eos = false;
        std::vector<double> steps;  // seconds of each decode step (the first token is the prefill's)
        auto last = std::chrono::steady_clock::now();
        bo.on_token = [&](int64_t) {
          auto now = std::chrono::steady_clock::now();
          steps.push_back(std::chrono::duration<double>(now - last).count());
          last = now;
        };
        BranchSpec spec{m, m.name == "exact" ? Budget::of_ratio(1.0) : b, 0, 0, 0};
        last = std::chrono::steady_clock::now();
        BranchResult r = run_branch(model, pre, spec, bo);
        steps.erase(steps.begin());  // compression + argmax of the prefill's logits
        const double tpot = median(steps);
        if (m.full_cache()) exact_tpot = tpot, exact_bytes = double(r.kv_bytes_peak);
        nlohmann::json row = {{"context", c},
                              {"method", m.label()},
                              {"setting", m.name == "exact" ? "full" : b.label()},
                              {"ttft_s", pre.seconds + r.reconstruction_seconds + r.compress_ms / 1000.0},
                              {"prefill_s", pre.seconds},
                              {"reconstruction_s", r.reconstruction_seconds},
                              {"compress_ms", r.compress_ms},
                              {"tpot_ms", tpot * 1000.0},
                              {"tpot_vs_exact", exact_tpot > 0 ? tpot / exact_tpot : 1.0},
                              {"kv_bytes", r.kv_bytes},
                              {"kv_bytes_peak", r.kv_bytes_peak},
                              {"kv_vs_exact", exact_bytes > 0 ? r.kv_bytes_peak / exact_bytes : 1.0},
                              {"decoded", steps.size()},
                              {"streaming", compressor_info(m.name).streaming},
                              {"rss_mib", current_rss_kib() / 1024.0},
                              {"params", m.compressor->params()}};
        fmt::print(stderr, "[bench generate] context {} {} {}: TPOT {:.1f} ms ({:.2f} of exact), KV {:.1f} MiB "
                   "({:.3f} of exact), compress {:.0f} ms\n", c, m.label(), row["setting"].get<std::string>(),
                   tpot * 1000, row["tpot_vs_exact"].get<double>(), r.kv_bytes_peak / 1048576.0,
                   row["kv_vs_exact"].get<double>(), r.compress_ms);
        rows.push_back(row);
        if (m.name == "exact") break;  // one row per context for a cache without eviction
      }
    for (int64_t nb : o.branches) batch_rows.push_back(batch_vs_sequential(model, pre, methods, budgets[0], nb, o.new_tokens, c));
  }
  auto ctx = context_block(o.device, 0, effective);
  ctx["model_id"] = model.id;
  run.write_result(ctx, rows, {{"prefills", prefills}, {"peak_rss_mib", peak_rss_kib() / 1024.0}, {"complete", true},
                               {"batch", batch_rows}});
  std::cout << render_table(rows, {"context", "method", "setting", "ttft_s", "compress_ms", "tpot_ms", "tpot_vs_exact",
                                   "kv_vs_exact", "rss_mib"});
  if (!batch_rows.empty())
    std::cout << "\n" << render_table(batch_rows, {"context", "branches", "sequential_tok_s", "batched_tok_s",
                                                   "batched_vs_sequential", "same_ids"});
  fmt::print("prefills: {} (one per context, shared by {} methods); peak RSS {:.0f} MiB\n", prefills, methods.size(),
             peak_rss_kib() / 1024.0);
  fmt::print(stderr, "[bench generate] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_bench_generate(CLI::App& app) {
  add_command<GenerateBenchOptions>(bench_group(app), "generate",
                                    "TTFT, TPOT, KV bytes and RSS of each method beside the full cache, one prefill "
                                    "per context",
                                    run_generate_bench);
}

}  // namespace kvlab::cli
