// Joining the shards of an end-to-end task run (`--shard i/N`: shard i ran records i, i+N, ...).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvlab {

// The summary rows of every shard (task_runner.h's rows) as one row per (branch, dataset), in
// first-seen order: "n" summed, every other number the n-weighted mean, "record_scores" joined;
// strings and "params" must agree across shards.
nlohmann::json merge_task_rows(const std::vector<nlohmann::json>& shard_rows);

// Before anything is written: every (branch, dataset) row of each shard's result.json (shard_rows[s],
// from shard_dirs[s]) has its prediction file, whose lines parse, name each record once and name
// exactly the records of the row's record_scores; no prediction file lacks a row. One error line
// names the shard's file, the line and what is wrong (issue 26: a deleted line, a deleted file or a
// duplicated line merged with rc 0, wrong counts and records out of order).
void check_task_shard_preds(const std::vector<std::string>& shard_dirs, const std::vector<nlohmann::json>& shard_rows);

// pred/<branch>/<dataset>.jsonl of the shards (run folders in shard order 0..N-1) interleaved back
// into record order (line j of shard s is record j*N + s) under out_dir/pred/. Returns the number
// of files written.
int merge_task_preds(const std::vector<std::string>& shard_dirs, const std::string& out_dir);

// Fidelity computed again from the outputs of the joined prediction files under run_dir/pred/: each
// line's same_as_exact and rougeL_vs_exact (fidelity_rouge_l) against pred/exact's output for the
// same record, the files rewritten, and the rows' means updated. Shards decoded by an older kvlab
// thus join with the current fidelity measure; the outputs are untouched.
void refresh_task_fidelity(const std::string& run_dir, nlohmann::json& rows);

}  // namespace kvlab
