// What the end-to-end benchmark commands (longeval, niah; longbench and summarize to come) share:
// the model and (method, budget) flags, the branches with exact first (the fidelity reference),
// the loaded model and tokenizer, the run folder, and one dataset's run with progress.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvlab/core/config.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model.h"
#include "kvlab/tasks/task_runner.h"
#include "kvlab/tokenizer/tokenizer.h"
#include "run_folder.h"

namespace kvlab::cli {

struct TaskCommonOptions : RunFolderOptions {
  std::string model = "smollm2-135m";
  std::string method = "exact";
  std::vector<double> ratio;
  std::vector<int64_t> budget;
  std::vector<int64_t> T;
  std::vector<double> bytes;
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  std::string chat_template = "auto";
  std::string preset = "paper";        // every method as its paper ran it (compress/preset.h)
  std::string protocol = "whole";      // tasks/protocol.h
  std::string decode_rule = "prefill";
  std::string ratio_of = "prompt";     // prompt | prompt+answer (tasks/protocol.h)
  bool kept_out = false;               // write <run>/kept/<dataset>/<record>.json
  bool layer_error = false;            // each line: the branch's single-layer error on the question (context)
  int64_t obs_queries = 256;
  int64_t keep_first = 0;
  int64_t keep_last = 0;
  int64_t seed = 42;
  std::string dtype = "fp32";
  std::string weights = "fp32";  // --weights stored | fp32 (issue 51)
  std::string device = "cpu";
  std::string shard = "0/1";
  bool quiet = false;
  bool no_batch = false;               // decode a record's branches one by one (issue 25's comparison)
  // experiment: the command's name ("longeval", "niah", ...), the default --name
  explicit TaskCommonOptions(std::string experiment) : RunFolderOptions(std::move(experiment)) {}
  void fields(FieldList& f);
};

// What a task command's flags mean, parsed and checked once, before the model loads (issue 49:
// the protocol was parsed from its strings in four places).
struct TaskPlan {
  // exact first, then every (method, budget); exact is added when --method lacks it.
  std::vector<TaskBranch> branches;
  TaskProtocol protocol;  // --protocol, --decode-rule
  int shard_i = 0;        // --shard i/N: records i, i+N, ... of each dataset
  int shard_n = 1;
};
// With `need_files` false (check() before a dry run), a method whose calibration file is not made
// yet is left out (compress/method_spec.h).
TaskPlan plan_task(const TaskCommonOptions& o, bool need_files = true);

struct TaskModel {
  ModelSource src;
  Model model;
  Tokenizer tok;
  int64_t context = 0;  // the model's context (max_position_embeddings; 0 = unknown)
};
std::unique_ptr<TaskModel> load_task_model(const TaskCommonOptions& o);

// The run folder (--out, or a new one under --results-dir) and result.json's context block
// (provenance, config, the model's id).
struct TaskRun {
  RunDir run;
  nlohmann::json ctx;
  // A complete run resumed with nothing left to do keeps the context of the binaries that made it:
  // `kept_ctx` (the previous result.json's) is what this run writes until it changes a prediction file.
  std::optional<nlohmann::json> kept_ctx;
  bool computed = false;  // this binary changed pred/ (a record to decode, a stale line dropped)
  std::set<std::string> datasets;  // the datasets run so far (their pred/<branch>/<dataset>.jsonl)

  const nlohmann::json& context() const { return kept_ctx && !computed ? *kept_ctx : ctx; }
  // result.json with `rows` and `extra` under context().
  void write(const nlohmann::json& rows, const nlohmann::json& extra) const {
    run.write_result(context(), rows, extra);
  }
};
// The binaries that wrote a run before this one: the previous result.json's context `prev` (its
// git_sha, git_dirty and date) appended to its own "earlier_runs", repeats of one (sha, dirty) pair
// in a row merged (the date their last run started), less a last entry equal to `now` (this run's
// context) when `now` is a clean build. An entry without a git_sha is dropped.
nlohmann::json earlier_runs(const nlohmann::json& prev, const nlohmann::json& now);

// The run folder and its context (model, protocol, preset, earlier_runs); writes a result.json
// with "complete": false (the rows of an earlier run kept unless --overwrite) before anything runs,
// except over a complete run (without --overwrite): that one is left as it is, and keeps its
// context unless a prediction file has to change (a record to decode again, a line to drop), when
// it is marked incomplete before the change (TaskRun::kept_ctx, TaskOptions::before_change).
// With --overwrite, pred/'s folders of branches not in `branches` are removed first (another config's
// results, which an eval of the folder would score beside this run's), and when the last dataset
// has run, its prediction files of datasets this run did not write.
TaskRun open_task_run(const TaskCommonOptions& o, const TaskModel& tm, const nlohmann::json& effective,
                      const TaskPlan& plan);

// With --overwrite: removes pred/<branch>/<dataset>.jsonl of every dataset not in tr.datasets (another
// config's). run_task_dataset calls it after the last dataset; a command that never passes `last`
// calls it itself once every dataset has run.
void remove_other_datasets(const TaskCommonOptions& o, const TaskRun& tr);

// The lines above a task table: the protocol (tasks/protocol.h) and preset, and what "mem *" means.
std::string task_table_header(const TaskCommonOptions& o, const TaskPlan& plan);

// Runs one dataset's records through the branches with a progress line, then rewrites
// result.json with every row so far (`complete` when this was the last dataset; over a complete run
// with nothing decoded yet, only the last dataset writes, under the kept context).
nlohmann::json run_task_dataset(const TaskCommonOptions& o, const TaskModel& tm, TaskRun& tr, const TaskSpec& task,
                                const std::vector<TaskRecord>& records, const TaskPlan& plan, nlohmann::json& rows,
                                bool last);

// The branch folders of a task run's pred/ (`pred_dir`): exact first (the fidelity reference), then
// by name. For the eval subcommands (longbench eval, ruler eval).
std::vector<std::string> task_branch_folders(const std::string& pred_dir);

}  // namespace kvlab::cli
