// The CLI binding of a FieldList (apps/kvlab/command.h): config files stand in for flags, and
// flags override them.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>

#include <fstream>

#include "command.h"
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
