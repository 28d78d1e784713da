// kvlab merge DIR... --out DIR: joins the result.json of replay shards (--shard i/N) into one
// run, checking they share one config, and recomputes the aggregates. Given one sweep folder
// (`kvlab sweep --emit-jobs`, its jobs run elsewhere), gathers the rows of all its points instead.
// Shards of an end-to-end task (longbench, longeval, niah, summarize) are joined with their
// prediction files.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sweep.h"
#include "kvlab/replay/plan.h"
#include "kvlab/replay/tables.h"
#include "kvlab/tasks/longbench.h"
#include "kvlab/tasks/niah_figure.h"
#include "kvlab/tasks/ruler.h"
#include "kvlab/tasks/task_merge.h"

namespace kvlab::cli {
namespace {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string out;
  bool overwrite = false;
  void fields(FieldList& f) {
    f.add("inputs", inputs, "run directories (or result.json files) of the shards").positional();
    f.add("out", out, "directory of the merged run (never one of the inputs)").required();
    f.add("overwrite", overwrite, "replace a --out folder that holds the results of another config");
  }
};

// One sweep folder: every point must have finished; rows in point order with their axis columns.
void merge_sweep(const MergeOptions& o, const nlohmann::json& effective) {
  const std::string dir = o.inputs.front();
  const nlohmann::json manifest = read_json_file(dir + "/sweep.json");
  int done = 0;
  auto rows = gather_sweep_rows(dir, /*require_all=*/true, &done);
  RunDir run(o.out, "merge", effective, /*exact=*/true, o.overwrite);
  auto context = context_block("cpu", 0, manifest.value("spec", nlohmann::json::object()));
  context["merged_from"] = dir;
  context["sweep"] = {{"name", manifest["spec"].value("name", "")}, {"command", manifest["spec"].value("command", "")},
                      {"n_points", done}};
  run.write_result_and_rows(context, rows, kSweepRowsFile, {{"complete", true}, {"points_done", done}});
  fmt::print(stderr, "[merge] sweep {}: {} rows from {} points -> {}\n", dir, rows.size(), done, run.file("result.json"));
}

// The shards of an end-to-end task (longeval, niah, longbench, summarize, ruler): prediction files
// interleaved back into record order, summary rows joined, LongBench's and RULER's tables made again.
void merge_task_shards(const MergeOptions& o, const nlohmann::json& effective, const nlohmann::json& base_config,
                       const std::map<int, std::pair<std::string, nlohmann::json>>& by_shard) {
  std::vector<std::string> dirs;
  std::vector<nlohmann::json> shard_rows;
  nlohmann::json contexts = nlohmann::json::array();
  for (const auto& [i, dj] : by_shard) {
    dirs.push_back(dj.first);
    shard_rows.push_back(dj.second["rows"]);
    contexts.push_back(dj.second["context"]);
  }
  check_task_shard_preds(dirs, shard_rows);  // before --out is touched
  RunDir run(o.out, "merge", effective, /*exact=*/true, o.overwrite);
  const int files = merge_task_preds(dirs, run.path());
  nlohmann::json rows = merge_task_rows(shard_rows);
  refresh_task_fidelity(run.path(), rows);
  auto context = context_block("cpu", 0, base_config);
  context["merged_from"] = contexts;
  // The protocol is one config's (the shards' configs are equal): tables read it from context.
  if (contexts.size() && contexts[0].contains("protocol")) context["protocol"] = contexts[0]["protocol"];
  nlohmann::json extra = {{"complete", true}};
  const nlohmann::json& first = by_shard.begin()->second.second;
  if (first.contains("longbench")) {  // eval.py's scores need every record: scored again over the joined files
    const bool e = first.value("longbench_e", false);
    std::vector<std::string> datasets;
    for (const auto& r : rows)
      if (std::find(datasets.begin(), datasets.end(), r["dataset"].get<std::string>()) == datasets.end())
        datasets.push_back(r["dataset"].get<std::string>());
    std::vector<std::pair<std::string, nlohmann::json>> scored;
    for (const auto& r : rows)
      if (r["dataset"] == datasets.front())
        scored.push_back({r["branch"].get<std::string>(),
                          longbench_eval_folder(run.file("pred/" + r["branch"].get<std::string>()), e)});
    extra["longbench"] = longbench_score_table(scored, datasets, e);
    extra["longbench_e"] = e;
    std::cout << render_table(extra["longbench"], longbench_table_columns(datasets, e)) << "\n";
  }
  if (first.contains("ruler")) {  // the leaderboard's table over the joined rows, and the samples (every shard wrote them)
    namespace fs = std::filesystem;
    // A row of a shard written before rows carried their task and length: from its samples' fields.
    for (auto& r : rows)
      if (!r.contains("task")) {
        const std::string data = dirs.front() + "/data/" + r.value("dataset", std::string()) + ".jsonl";
        std::ifstream in(data);
        std::string line;
        if (!std::getline(in, line)) continue;
        const nlohmann::json sample = nlohmann::json::parse(line, nullptr, false);
        if (sample.is_object() && sample.value("task", nlohmann::json()).is_string() &&
            sample.value("max_seq_length", nlohmann::json()).is_number_integer())
          ruler_tag_row(r, sample["task"].get<std::string>(), sample["max_seq_length"].get<int64_t>());
      }
    extra["ruler"] = ruler_score_table(rows);
    if (fs::is_directory(dirs.front() + "/data")) {
      fs::create_directories(run.file("data"));
      for (const auto& e : fs::directory_iterator(dirs.front() + "/data"))
        if (e.is_regular_file())
          fs::copy_file(e.path(), run.file("data/" + e.path().filename().string()), fs::copy_options::overwrite_existing);
    }
    std::cout << render_table(extra["ruler"], ruler_table_columns(extra["ruler"])) << "\n";
  }
  run.write_result(context, rows, extra);
  if (!rows.empty() && rows[0].value("dataset", "") == "niah" && base_config.contains("lengths") &&
      base_config.contains("depths")) {  // the heat map `kvlab niah` draws, over the joined cells
    std::vector<NiahPanel> panels;
    for (const auto& r : rows) panels.push_back({r["branch"].get<std::string>(), r["record_scores"]});
    write_text_atomic(run.file("heatmap.svg"),
                      niah_heatmap_svg(panels, base_config["lengths"].get<std::vector<int64_t>>(),
                                       base_config["depths"].get<std::vector<double>>(),
                                       fmt::format("Needle in a haystack: {}", base_config.value("model", ""))));
  }
  std::cout << render_table(rows, {"branch", "dataset", "n", "score", "same_as_exact", "rougeL_vs_exact"});
  fmt::print(stderr, "[merge] {} shards of a task run: {} rows, {} prediction files -> {}\n", dirs.size(), rows.size(),
             files, run.path());
}

void run_merge(const MergeOptions& o, const nlohmann::json& effective) {
  KVLAB_CHECK(!o.inputs.empty(), "merge: give the shard run directories (or one sweep folder) to merge");
  namespace fs = std::filesystem;
  if (o.inputs.size() == 1 && fs::exists(o.inputs.front() + "/sweep.json")) {
    KVLAB_CHECK(!(fs::exists(o.out) && fs::equivalent(o.inputs.front(), o.out)),
                "--out {} is the sweep folder itself; merge into another folder", o.out);
    return merge_sweep(o, effective);
  }
  for (const auto& in : o.inputs) {
    const fs::path dir = fs::is_directory(in) ? fs::path(in) : fs::path(in).parent_path();
    std::error_code ec;
    KVLAB_CHECK(!(fs::exists(o.out) && fs::equivalent(dir, o.out, ec)),
                "--out {} is one of the inputs ({}); merging into it would replace that shard", o.out, in);
  }
  nlohmann::json rows = nlohmann::json::array(), shards = nlohmann::json::array();
  nlohmann::json skipped;  // replay --skip-nonfinite: the shards' skipped units, joined
  nlohmann::json base_config;
  std::set<std::string> seen_shards;
  std::map<int, std::pair<std::string, nlohmann::json>> by_shard;  // index -> (run folder, result.json)
  int expected_n = -1;
  for (const auto& in : o.inputs) {
    std::string file = in.size() > 5 && in.substr(in.size() - 5) == ".json" ? in : in + "/result.json";
    auto j = read_json_file(file);
    KVLAB_CHECK(j.contains("context") && j.contains("rows") && j["context"].contains("config"),
                "merge: '{}' is not a kvlab replay or task result (no context/config/rows)", file);
    KVLAB_CHECK(j.value("complete", false), "merge: '{}' is incomplete (its run did not finish)", file);
    auto config = j["context"]["config"];
    std::string shard = config.value("shard", "0/1");
    auto [i, n] = parse_shard(shard);
    if (expected_n < 0) expected_n = n;
    KVLAB_CHECK(n == expected_n, "merge: '{}' is shard {} but earlier inputs have N={}", file, shard, expected_n);
    KVLAB_CHECK(seen_shards.insert(shard).second, "merge: shard {} given twice ('{}')", shard, file);
    config.erase("shard");
    config.erase("out");
    if (base_config.is_null()) base_config = config;
    KVLAB_CHECK(same_run_config(config, base_config), "merge: '{}' was run with a different config than '{}':\n{}\nvs\n{}", file,
                o.inputs.front(), config.dump(), base_config.dump());
    j["rows"] = read_result_rows(j, file);  // inline or in a rows file (replay --rows-out jsonl)
    j.erase("rows_file");
    by_shard[i] = {fs::is_directory(in) ? in : fs::path(in).parent_path().string(), j};
    for (const auto& r : j["rows"]) rows.push_back(r);
    if (j.contains("skipped_nonfinite"))
      for (auto& u : j["skipped_nonfinite"].value("units", nlohmann::json::array())) skipped.push_back(u);
    shards.push_back(j["context"]);
  }
  KVLAB_CHECK(int(seen_shards.size()) == expected_n, "merge: {} of {} shards given; missing shards would bias the "
              "aggregate", seen_shards.size(), expected_n);
  if (!rows.empty() && rows[0].contains("record_scores")) return merge_task_shards(o, effective, base_config, by_shard);
  RunDir run(o.out, "merge", effective, /*exact=*/true, o.overwrite);
  auto context = context_block("cpu", 0, base_config);
  context["merged_from"] = shards;
  auto agg = replay_aggregates(rows);
  nlohmann::json extra = {{"complete", true}, {"aggregate", agg}};
  if (base_config.value("skip_nonfinite", false))
    extra["skipped_nonfinite"] = {{"count", skipped.size()},
                                  {"units", skipped.is_null() ? nlohmann::json::array() : skipped}};
  if (base_config.value("rows_out", "inline") == "jsonl")
    run.write_result_and_rows(context, rows, "rows.jsonl", extra);
  else
    run.write_result(context, rows, extra);
  write_replay_tables(run, agg);
  std::cout << render_replay_table(agg["overall"]);
  fmt::print(stderr, "[merge] {} rows from {} shards -> {}\n", rows.size(), shards.size(), run.file("result.json"));
}

}  // namespace

void setup_merge(CLI::App& app) {
  add_command<MergeOptions>(app, "merge",
                     "Merge the result.json of replay shards into one run",
                     run_merge);
}

}  // namespace kvlab::cli
