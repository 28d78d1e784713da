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
