// kvlab summarize --model M [--data xsum_0shot.jsonl] [--samples 50] [--method a,b]
//                 (--ratio r | --budget N | --T t) [--param k=v] [--chat-template auto]
//                 [--max-new-tokens 0] [--out DIR | --results-dir D --name N] [--overwrite]
// XSUM summarization (tasks/summarize.h; BUZZ Tables 1-2, CaM) through compressed caches: one
// exact prefill per article shared by the full cache and every (method, budget) branch; ROUGE-1/2/L
// F1 (rouge-score) against the reference summary and fidelity to the full cache per branch.
// Predictions in <out>/pred/<branch>/<dataset>.jsonl, the dataset named after the --data file
// (xsum_0shot.jsonl -> xsum; summarize_dataset_name); a rerun with the same --out resumes.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/eval/datasets.h"
#include "kvlab/tasks/summarize.h"
#include "task_command.h"

namespace kvlab::cli {
namespace {

struct SummarizeOptions {
  TaskCommonOptions common{"summarize"};
  std::string data = shared_default("data/summarization/xsum_0shot.jsonl");
  int64_t samples = 50;
  int64_t max_new_tokens = 0;
  bool stemmer = true;
  void fields(FieldList& f) {
    f.add("data", data, "XSUM records (jsonl: article, summary_gt, max_tokens, stop)");
    f.add("samples", samples, "the first N articles (-1 = all)");
    f.add("max_new_tokens", max_new_tokens, "tokens generated per article (0 = the record's max_tokens)");
    f.add("stemmer", stemmer, "rouge-score's Porter stemmer (use_stemmer)");
    common.fields(f);
  }
  void check() const {
    KVLAB_CHECK(samples == -1 || samples >= 1, "--samples must be >= 1 (or -1 = all), got {}", samples);
    KVLAB_CHECK(max_new_tokens >= 0, "--max-new-tokens must be >= 0 (0 = the record's max_tokens), got {}",
                max_new_tokens);
    plan_task(common, /*need_files=*/false);
  }
};

void run_summarize(const SummarizeOptions& o, const nlohmann::json& effective) {
  const auto& c = o.common;
  const TaskPlan plan = plan_task(c);
  KVLAB_CHECK(std::filesystem::is_regular_file(o.data), "--data {}: no such file (XSUM records, jsonl)", o.data);
  DatasetOptions dopt;
  dopt.max_samples = o.samples;
  dopt.schema = DatasetSchema::Xsum;
  const Dataset ds = read_dataset(o.data, dopt);
  const std::string dataset = summarize_dataset_name(o.data);  // was always "xsum" (issue 26)
  auto tm = load_task_model(c);
  std::vector<TaskRecord> records;
  for (const auto& rec : ds.records) {
    TaskRecord r = summarize_task_record(rec, tm->src, tm->tok, c.chat_template, o.max_new_tokens, dataset);
    KVLAB_CHECK(fits_context(int64_t(r.prompt.size()), r.max_new_tokens, tm->context),
                "--data {}: line {} has {} prompt tokens; with {} new tokens that exceeds {}'s context of {}", o.data,
                rec.line, r.prompt.size(), r.max_new_tokens, tm->model.id, tm->context);
    records.push_back(std::move(r));
  }
  TaskRun tr = open_task_run(c, *tm, effective, plan);
  const RunDir& run = tr.run;
  nlohmann::json rows = nlohmann::json::array();
  run_task_dataset(c, *tm, tr, summarize_task(o.stemmer, dataset), records, plan, rows, /*last=*/true);
  std::cout << task_table_header(c, plan) << "ROUGE F1 x100 against the reference summaries; fidelity to the full cache\n"
            << render_table(rows, {"branch", "n", "rouge1", "rouge2", "rougeL", "same_as_exact", "rougeL_vs_exact",
                                   "entries_start", "entries_peak", "mem", "seconds_per_record"});
  fmt::print(stderr, "[summarize] wrote {} and {}\n", run.file("result.json"), run.file("pred/"));
}

}  // namespace

void setup_summarize(CLI::App& app) {
  add_command<SummarizeOptions>(app, "summarize",
                                "XSUM summarization through compressed caches: ROUGE-1/2/L and fidelity to the "
                                "full cache",
                                run_summarize);
}

}  // namespace kvlab::cli
