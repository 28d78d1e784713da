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
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/longeval.h"
#include "task_command.h"
#include "kvlab/tasks/prompt_split.h"

namespace kvlab::cli {
namespace {

struct LongEvalOptions {
  TaskCommonOptions common{"longeval"};
  std::vector<int64_t> lines;  // none: 200, unless --data names the file
  std::string data_dir = shared_default("data/longeval/lines");
  std::string data;
  int64_t samples = 50;
  int64_t max_new_tokens = 100;
  void fields(FieldList& f) {
    f.add("lines", lines, "LongChat files <data-dir>/<L>_lines.jsonl, e.g. 200,300 (default 200 unless --data)");
    f.add("data_dir", data_dir, "folder of the LongChat testcase files");
    f.add("data", data, "one testcase file instead of --lines");
    f.add("samples", samples, "the first N cases of each file (-1 = all)");
    f.add("max_new_tokens", max_new_tokens, "tokens generated per case");
    common.fields(f);
  }
  void check() const {
    KVLAB_CHECK(max_new_tokens >= 1, "--max-new-tokens must be >= 1, got {}", max_new_tokens);
    KVLAB_CHECK(samples == -1 || samples >= 1, "--samples must be >= 1 (or -1 = all), got {}", samples);
    // issue 50: --data with --lines ran --data alone.
    KVLAB_CHECK(data.empty() || lines.empty(), "--data and --lines both name the testcases: give one (--data {} or "
                "--lines {})", data, fmt::join(lines, ","));
    plan_task(common, /*need_files=*/false);
  }
};

void run_longeval(const LongEvalOptions& o, const nlohmann::json& effective) {
  const TaskPlan plan = plan_task(o.common);
  std::vector<std::pair<std::string, std::string>> files;  // (dataset, path)
  if (!o.data.empty()) {
    files.push_back({std::filesystem::path(o.data).stem().string(), o.data});
  } else {
    for (int64_t l : o.lines.empty() ? std::vector<int64_t>{200} : o.lines)
      files.push_back({fmt::format("{}_lines", l), fmt::format("{}/{}_lines.jsonl", o.data_dir, l)});
  }
  std::vector<std::vector<LongEvalCase>> cases;
  for (const auto& [ds, path] : files) cases.push_back(read_longeval_cases(path, o.samples));

  auto tm = load_task_model(o.common);
  const auto& c = o.common;
  TaskRun tr = open_task_run(c, *tm, effective, plan);
  const RunDir& run = tr.run;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t fi = 0; fi < files.size(); ++fi) {
    std::vector<TaskRecord> records;
    for (const auto& lc : cases[fi]) {
      TaskRecord r;
      r.id = lc.id;
      const std::string text = apply_model_chat_template(c.chat_template, tm->src, tm->tok, lc.prompt);
      SplitPrompt sp = encode_split(tm->tok, text, offset_in(text, lc.prompt, last_paragraph(lc.prompt)));
      r.prompt = std::move(sp.ids);
      r.context_len = sp.context_len;
      KVLAB_CHECK(fits_context(int64_t(r.prompt.size()), o.max_new_tokens, tm->context),
                  "{}: case {} has {} prompt tokens; with --max-new-tokens {} that exceeds {}'s context of {}",
                  files[fi].second, lc.id, r.prompt.size(), o.max_new_tokens, tm->model.id, tm->context);
      r.max_new_tokens = o.max_new_tokens;
      r.gold = lc.gold;
      records.push_back(std::move(r));
    }
    run_task_dataset(c, *tm, tr, TaskSpec{files[fi].first, longeval_score}, records, plan, rows,
                     fi + 1 == files.size());
  }
  std::cout << task_table_header(c, plan) << render_table(rows, {"branch", "dataset", "n", "score", "same_as_exact", "rougeL_vs_exact",
                                   "entries_start", "entries_peak", "mem", "seconds_per_record"});
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
