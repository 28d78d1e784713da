// LongBench (BalanceKV Table 1, Chelsea Table 2; docs/methods.md §5) through compressed caches, as
// THUDM/LongBench pred.py and eval.py (commit 2e00731f) run it:
//   prompt   dataset2prompt[dataset].format(**record); tokenized without BOS; longer than
//            max_length -> decode(first max_length/2 ids) + decode(last max_length/2 ids); then the
//            model's chat template unless the dataset is trec, triviaqa, samsum, lsht, lcc or
//            repobench-p; greedy, dataset2maxlen[dataset] new tokens; samsum also stops at "\n"
//   score    eval/metrics/longbench_eval.h: the dataset's metric, max over the answers, after the
//            first-line cleanup of trec, triviaqa, samsum, lsht
// Prediction lines carry LongBench's own keys (pred, answers, all_classes, length), so a folder
// pred/<branch>/ loads in eval.py unchanged, and longbench_eval_folder() scores any such folder the
// way eval.py does.
// Deviation: pred.py gives samsum min_length = prompt + 1 (the first new token cannot be "\n");
// here a samsum output that starts with "\n" is cut to "".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/eval/datasets.h"
#include "kvlab/model/model.h"
#include "kvlab/tasks/task_runner.h"
#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

// LongBench-E's 13 datasets (files <name>_e.jsonl; scored per length bucket).
const std::vector<std::string>& longbench_e_datasets();

// --datasets: "all" (the 21), "e" (LongBench-E's 13, bucketed), or a comma-separated list of
// dataset names. Unknown names throw, naming --datasets and listing the known ones.
struct LongBenchSelection {
  std::vector<std::string> datasets;
  bool e = false;
};
LongBenchSelection parse_longbench_datasets(const std::string& spec);

// dataset2maxlen[dataset] from LongBench's config/dataset2maxlen.json (`path`); errors name it.
int64_t longbench_max_new_tokens(const std::string& path, const std::string& dataset);

// One record as the model sees it. `chat_template` is the --chat-template value; max_length > 0.
TaskRecord longbench_task_record(const PromptRecord& rec, const ModelSource& src, const Tokenizer& tok,
                                 const std::string& chat_template, int64_t max_length,
                                 int64_t max_new_tokens);

// The scorer of `dataset`: {"score": metric in [0, 1], "pred", "answers", "all_classes", "length"}.
TaskSpec longbench_task(const std::string& dataset);

// eval.py over a folder of <dataset>.jsonl prediction files (pred, answers, all_classes[, length]):
// {dataset: score} with scorer, or with `e` {dataset: {"0-4k", "4-8k", "8k+"}} with scorer_e
// (NaN for an empty bucket is written as null). Files whose stem is not a LongBench dataset throw,
// as eval.py's dataset2metric lookup does; so does a line without "pred" or "answers".
nlohmann::json longbench_eval_folder(const std::string& folder, bool e);

// The table of BalanceKV Table 1 / Chelsea Table 2 from (label, longbench_eval_folder scores): one row
// per label with a column per dataset and the datasets' mean as "average"; with `e`, one row per
// (label, "bucket") and no average.
nlohmann::json longbench_score_table(const std::vector<std::pair<std::string, nlohmann::json>>& scored,
                                     const std::vector<std::string>& datasets, bool e);
std::vector<std::string> longbench_table_columns(const std::vector<std::string>& datasets, bool e);

}  // namespace kvlab
