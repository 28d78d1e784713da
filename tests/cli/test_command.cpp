// The CLI binding of a FieldList (apps/kvlab/command.h): config files stand in for flags, and
// flags override them.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>

#include <fstream>

#include "command.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "test_util.h"

using namespace kvlab;
using kvlab::cli::Command;

namespace {
struct Opts {
  double ratio = 0.5;
  std::string method = "exact";
  std::vector<double> ratios;
  void fields(FieldList& f) {
    f.add("ratio", ratio, "fraction kept").add("method", method, "method").add("ratios", ratios, "list");
  }
};
}  // namespace

TEST_CASE("config file values apply and flags override them") {
  auto dir = test::temp_dir("cfg");
  auto cfg = dir + "/c.json";
  std::ofstream(cfg) << R"({"ratio": 0.2, "method": "h2o", "ratios": [0.1, 0.3]})";
  CLI::App app;
  Opts o;
  Command cmd(app, "x", "test");
  o.fields(cmd.fields());
  cmd.bind();
  app.parse("x --method snapkv --config " + cfg, /*program_name_included=*/false);
  REQUIRE(cmd.resolve());
  CHECK(o.ratio == 0.2);
  CHECK(o.method == "snapkv");  // the flag wins
  CHECK(o.ratios == std::vector<double>{0.1, 0.3});
  CHECK(cmd.effective()["method"] == "snapkv");
}

TEST_CASE("a list flag or config list naming a value twice is an error naming the flag and the value (issue 50)") {
  // Before: --ratio 0.5,0.5 ran one branch twice into one prediction file, exit 0.
  struct Lists {
    std::vector<double> ratio;
    std::vector<int64_t> T;
    std::vector<std::string> param;
    void fields(FieldList& f) { f.add("ratio", ratio, "r").add("T", T, "t").add("param", param, "p"); }
  };
  auto dir = test::temp_dir("cfg_lists");
  std::ofstream(dir + "/c.json") << R"({"T": [2, 3, 2]})";
  auto resolve = [&](const std::string& args) {
    CLI::App app;
    Lists o;
    Command cmd(app, "x", "test");
    o.fields(cmd.fields());
    cmd.bind();
    app.parse("x " + args, /*program_name_included=*/false);
    return cmd.resolve();
  };
  CHECK(resolve("--ratio 0.5,0.25 --T 2,3 --param a=1 --param b=1"));
  CHECK_THROWS_WITH_AS(resolve("--ratio 0.5,0.5"), doctest::Contains("--ratio: 0.5 is listed twice"), Error);
  CHECK_THROWS_WITH_AS(resolve("--ratio 0.5 --ratio 0.50"), doctest::Contains("--ratio: 0.5 is listed twice"), Error);
  CHECK_THROWS_WITH_AS(resolve("--T 2,2"), doctest::Contains("--T: 2 is listed twice"), Error);
  CHECK_THROWS_WITH_AS(resolve("--param a=1 --param a=1"), doctest::Contains("--param: 'a=1' is listed twice"), Error);
  CHECK_THROWS_WITH_AS(resolve("--config " + dir + "/c.json"), doctest::Contains("--T: 2 is listed twice"), Error);
}
