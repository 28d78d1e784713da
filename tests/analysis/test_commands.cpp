// kvlab tsne and kvlab clusterability end to end on a small synthetic capture: the files they
// write, one row per (layer, head, keys|values), clustered keys scored as clusterable, refusal to
// replace another config's folder, and bad flags named in one line.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "test_util.h"

using namespace kvlab;

namespace {

std::string kvlab_cmd(const std::string& args) {
  return "OMP_WAIT_POLICY=PASSIVE " + test::kvlab_bin() + " --threads 1 " + args + " 2>&1";
}

}  // namespace

TEST_CASE("kvlab tsne and clusterability on a synthetic capture") {
  const std::string dir = test::temp_dir("analysis_cmds");
  std::string out;
  REQUIRE(test::run_command(kvlab_cmd("synth --out " + dir + "/c.h5 --kind clustered --clusters 6 --tokens 300 "
                                      "--queries 32 --layers 2 --q-heads 2 --kv-heads 2 --head-dim 16 --samples 2"),
                            &out) == 0);
  INFO(out);
  REQUIRE(test::run_command(kvlab_cmd("tsne --capture " + dir + "/c.h5 --layers all --heads 0 --max-iter 300 "
                                      "--kcenter-k 6 --out " + dir + "/tsne"), &out) == 0);
  auto j = nlohmann::json::parse(test::read_file(dir + "/tsne/result.json"));
  REQUIRE(j["rows"].size() == 4);  // 2 layers x {keys, values}
  for (const auto& r : j["rows"]) {
    CHECK(r["n_points"] == 300);
    // Clustered keys embed almost perfectly; the synthetic values are isotropic noise.
    CHECK(r["trustworthiness"].get<double>() > (r["kind"] == "keys" ? 0.95 : 0.7));
  }
  CHECK(j["context"].contains("git_sha"));
  const std::string svg = test::read_file(dir + "/tsne/tsne.svg");
  CHECK(svg.find("class=\"panel\" data-kind=\"keys\" data-layer=\"1\"") != std::string::npos);
  const std::string csv = test::read_file(dir + "/tsne/embedding.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 4 * 300);

  REQUIRE(test::run_command(kvlab_cmd("clusterability --capture " + dir + "/c.h5 --samples all --k-max 32 --out " +
                                      dir + "/cl"), &out) == 0);
  j = nlohmann::json::parse(test::read_file(dir + "/cl/result.json"));
  REQUIRE(j["rows"].size() == 2 * 2 * 2 * 2);  // samples x layers x heads x {keys, values}
  for (const auto& r : j["rows"]) {
    CHECK(r.contains("r32_over_diam"));
    CHECK(!r.contains("r64_over_diam"));  // --k-max 32
    if (r["kind"] == "keys") CHECK(r["r16_over_diam"].get<double>() < 0.3);  // 6 clusters of keys
  }
  REQUIRE(j["query_norms"].size() == 2);
  CHECK(j["query_norms"][0]["n_prompts"] == 2);
  CHECK(j["query_norms"][0]["ci95_low"].get<double>() <= j["query_norms"][0]["mean"].get<double>());
  CHECK(j["keys_vs_values"].size() == 4);
  const std::string curve = test::read_file(dir + "/cl/radius_curve.csv");
  CHECK(std::count(curve.begin(), curve.end(), '\n') == 1 + 2 * 2 * 32);  // layers x kinds x k
  for (const char* f : {"radius_over_diameter.svg", "radius_over_r1.svg"}) {
    const std::string svg = test::read_file(dir + "/cl/" + f);
    CHECK(svg.find("data-title=\"layer 1\"") != std::string::npos);
    CHECK(svg.find("class=\"series\" data-label=\"values\"") != std::string::npos);
  }

  // Another config into the same folder is refused; a bad flag is one line naming it.
  CHECK(test::run_command(kvlab_cmd("clusterability --capture " + dir + "/c.h5 --k-max 8 --out " + dir + "/cl"), &out) != 0);
  CHECK(out.find("--out") != std::string::npos);
  CHECK(test::run_command(kvlab_cmd("tsne --capture " + dir + "/c.h5 --perplexity 400 --out " + dir + "/t2"), &out) != 0);
  CHECK(out.find("--perplexity") != std::string::npos);
  CHECK(test::run_command(kvlab_cmd("tsne --capture " + dir + "/c.h5 --sample 5 --out " + dir + "/t3"), &out) != 0);
  CHECK(out.find("--sample") != std::string::npos);
}
