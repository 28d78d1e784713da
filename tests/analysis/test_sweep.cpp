// kvlab sweep: grid expansion and reload order; an interrupted sweep (stopped after one point,
// then one point cut off mid-run) continued with the same --out gives the rows of an uninterrupted
// one; --emit-jobs writes a SLURM array script that `bash -n` accepts and whose tasks, run locally
// by setting SLURM_ARRAY_TASK_ID, produce points that `kvlab merge` gathers into the same rows.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "kvlab/core/check.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sweep.h"
#include "test_util.h"

using namespace kvlab;

namespace {

std::string kvlab_cmd(const std::string& args) {
  return "OMP_WAIT_POLICY=PASSIVE " + test::kvlab_bin() + " --threads 1 " + args + " 2>&1";
}

// Rows without their timing fields (the only ones allowed to differ between runs).
nlohmann::json untimed(nlohmann::json rows) {
  for (auto& r : rows)
    for (const char* k : {"compress_ms", "seconds"}) r.erase(k);
  return rows;
}

}  // namespace

TEST_CASE("sweep grid: Cartesian product, reload axes outermost, zipped name axes, labels") {
  const auto j = nlohmann::json::parse(R"({
    "name": "t", "command": "replay", "base": {"method": "uniform", "params": {"uniform": {}}},
    "axes": [
      {"key": "budget", "values": [[8], [16]]},
      {"name": "layout", "values": [{"params.buzz.window": 3, "params.buzz.threshold": 9, "label.T_over_w": 3.0},
                                    {"params.buzz.window": 4, "params.buzz.threshold": 8, "label.T_over_w": 2.0}]},
      {"key": "capture", "values": ["a.h5", "b.h5"]}]})");
  auto pts = expand_sweep(parse_sweep(j, "t.json"));
  REQUIRE(pts.size() == 8);
  // capture varies slowest (a reload), then budget, then layout fastest.
  CHECK(pts[0].config["capture"] == "a.h5");
  CHECK(pts[3].config["capture"] == "a.h5");
  CHECK(pts[4].config["capture"] == "b.h5");
  CHECK(pts[1].config["budget"] == nlohmann::json::array({8}));
  CHECK(pts[2].config["budget"] == nlohmann::json::array({16}));
  CHECK(pts[1].config["params"]["buzz"]["window"] == 4);
  CHECK(pts[1].config["params"]["buzz"]["threshold"] == 8);
  CHECK(pts[1].config["params"]["uniform"].is_object());  // base kept
  CHECK(pts[1].columns["T_over_w"] == 2.0);
  CHECK(!pts[1].config.contains("label"));
  CHECK(pts[5].columns["sweep_point"] == 5);
  CHECK_THROWS_WITH_AS(parse_sweep(nlohmann::json::parse(R"({"name": "t", "command": "replay", "axes": [],
                       "base": {}})"), "t.json"), doctest::Contains("axes"), Error);
  CHECK_THROWS_WITH_AS(parse_sweep(nlohmann::json::parse(R"({"name": "t", "command": "replay", "axis": []})"),
                       "t.json"), doctest::Contains("unknown key 'axis'"), Error);
  CHECK(shell_quote("it's") == "'it'\\''s'");
}

TEST_CASE("kvlab sweep: interrupted + continued == uninterrupted; SLURM jobs + merge == the same rows") {
  const std::string dir = test::temp_dir("sweep");
  std::string out;
  REQUIRE(test::run_command(kvlab_cmd("synth --out " + dir + "/c.h5 --kind clustered --tokens 200 --queries 64 "
                                      "--layers 2 --q-heads 4 --kv-heads 2 --head-dim 16 --samples 1"), &out) == 0);
  const nlohmann::json sweep = {
      {"name", "t"}, {"command", "replay"},
      {"base", {{"capture", dir + "/c.h5"}, {"method", "uniform,h2o"}, {"eval_queries", "last:16"},
                {"obs_queries", 16}, {"seeds", 2}, {"quiet", true}}},
      {"axes", {{{"key", "budget"}, {"values", {{20}, {40}, {60}}}},
                {{"key", "keep_first"}, {"values", {0, 4}}}}}};
  std::ofstream(dir + "/sweep.json") << sweep.dump(2);

  INFO(out);
  REQUIRE(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/full"), &out) == 0);
  auto full = nlohmann::json::parse(test::read_file(dir + "/full/result.json"));
  CHECK(full["complete"] == true);
  // The rows are in sweep_rows.jsonl, one compact line each, not in the indented result.json.
  CHECK(full["rows_file"] == kSweepRowsFile);
  CHECK(full["rows"].empty());
  full["rows"] = read_result_rows(dir + "/full/result.json");
  REQUIRE(full["rows"].size() == 6 * 2 * 2 * 2 * 2);  // points x methods x seeds x layers x KV heads
  CHECK(full["n_rows"] == full["rows"].size());
  CHECK(full["rows"][0]["sweep_point"] == 0);
  CHECK(full["rows"][0].contains("keep_first"));

  // Interrupted: two points, then point 2 cut off after its first (sample, layer) unit (replay's
  // checkpoint: "complete": false and half the rows), then continued.
  REQUIRE(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/part --max-points 2"), &out) == 0);
  auto part = nlohmann::json::parse(test::read_file(dir + "/part/result.json"));
  CHECK(part["complete"] == false);
  CHECK(part["points_done"] == 2);
  {
    auto p2 = nlohmann::json::parse(test::read_file(dir + "/full/points/0002/result.json"));
    nlohmann::json half = nlohmann::json::array();
    for (const auto& r : p2["rows"])
      if (r["layer"] == 0) half.push_back(r);
    p2["rows"] = half;
    p2["complete"] = false;
    std::filesystem::create_directories(dir + "/part/points/0002");
    std::filesystem::copy_file(dir + "/full/points/0002/config.json", dir + "/part/points/0002/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::ofstream(dir + "/part/points/0002/result.json") << p2.dump();
  }
  REQUIRE(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/part"), &out) == 0);
  CHECK(out.find("resuming") != std::string::npos);  // point 2 continued from its checkpoint
  part = nlohmann::json::parse(test::read_file(dir + "/part/result.json"));
  CHECK(part["complete"] == true);
  CHECK(untimed(read_result_rows(dir + "/part/result.json")) == untimed(full["rows"]));

  // SLURM: the script parses, two array tasks run locally, the rest too, and merge gathers them
  // (one LibTorch thread, as the sweep's own children here, so that the rows match bit for bit).
  REQUIRE(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/slurm --emit-jobs " + dir +
                                      "/jobs"), &out) == 0);
  const std::string script = test::read_file(dir + "/jobs/sweep.sbatch");
  CHECK(script.find("#SBATCH --array=0-5") != std::string::npos);
  CHECK(test::read_file(dir + "/jobs/commands.txt").find(" replay --config ") != std::string::npos);
  CHECK(test::run_command("bash -n " + dir + "/jobs/sweep.sbatch 2>&1", &out) == 0);
  // Merging before every task ran is an error naming the missing point.
  CHECK(test::run_command("KVLAB_THREADS=1 SLURM_ARRAY_TASK_ID=3 bash " + dir + "/jobs/sweep.sbatch > /dev/null 2>&1", &out) == 0);
  CHECK(test::run_command("KVLAB_THREADS=1 SLURM_ARRAY_TASK_ID=0 bash " + dir + "/jobs/sweep.sbatch > /dev/null 2>&1", &out) == 0);
  CHECK(std::filesystem::exists(dir + "/slurm/points/0003/result.json"));
  CHECK(!std::filesystem::exists(dir + "/slurm/points/0001/result.json"));
  CHECK(test::run_command(kvlab_cmd("merge " + dir + "/slurm --out " + dir + "/merged"), &out) != 0);
  CHECK(out.find("point 1") != std::string::npos);
  for (int i : {1, 2, 4, 5})
    REQUIRE(test::run_command("KVLAB_THREADS=1 SLURM_ARRAY_TASK_ID=" + std::to_string(i) + " bash " + dir +
                              "/jobs/sweep.sbatch > /dev/null 2>&1", &out) == 0);
  CHECK(test::run_command("SLURM_ARRAY_TASK_ID=6 bash " + dir + "/jobs/sweep.sbatch 2>&1", &out) == 2);
  REQUIRE(test::run_command(kvlab_cmd("merge " + dir + "/slurm --out " + dir + "/merged"), &out) == 0);
  CHECK(untimed(read_result_rows(dir + "/merged/result.json")) == untimed(full["rows"]));

  // --emit-jobs again into its own folder is fine; into a folder of the user's files it is refused
  // (before: sweep.sbatch, commands.txt and the point files were replaced).
  REQUIRE(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/slurm --emit-jobs " + dir +
                                      "/jobs"), &out) == 0);
  std::filesystem::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/sweep.sbatch") << "my own script\n";
  CHECK(test::run_command(kvlab_cmd("sweep " + dir + "/sweep.json --out " + dir + "/slurm2 --emit-jobs " + dir +
                                    "/mine"), &out) != 0);
  CHECK(out.find("--emit-jobs " + dir + "/mine: holds files kvlab did not write") != std::string::npos);
  CHECK(test::read_file(dir + "/mine/sweep.sbatch") == "my own script\n");
}

TEST_CASE("sweep: a config path set by two axes is an error naming both (issue 26)") {
  // Before: the later axis silently won and the rows named the value the earlier one set.
  using nlohmann::json;
  auto axes = [](const char* a) {
    return json::parse(std::string(R"({"name": "t", "command": "replay", "base": {}, "axes": )") + a + "}");
  };
  CHECK_THROWS_WITH_AS(parse_sweep(axes(R"([{"key": "ratio", "values": [0.1]}, {"key": "ratio", "values": [0.2]}])"),
                                   "t.json"),
                       doctest::Contains("t.json: axes[0] and axes[1] both set 'ratio'"), kvlab::Error);
  CHECK_THROWS_WITH_AS(
      parse_sweep(axes(R"([{"key": "params.buzz.stride", "values": [3]},
                            {"name": "layout", "values": [{"params.buzz.stride": 5, "label.x": 1}]}])"),
                  "t.json"),
      doctest::Contains("axes[0] and axes[1] both set 'params.buzz.stride'"), kvlab::Error);
  CHECK_THROWS_WITH_AS(parse_sweep(axes(R"([{"name": "a", "values": [{"ratio": 0.1}]},
                                            {"name": "a", "values": [{"budget": 3}]}])"),
                                   "t.json"),
                       doctest::Contains("axes[0] and axes[1] both set 'name:a'"), kvlab::Error);
  // One name axis setting a path in several of its values is fine.
  CHECK(parse_sweep(axes(R"([{"name": "a", "values": [{"ratio": 0.1}, {"ratio": 0.2}]}])"), "t.json").axes.size() == 1);
}
