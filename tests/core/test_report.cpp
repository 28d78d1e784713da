#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sha256.h"
#include "test_util.h"

using namespace kvlab;

TEST_CASE("sha256 matches the FIPS 180-4 test vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("run directories hold config.json and an atomically written result.json with context") {
  auto base = test::temp_dir("runs");
  nlohmann::json cfg = {{"ratio", 0.2}};
  RunDir run(base, "exp", cfg);
  CHECK(run.path().find(base + "/exp/") == 0);
  CHECK(read_json_file(run.file("config.json")) == cfg);
  auto ctx = context_block("cpu", 7, cfg);
  run.write_result(ctx, nlohmann::json::array({{{"method", "exact"}, {"rel_err", 0.0}}}));
  auto j = read_json_file(run.file("result.json"));
  for (auto key : {"schema_version", "kvlab_version", "git_sha", "git_dirty", "date", "host", "device",
                   "torch_version", "cuda_version", "build_type", "seed", "config_sha256"})
    CHECK_MESSAGE(j["context"].contains(key), key);
  CHECK(j["context"]["config_sha256"] == sha256_hex(cfg.dump()));
  CHECK(j["rows"][0]["method"] == "exact");
  CHECK(!std::filesystem::exists(run.file("result.json.partial")));
  auto table = render_table(j["rows"], {"method", "rel_err"});
  CHECK(table.find("method") != std::string::npos);
  CHECK(render_csv(j["rows"], {"method", "rel_err"}) == "method,rel_err\nexact,0\n");
}

TEST_CASE("a run folder resumes only under its own config; a key added later resumes at the value it had before") {
  namespace fs = std::filesystem;
  const std::string dir = test::temp_dir("resume_config") + "/run";
  const nlohmann::json before = {{"method", "h2o"}, {"ratio", {0.2}}, {"out", dir}};
  { RunDir first(dir, "", before, /*exact=*/true); }
  REQUIRE(fs::exists(dir + "/config.json"));
  std::ofstream(dir + "/pred.jsonl") << "{}\n";  // a result: the folder is kept from here on
  nlohmann::json same = before;
  same["quiet"] = true;  // how a run goes, not what it computes
  CHECK_NOTHROW(RunDir(dir, "", same, true));
  nlohmann::json other = before;
  other["ratio"] = {0.3};
  CHECK_THROWS_WITH_AS(RunDir(dir, "", other, true), doctest::Contains("holds the results of another config"), Error);
  // --ratio-of came after this folder was written: its default (what every earlier run computed)
  // resumes it; the other value is another config.
  nlohmann::json added = before;
  added["ratio_of"] = "prompt";
  CHECK_NOTHROW(RunDir(dir, "", added, true));
  added["ratio_of"] = "prompt+answer";
  CHECK_THROWS_WITH_AS(RunDir(dir, "", added, true), doctest::Contains("holds the results of another config"), Error);
  // The same comparison joins shards (kvlab merge), either side the older.
  CHECK(same_run_config(before, {{"method", "h2o"}, {"ratio", {0.2}}, {"ratio_of", "prompt"}}));
  CHECK(same_run_config({{"method", "h2o"}, {"ratio", {0.2}}, {"ratio_of", "prompt"}}, before));
  CHECK_FALSE(same_run_config({{"method", "h2o"}, {"ratio", {0.2}}, {"ratio_of", "prompt+answer"}}, before));
  CHECK_FALSE(same_run_config({{"method", "h2o"}, {"ratio", {0.2}}}, {{"method", "h2o"}}));
}

TEST_CASE("result.json's layout: nlohmann's dump(2) but one compact line per row; parses back to the same JSON") {
  const nlohmann::json context = {{"config", {{"prompt", "two\nlines \"quoted\""}, {"ratio", {0.25, 0.5}}}},
                                  {"git_sha", "abc"}, {"empty", nlohmann::json::object()}};
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 3; ++i)
    rows.push_back({{"method", "h2o"}, {"record_scores", {{"0", 1.0}, {"8", 2.0 / 3}}}, {"params", {{"w", i}}}});
  const nlohmann::json j = {{"complete", true}, {"context", context}, {"rows", rows}, {"ruler", {{{"a", 1}}}}};
  const std::string text = result_json_text(j);
  CHECK(nlohmann::json::parse(text) == j);
  // Without rows (or with none), exactly what dump(2) writes.
  nlohmann::json no_rows = j;
  no_rows.erase("rows");
  CHECK(result_json_text(no_rows) == no_rows.dump(2) + "\n");
  no_rows["rows"] = nlohmann::json::array();
  CHECK(result_json_text(no_rows) == no_rows.dump(2) + "\n");
  CHECK(result_json_text(nlohmann::json::object()) == "{}\n");
  // Each row on its own line, compact; everything else where dump(2) puts it.
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  int row_lines = 0;
  for (const auto& l : lines)
    if (l.rfind("    {\"method\"", 0) == 0) {
      const std::string body = l.back() == ',' ? l.substr(4, l.size() - 5) : l.substr(4);
      CHECK(nlohmann::json::parse(body) == rows[size_t(row_lines)]);
      CHECK(body == rows[size_t(row_lines)].dump());
      ++row_lines;
    }
  CHECK(row_lines == 3);
  const std::string context_text = "  \"context\": " + [&] {
    std::string v = context.dump(2), out;
    for (char c : v) out += c == '\n' ? std::string("\n  ") : std::string(1, c);
    return out;
  }();
  CHECK(text.find(context_text) != std::string::npos);
}

TEST_CASE("rows in a file beside result.json: written, read back, and a missing, cut or broken file is one error naming it") {
  auto base = test::temp_dir("rows_file");
  RunDir run(base, "exp", {{"x", 1}});
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) rows.push_back({{"i", i}, {"v", 0.1 * i}, {"s", "a\nb"}});
  run.write_result_and_rows(context_block("cpu", 0, {{"x", 1}}), rows, "rows.jsonl", {{"complete", true}});
  const auto j = read_json_file(run.file("result.json"));
  CHECK(j["rows"].empty());
  CHECK(j["rows_file"] == "rows.jsonl");
  CHECK(j["n_rows"] == 4);
  CHECK(j["complete"] == true);
  CHECK(test::read_file(run.file("rows.jsonl")) == rows[0].dump() + "\n" + rows[1].dump() + "\n" + rows[2].dump() +
                                                       "\n" + rows[3].dump() + "\n");
  CHECK(read_result_rows(run.file("result.json")) == rows);
  // Inline rows read as they are.
  run.write_result(context_block("cpu", 0, {{"x", 1}}), rows);
  CHECK(read_result_rows(run.file("result.json")) == rows);
  run.write_result_and_rows(context_block("cpu", 0, {{"x", 1}}), rows, "rows.jsonl");
  const std::string text = test::read_file(run.file("rows.jsonl"));
  std::ofstream(run.file("rows.jsonl"), std::ios::trunc) << text.substr(0, text.rfind('{'));  // last row cut off
  const std::string cut = "rows.jsonl: holds 3 rows but " + run.file("result.json") + " says 4";
  CHECK_THROWS_WITH_AS(read_result_rows(run.file("result.json")), doctest::Contains(cut.c_str()), Error);
  std::ofstream(run.file("rows.jsonl"), std::ios::trunc) << text.substr(0, text.size() - 5) << "\n";  // a cut line
  CHECK_THROWS_WITH_AS(read_result_rows(run.file("result.json")), doctest::Contains("rows.jsonl:4: not a JSON row"),
                       Error);
  std::filesystem::remove(run.file("rows.jsonl"));
  CHECK_THROWS_WITH_AS(read_result_rows(run.file("result.json")), doctest::Contains("which is missing"), Error);
}

TEST_CASE("sha256 of a file equals sha256 of its bytes, across the 1 MiB read blocks") {
  auto dir = test::temp_dir("sha_file");
  for (size_t n : {size_t(0), size_t(3), size_t(64), size_t(1) << 20, (size_t(1) << 20) + 65}) {
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 251);
    const std::string path = dir + "/f" + std::to_string(n);
    std::ofstream(path, std::ios::binary) << bytes;
    CAPTURE(n);
    CHECK(sha256_file_hex(path) == sha256_hex(bytes));
  }
  CHECK_THROWS_WITH_AS(sha256_file_hex(dir + "/missing"), doctest::Contains(("cannot read '" + dir + "/missing'").c_str()),
                       Error);
}

TEST_CASE("an atomic write that hits a full disk is one error naming the file; the previous file is intact") {
  namespace fs = std::filesystem;
  auto dir = test::temp_dir("full_disk");
  const std::string path = dir + "/result.json";
  write_json_atomic(path, {{"rows", {1, 2, 3}}});
  const std::string before = test::read_file(path);
  CHECK_FALSE(fs::exists(path + ".partial"));
  // Injected failure: the temp name leads to /dev/full, where every write fails with ENOSPC.
  REQUIRE(fs::exists("/dev/full"));
  fs::create_symlink("/dev/full", path + ".partial");
  CHECK_THROWS_WITH_AS(write_json_atomic(path, {{"rows", {4, 5, 6}}}),
                       doctest::Contains(("cannot write '" + path + "': No space left on device (disk full); the "
                                          "previous file is unchanged").c_str()),
                       Error);
  CHECK(test::read_file(path) == before);
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".partial")));
  // A new file on a full disk: nothing is left behind either.
  fs::create_symlink("/dev/full", dir + "/new.json.partial");
  CHECK_THROWS_WITH_AS(write_text_atomic(dir + "/new.json", std::string(100, 'x')),
                       doctest::Contains("No space left on device (disk full); nothing was written"), Error);
  CHECK_FALSE(fs::exists(dir + "/new.json"));
  // The next write succeeds.
  write_json_atomic(path, {{"rows", {4, 5, 6}}});
  CHECK(read_json_file(path)["rows"] == nlohmann::json({4, 5, 6}));
}

TEST_CASE("remove_stale_partial removes what an interrupted writer left, and says so") {
  namespace fs = std::filesystem;
  auto dir = test::temp_dir("stale_partial");
  CHECK_FALSE(remove_stale_partial(dir + "/c.h5"));
  std::ofstream(dir + "/c.h5.partial") << "half a capture";
  CHECK(remove_stale_partial(dir + "/c.h5"));
  CHECK_FALSE(fs::exists(dir + "/c.h5.partial"));
}
