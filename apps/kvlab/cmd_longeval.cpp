// kvlab longeval --model M [--lines 200,300 | --data F.jsonl] [--samples 50] [--method a,b]
//                (--ratio r | --budget N | --T t) [--param k=v] [--chat-template auto]
//                [--max-new-tokens 100] [--out DIR | --results-dir D --name N] [--overwrite]
// LongEval line retrieval (SubGen Table 1) through compressed caches: one exact prefill per case
// shared by the full cache and every (method, budget) branch; accuracy (the last integer of the
// output equals the line's number) and fidelity to the full cache per branch and file
// (tasks/task_runner.h). Predictions in <out>/pred/<branch>/<L>_lines.jsonl; a rerun with the
// same --out resumes.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/longeval.h"

namespace kvlab::cli {
namespace {

struct LongEvalOptions {
  std::string model = "smollm2-135m";
  std::vector<int64_t> lines = {200};
  std::string data_dir = "../shared/data/longeval/lines";
  std::string data;
  int64_t samples = 50;
  std::string method = "exact";
  std::vector<double> ratio;
  std::vector<int64_t> budget;
  std::vector<int64_t> T;
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  std::string chat_template = "auto";
  int64_t max_new_tokens = 100;
  int64_t obs_queries = 256;
  int64_t seed = 42;
  std::string dtype = "fp32";
  std::string device = "cpu";
  std::string out;
  std::string name = "longeval";
  std::string results_dir = "results";
  bool overwrite = false;
  bool quiet = false;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)");
    f.add("lines", lines, "LongChat files <data-dir>/<L>_lines.jsonl, e.g. 200,300");
    f.add("data_dir", data_dir, "folder of the LongChat testcase files");
    f.add("data", data, "one testcase file instead of --lines");
    f.add("samples", samples, "the first N cases of each file (-1 = all)");
    f.add("method", method, "comma-separated methods; exact (the fidelity reference) is added first if missing");
    f.add("ratio", ratio, "fractions of the prompt kept, e.g. 0.2 (or --budget / --T)");
    f.add("budget", budget, "entries kept per KV head");
    f.add("T", T, "halvings for halving methods");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("params", params, "config only: {\"method\": {\"key\": value}}");
    f.add("chat_template", chat_template, "none | auto | a template name");
    f.add("max_new_tokens", max_new_tokens, "tokens generated per case");
    f.add("obs_queries", obs_queries, "the last N prompt queries per layer that methods may score keys with");
    f.add("seed", seed, "seed of random methods");
    f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16");
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("out", out, "run directory (default: <results-dir>/<name>/<UTC stamp>_<sha7>); the same --out resumes");
    f.add("name", name, "experiment name (the results subfolder)");
    f.add("results_dir", results_dir, "base directory of results");
    f.add("overwrite", overwrite, "replace an --out folder that holds the results of another config");
    f.add("quiet", quiet, "no progress output");
  }
};

void run_longeval(const LongEvalOptions& o, const nlohmann::json& effective) {
  KVLAB_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be >= 1, got {}", o.max_new_tokens);
  KVLAB_CHECK(o.samples == -1 || o.samples >= 1, "--samples must be >= 1 (or -1 = all), got {}", o.samples);
  KVLAB_CHECK(o.seed >= 0, "--seed must be >= 0, got {}", o.seed);
  std::string names = o.method;
  if (("," + names + ",").find(",exact,") == std::string::npos) names = "exact," + names;
  auto methods = build_methods(names, o.param, o.params);
  const bool any_compressed = methods.size() > 1;
  std::vector<Budget> budgets;
  if (any_compressed) budgets = budget_settings(o.ratio, o.budget, o.T);
  std::vector<TaskBranch> branches;
  for (const auto& m : methods) {
    if (m.name == "exact") {
      branches.insert(branches.begin(), {"exact", m, Budget::of_ratio(1.0)});
      continue;
    }
    for (const auto& b : budgets) branches.push_back({task_branch_label(m, b), m, b});
  }
  std::vector<std::pair<std::string, std::string>> files;  // (dataset, path)
  if (!o.data.empty()) {
    files.push_back({std::filesystem::path(o.data).stem().string(), o.data});
  } else {
    KVLAB_CHECK(!o.lines.empty(), "give --lines (e.g. 200,300) or --data FILE");
    for (int64_t l : o.lines) files.push_back({fmt::format("{}_lines", l), fmt::format("{}/{}_lines.jsonl", o.data_dir, l)});
  }
  std::vector<std::vector<LongEvalCase>> cases;
  for (const auto& [ds, path] : files) cases.push_back(read_longeval_cases(path, o.samples));

  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  Model model = src.kind == ModelSource::Kind::gguf ? load_model_gguf(src, lo) : load_model_hf(src, lo);
  Tokenizer tok = load_model_tokenizer(src);
  const int64_t context = model.config.max_position_embeddings;

  RunDir run(o.out.empty() ? o.results_dir : o.out, o.name, effective, !o.out.empty(), o.overwrite);
  auto ctx = context_block(o.device, static_cast<uint64_t>(o.seed), effective);
  ctx["model_id"] = model.id;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t fi = 0; fi < files.size(); ++fi) {
    std::vector<TaskRecord> records;
    for (const auto& c : cases[fi]) {
      TaskRecord r;
      r.id = c.id;
      r.prompt = tok.encode(apply_model_chat_template(o.chat_template, src, tok, c.prompt), /*add_bos=*/true);
      KVLAB_CHECK(context <= 0 || int64_t(r.prompt.size()) + o.max_new_tokens <= context,
                  "{}: case {} has {} prompt tokens; with --max-new-tokens {} that exceeds {}'s context of {}",
                  files[fi].second, c.id, r.prompt.size(), o.max_new_tokens, model.id, context);
      r.max_new_tokens = o.max_new_tokens;
      r.gold = c.gold;
      records.push_back(std::move(r));
    }
    TaskSpec task{files[fi].first, longeval_score};
    TaskOptions to;
    to.pred_dir = run.file("pred");
    to.seed = static_cast<uint64_t>(o.seed);
    to.obs_queries = o.obs_queries;
    Progress progress("longeval " + files[fi].first, int64_t(records.size()), !o.quiet);
    to.progress = [&](int64_t, int64_t, const std::string& note) { progress.advance(1, "case " + note); };
    for (auto& row : run_task(model, tok, task, records, branches, to)) rows.push_back(row);
    progress.finish();
    run.write_result(ctx, rows, {{"complete", fi + 1 == files.size()}});
  }
  std::cout << render_table(rows, {"branch", "dataset", "n", "score", "same_as_exact", "rougeL_vs_exact",
                                   "seconds_per_record"});
  fmt::print(stderr, "[longeval] wrote {} and {}\n", run.file("result.json"), run.file("pred/"));
}

}  // namespace

void setup_longeval(CLI::App& app) {
  add_command<LongEvalOptions>(app, "longeval",
                               "LongEval line retrieval through compressed caches: accuracy and fidelity to the "
                               "full cache",
                               run_longeval);
}

}  // namespace kvlab::cli
