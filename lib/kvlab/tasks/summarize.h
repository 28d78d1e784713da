// XSUM summarization (BUZZ Tables 1-2, CaM; docs/methods.md §5) through compressed caches: each
// record's own prompt ("###\nArticle: ... Summarize the above article in 1 sentence.\n"), its own
// stop rules (`max_tokens` new tokens, the `stop` strings), greedy decoding (the records'
// temperature 0.3 is not used: every branch must decode the same way), scored with ROUGE-1/2/L F1
// of Google's rouge-score against `summary_gt` (eval/metrics/rouge_google.h, stemmer on, as
// HELM's summarization metric that H2O and CaM use).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "kvlab/eval/datasets.h"
#include "kvlab/model/model.h"
#include "kvlab/tasks/task_runner.h"
#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

// One record of read_dataset's Xsum schema (XSUM, or any article/summary file in that schema) as the
// model sees it; `max_new_tokens` <= 0 takes the record's `max_tokens` (else 64). Errors name the
// dataset and the record's line.
TaskRecord summarize_task_record(const PromptRecord& rec, const ModelSource& src, const Tokenizer& tok,
                                 const std::string& chat_template, int64_t max_new_tokens,
                                 const std::string& dataset = "xsum");

// The dataset name of a summarization file: its file name without ".jsonl" and without a trailing
// "_<N>shot" (xsum_0shot.jsonl -> "xsum", cnndm.jsonl -> "cnndm"); names the prediction files and rows.
std::string summarize_dataset_name(const std::string& path);

// {"score": ROUGE-L F1, "rouge1", "rouge2", "rougeL": F1 in [0, 1]} for `dataset`.
TaskSpec summarize_task(bool use_stemmer = true, const std::string& dataset = "xsum");

}  // namespace kvlab
