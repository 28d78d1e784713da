// End-to-end task benchmarks (issue 11): records scored through compressed caches.
//
// For each record, one exact prefill is shared by the full cache and every (method, budget) branch
// (generate/branches.h); each decodes greedily until EOS, a stop string or the record's token
// limit. The task scores each output; beside the score, every branch's fidelity to the full cache
// on the same record: whether its output equals the full cache's, and ROUGE-L F1 (rouge-score's
// definition) of its output against the full cache's output. A small model near the floor on the
// task itself still separates methods by fidelity.
//
// Several questions about one context (TaskRecord::context_group) share its prefill under
// --protocol context; their lines carry context_group and question_index.
//
// Outputs: pred/<branch>/<dataset>.jsonl, one line per record, appended and flushed as each record
// finishes. A rerun over the same folder skips what every branch already has (a killed run loses
// no finished record) and the summary is computed from the files, so it is the same either way.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvlab/compress/method_spec.h"
#include "kvlab/generate/reconstruction.h"
#include "kvlab/model/model.h"
#include "kvlab/tasks/protocol.h"
#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

struct TaskRecord {
  std::string id;                 // unique within the dataset
  std::vector<int64_t> prompt;    // token ids, chat template applied
  // prompt[0, context_len) is the context, the rest the question and the assistant prefix
  // (--protocol context feeds the rest through the compressed cache); -1 = no split known.
  int64_t context_len = -1;
  int64_t max_new_tokens = 64;
  std::vector<std::string> stop;  // stop strings besides EOS; the output is cut before the first
  nlohmann::json gold;            // what the scorer needs
  // One context asked several questions (issue 53; RULER's niah_multiquestion): consecutive records
  // with the same non-empty group hold equal context ids. Under --protocol context they share one
  // exact prefill of the context and what it memoizes (attention sums, kvzip's reconstruction);
  // each question then goes through the branch's compressed context afresh, the earlier questions
  // and answers removed (kvpress's evaluation). The method's compression of the shared context is
  // deterministic (the seed fixed), so each question sees what a single compression would hold.
  // question_index: the question's place in its group (-1: a record of its own).
  std::string context_group;
  int64_t question_index = -1;
};

struct TaskSpec {
  std::string dataset;  // the prediction file's name (without .jsonl)
  // Scores one output: {"score": x in [0, 1], ...anything to keep in the prediction line}.
  std::function<nlohmann::json(const std::string& output, const nlohmann::json& gold)> score;
  // Further numeric keys of the score (in [0, 1]) whose mean x 100 goes into the summary rows
  // beside "score" (e.g. rouge1, rouge2, rougeL).
  std::vector<std::string> mean_keys;
};

struct TaskBranch {
  std::string label;  // folder name under pred/: "exact", "h2o_ratio0.2", ...
  MethodSpec method;
  Budget budget;
};

// Fidelity of an output to the full cache's: ROUGE-L F1 of rouge-score (eval/metrics/rouge_google.h:
// lowercase, runs outside [a-z0-9] split, LCS, F = 2PR / (P + R)), except that every CJK character
// (Han, kana, Hangul) is a token of its own: rouge-score drops them, which scores every Chinese
// output 0, even against itself. Text without CJK scores exactly as rouge-score's ROUGE-L.
double fidelity_rouge_l(const std::string& reference, const std::string& output);

// One summary row of a branch over `records` from its prediction lines (id -> line); see run_task.
nlohmann::json task_summary_row(const TaskBranch& branch, const TaskSpec& task, const std::vector<std::string>& ids,
                                const std::map<std::string, nlohmann::json>& lines);

// "exact" for the exact method, else "<method>_<budget label without '='>".
std::string task_branch_label(const MethodSpec& method, const Budget& budget);

struct TaskOptions {
  std::string pred_dir;     // <run>/pred
  TaskProtocol protocol;    // the question, the decode rule, memory counted whole (protocol.h)
  std::string kept_dir;     // "" = off; else <kept_dir>/<dataset>/<record id>.json: what every branch kept
  // Each prediction line gets the branch's single-layer error on the question's queries
  // (generate/branches.h QuestionProbe; --protocol context): "layer_rel_err", the mean over the
  // compressed layers of ||z - z_exact||_F / ||z_exact||_F, and "layer_rel_err_by_layer".
  bool layer_error = false;
  uint64_t seed = 0;
  int64_t obs_queries = 256;
  int64_t keep_first = 0;  // prompt positions kept exact before the compressed region (a method's
  int64_t keep_last = 0;   // preset or keep_first/keep_last parameter overrides), inside the budget
  // A record's branches decode in one batch (generate/branches.h run_branches; the same outputs as
  // one after another, which false gives).
  bool batch = true;
  // kvzip's repeat prompts (generate/reconstruction.h): for records built with the run's chat
  // template, and for records without one (reconstruction_prompt_for picks by the prompt's start).
  ReconstructionPrompt reconstruction_templated, reconstruction_plain;
  // Called once per record; `resumed`: every branch had it from an earlier run.
  std::function<void(int64_t done, int64_t total, const std::string& note, bool resumed)> progress;
  // Called once, before the first change to a prediction file (a line dropped: cut, made from
  // another record or model, or of an id not in `records`; or a record to decode), and not at all
  // when there is none: a caller that keeps a complete run's result.json marks it incomplete here.
  std::function<void()> before_change;
};

// Marks every non-exact row whose entries_start (the entries right after compression: the budget
// the protocol fixes) differs by more than 1% from the median of the rows of its dataset and
// setting: "mem" = "*" (else ""). Peak and mean are not compared: they also count each branch's own
// generated tokens, which differ with its output's length. Rows without entries_start are left alone.
// Branches stored by a quantizer (kv_quant) are compared with those stored by the same one: at a
// bytes setting (--bytes) a quantized branch keeps more entries by design.
void mark_unequal_memory(nlohmann::json& rows);

// Runs every record through `branches` (the first must be exact: the fidelity reference) and
// returns one summary row per branch: {"branch", "method", "preset", "setting", "dataset", "n",
// "score", "same_as_exact", "rougeL_vs_exact", "seconds_per_record", "entries_mean",
// "entries_peak", "bytes_mean", "bytes_peak", "mem", "record_scores": {id: score}}. The entry
// counts are live entries per (layer, KV head), averaged over the records (generate/branches.h).
nlohmann::json run_task(const Model& model, const Tokenizer& tok, const TaskSpec& task,
                        const std::vector<TaskRecord>& records, const std::vector<TaskBranch>& branches,
                        const TaskOptions& opt);

}  // namespace kvlab
