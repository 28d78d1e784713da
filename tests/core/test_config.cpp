// Config files standing in for flags: overrides, unknown keys, wrong types.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/text.h"
#include "kvlab/core/write_check.h"
#include "test_util.h"

using namespace kvlab;

namespace {
struct Opts {
  double ratio = 0.5;
  std::string method = "exact";
  int64_t seeds = 1;
  std::vector<double> ratios;
  void fields(FieldList& f) {
    f.add("ratio", ratio, "fraction kept");
    f.add("method", method, "method");
    f.add("seeds", seeds, "seeds");
    f.add("ratios", ratios, "list");
  }
};
}  // namespace

TEST_CASE("config files: unknown keys and wrong types are errors naming the key") {
  auto dir = test::temp_dir("cfg");
  FieldList f;
  Opts o2;
  o2.fields(f);
  CHECK_THROWS_WITH_AS(f.from_json(nlohmann::json::parse(R"({"raito": 0.3})"), "c.json", false),
                       doctest::Contains("unknown key 'raito' (did you mean 'ratio'?)"), Error);
  CHECK_THROWS_WITH_AS(f.from_json(nlohmann::json::parse(R"({"seeds": "ten"})"), "c.json", false),
                       doctest::Contains("key 'seeds' must be an integer, found \"ten\""), Error);
  CHECK_THROWS_WITH_AS(read_json_file(dir + "/none.json"), doctest::Contains("cannot open"), Error);
  std::ofstream(dir + "/bad.json") << "{\"ratio\": ";
  CHECK_THROWS_WITH_AS(read_json_file(dir + "/bad.json"), doctest::Contains("invalid JSON"), Error);
}

TEST_CASE("config files: a value nested deeper than 64 is one short error naming the file (issue 50)") {
  // Before: 100,000 nested arrays overflowed the stack (SIGSEGV) in every command reading a
  // --config; 50,000 gave a 100 KB error line.
  auto dir = test::temp_dir("cfg_deep");
  auto nested = [&](const std::string& name, int depth) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "{\"a\":" << std::string(size_t(depth), '[') << std::string(size_t(depth), ']') << "}";
    return path;
  };
  CHECK(read_json_file(nested("ok.json", 63)).is_object());  // 64 levels with the top object
  for (int depth : {64, 50000, 100000}) {
    const std::string path = nested("deep" + std::to_string(depth) + ".json", depth);
    std::string msg;
    try {
      read_json_file(path);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO("depth " << depth << ": " << msg.substr(0, 400));
    CHECK(msg.find(path + ": nested deeper than 64 levels") != std::string::npos);
    CHECK(msg.size() < 300);
  }
}

TEST_CASE("flag value parsers") {
  CHECK(parse_index_list("all", 3, "--layers") == std::vector<int>{0, 1, 2});
  CHECK(parse_index_list("4,0-2", 5, "--layers") == std::vector<int>{0, 1, 2, 4});
  CHECK_THROWS_WITH_AS(parse_index_list("0,9", 5, "--layers"), doctest::Contains("--layers: index 9 out of range"), Error);
  CHECK_THROWS_WITH_AS(parse_index_list("x", 5, "--layers"), doctest::Contains("--layers"), Error);
  CHECK(parse_queries_spec("last:256", 100, "--queries") == 100);
  CHECK(parse_queries_spec("last:16", 100, "--queries") == 16);
  CHECK(parse_queries_spec("all", 100, "--queries") == 100);
  CHECK_THROWS_WITH_AS(parse_queries_spec("first:3", 100, "--queries"), doctest::Contains("--queries"), Error);
  CHECK(closest_match("chelsa", {"chelsea", "h2o", "snapkv"}) == "chelsea");
  CHECK(closest_match("zzzzzz", {"chelsea", "h2o"}) == "");
}

TEST_CASE("check_written names why a write failed: a full disk says so (issue 26)") {
  // Before: a full disk during prediction writes said only "write failed". /dev/full fails every
  // write with ENOSPC, as a full file system does.
  if (!std::filesystem::exists("/dev/full")) {
    MESSAGE("skipped: no /dev/full");
    return;
  }
  std::ofstream f("/dev/full");
  f << "{\"id\": \"r1\"}\n";  // buffered: the failure shows only at the flush
  CHECK_THROWS_WITH_AS(kvlab::check_written(f, "pred/exact/x.jsonl"),
                       "pred/exact/x.jsonl: write failed (No space left on device)", kvlab::Error);
  std::ostringstream ok;
  ok << "fine\n";
  CHECK_NOTHROW(kvlab::check_written(ok, "memory"));
}
