// kvlab longbench --model M [--datasets multi_news,passage_retrieval_zh | all | e] [--data-dir D]
//                 [--samples N] [--max-length N] [--method a,b] (--ratio r | --budget N | --T t)
//                 [--param k=v] [--chat-template auto] [--out DIR | --results-dir D --name N]
// kvlab longbench eval DIR [--e] [--out DIR2]
// LongBench through compressed caches (tasks/longbench.h): one exact prefill per record shared by
// the full cache and every (method, budget) branch; pred/<branch>/<dataset>.jsonl in LongBench's
// own format (a rerun with the same --out resumes); the table of BalanceKV Table 1 / Chelsea
// Table 2 (branches as rows, datasets as columns, the average last) scored as eval.py scores, and
// fidelity to the full cache beside it. `eval` re-scores a folder of prediction files made
// anywhere: a kvlab run (its pred/<branch>/ folders) or one eval.py-style folder of <dataset>.jsonl.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <limits>

#include "command.h"
#include "commands.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/eval/datasets.h"
#include "kvlab/tasks/longbench.h"
#include "task_command.h"

namespace kvlab::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct LongBenchOptions {
  TaskCommonOptions common{"longbench"};
  std::string datasets = "multi_news,multifieldqa_zh,passage_retrieval_zh";
  std::string data_dir = shared_default("data/longbench");
  std::string prompts;
  std::string max_gen_file;
  int64_t samples = -1;
  int64_t max_length = 0;
  int64_t max_new_tokens = 0;
  void fields(FieldList& f) {
    f.add("datasets", datasets, "comma-separated LongBench datasets, all (the 21), or e (LongBench-E's 13, by length)");
    f.add("data_dir", data_dir, "folder of <dataset>.jsonl (LongBench-E: <dataset>_e.jsonl) and config/");
    f.add("prompts", prompts, "dataset2prompt.json (default <data-dir>/config/dataset2prompt.json)");
    f.add("max_gen_file", max_gen_file, "dataset2maxlen.json (default <data-dir>/config/dataset2maxlen.json)");
    f.add("samples", samples, "the first N records of each dataset (-1 = all)");
    f.add("max_length", max_length,
          "prompt tokens kept before the chat template, cut in the middle (0 = the model's context minus the "
          "dataset's new tokens and 64 for the template)");
    f.add("max_new_tokens", max_new_tokens, "tokens generated per record (0 = dataset2maxlen.json)");
    common.fields(f);
  }
  void check() const {
    KVLAB_CHECK(samples == -1 || samples >= 1, "--samples must be >= 1 (or -1 = all), got {}", samples);
    KVLAB_CHECK(max_length >= 0, "--max-length must be >= 0 (0 = from the model's context), got {}", max_length);
    KVLAB_CHECK(max_new_tokens >= 0, "--max-new-tokens must be >= 0 (0 = dataset2maxlen.json), got {}",
                max_new_tokens);
    parse_longbench_datasets(datasets);
    plan_task(common, /*need_files=*/false);
  }
};

void run_longbench(const LongBenchOptions& o, const json& effective) {
  const auto& c = o.common;
  const LongBenchSelection sel = parse_longbench_datasets(o.datasets);
  const TaskPlan plan = plan_task(c);
  const auto& branches = plan.branches;
  const std::string max_gen_file =
      o.max_gen_file.empty() ? o.data_dir + "/config/dataset2maxlen.json" : o.max_gen_file;
  // Every file and record is read before the model loads: bad input fails in a second.
  std::vector<Dataset> data;
  std::vector<int64_t> max_new;
  for (const auto& d : sel.datasets) {
    const std::string path = fmt::format("{}/{}{}.jsonl", o.data_dir, d, sel.e ? "_e" : "");
    KVLAB_CHECK(fs::is_regular_file(path), "--data-dir {}: no {}{}.jsonl for dataset {} (LongBench's data/ layout)",
                o.data_dir, d, sel.e ? "_e" : "", d);
    DatasetOptions dopt;
    dopt.max_samples = o.samples;
    dopt.longbench_prompts = o.prompts.empty() ? o.data_dir + "/config/dataset2prompt.json" : o.prompts;
    dopt.longbench_name = d;
    dopt.schema = DatasetSchema::LongBench;
    data.push_back(read_dataset(path, dopt));
    max_new.push_back(o.max_new_tokens > 0 ? o.max_new_tokens : longbench_max_new_tokens(max_gen_file, d));
  }
  auto tm = load_task_model(c);
  KVLAB_CHECK(tm->context <= 0 || o.max_length <= tm->context, "--max-length {} exceeds {}'s context of {} tokens",
              o.max_length, tm->model.id, tm->context);

  TaskRun tr = open_task_run(c, *tm, effective, plan);
  const RunDir& run = tr.run;
  json rows = json::array();
  for (size_t di = 0; di < data.size(); ++di) {
    const std::string& d = sel.datasets[di];
    // A model that does not state its context is not cut (its auto value would be negative).
    const int64_t max_length = o.max_length > 0   ? o.max_length
                               : tm->context > 0 ? std::max<int64_t>(1, tm->context - max_new[di] - 64)
                                                 : std::numeric_limits<int64_t>::max();
    std::vector<TaskRecord> records;
    for (const auto& rec : data[di].records) {
      TaskRecord r = longbench_task_record(rec, tm->src, tm->tok, c.chat_template, max_length, max_new[di]);
      // Decoding the two halves and encoding again can add tokens (characters cut at the edges);
      // with the automatic --max-length the cut shrinks until the record fits.
      for (int64_t cut = max_length, tries = 0; o.max_length == 0 && tm->context > 0 && tries < 16; ++tries) {
        const int64_t room = tm->context - r.max_new_tokens, got = int64_t(r.prompt.size());
        if (got <= room) break;
        // A cut byte-fallback character comes back as U+FFFD (3 byte tokens): shrink in proportion.
        cut = std::min(cut - 1, cut * room / got - 1);
        if (cut < 2) break;
        r = longbench_task_record(rec, tm->src, tm->tok, c.chat_template, cut, max_new[di]);
        r.gold["max_length"] = cut;
      }
      KVLAB_CHECK(fits_context(int64_t(r.prompt.size()), r.max_new_tokens, tm->context),
                  "--max-length {}: {} line {} has {} prompt tokens after the chat template; with {} new tokens "
                  "that exceeds {}'s context of {} (lower --max-length)",
                  max_length, data[di].path, rec.line, r.prompt.size(), r.max_new_tokens, tm->model.id, tm->context);
      records.push_back(std::move(r));
    }
    run_task_dataset(c, *tm, tr, longbench_task(d), records, plan, rows, false);
  }
  remove_other_datasets(c, tr);
  // The task table, scored by eval.py's rules from the prediction files.
  std::vector<std::pair<std::string, json>> scored;
  for (const auto& b : branches) scored.push_back({b.label, longbench_eval_folder(run.file("pred/" + b.label), sel.e)});
  const json table = longbench_score_table(scored, sel.datasets, sel.e);
  tr.write(rows, {{"complete", true}, {"longbench", table}, {"longbench_e", sel.e}});
  std::cout << task_table_header(c, plan) << "LongBench scores (eval.py's metrics, x100)\n"
            << render_table(table, longbench_table_columns(sel.datasets, sel.e)) << "\n"
            << "Fidelity to the full cache\n"
            << render_table(rows, {"branch", "dataset", "n", "score", "same_as_exact", "rougeL_vs_exact",
                                   "entries_start", "entries_peak", "mem", "seconds_per_record"});
  fmt::print(stderr, "[longbench] wrote {} and {}\n", run.file("result.json"), run.file("pred/"));
}

struct LongBenchEvalOptions {
  std::string dir;
  bool e = false;
  std::string out;
  bool overwrite = false;
  void fields(FieldList& f) {
    f.add("dir", dir, "a kvlab longbench run (its pred/<branch>/ folders) or a folder of <dataset>.jsonl")
        .positional()
        .required();
    f.add("e", e, "LongBench-E: score per length bucket (0-4k, 4-8k, 8k+) with eval.py's scorer_e");
    f.add("out", out, "where result.json goes (default <dir>/eval)");
    f.add("overwrite", overwrite, "replace an --out folder that holds another config's results");
  }
};

void run_longbench_eval(const LongBenchEvalOptions& o, const json& effective) {
  KVLAB_CHECK(fs::is_directory(o.dir), "longbench eval: '{}' is not a folder", o.dir);
  std::vector<std::pair<std::string, json>> scored;
  if (fs::is_directory(o.dir + "/pred")) {
    const std::vector<std::string> branches = task_branch_folders(o.dir + "/pred");
    KVLAB_CHECK(!branches.empty(), "longbench eval: '{}/pred' holds no branch folders", o.dir);
    for (const auto& b : branches)
      scored.push_back({fs::path(b).filename().string(), longbench_eval_folder(b, o.e)});
  } else {
    scored.push_back({fs::path(o.dir).lexically_normal().filename().string(), longbench_eval_folder(o.dir, o.e)});
    if (scored.back().first.empty()) scored.back().first = fs::absolute(o.dir).parent_path().filename().string();
  }
  std::vector<std::string> datasets;
  for (const auto& [label, scores] : scored)
    for (auto it = scores.begin(); it != scores.end(); ++it)
      if (std::find(datasets.begin(), datasets.end(), it.key()) == datasets.end()) datasets.push_back(it.key());
  const json table = longbench_score_table(scored, datasets, o.e);
  json per_folder = json::object();
  for (const auto& [label, scores] : scored) per_folder[label] = scores;
  RunDir run(o.out.empty() ? o.dir + "/eval" : o.out, "longbench-eval", effective, /*exact=*/true, o.overwrite);
  run.write_result(context_block("cpu", 0, effective), table, {{"scores", per_folder}, {"longbench_e", o.e}});
  std::cout << render_table(table, longbench_table_columns(datasets, o.e));
  fmt::print(stderr, "[longbench eval] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_longbench(CLI::App& app) {
  CLI::App* lb = add_command<LongBenchOptions>(
      app, "longbench",
      "LongBench through compressed caches: eval.py's scores per dataset and fidelity to the full cache",
      run_longbench);
  add_command<LongBenchEvalOptions>(*lb, "eval",
                                    "Score a folder of LongBench prediction files as LongBench's eval.py does",
                                    run_longbench_eval);
}

}  // namespace kvlab::cli
