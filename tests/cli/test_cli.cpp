// The kvlab binary end to end: version, inspect, one clear error line for each kind of bad input,
// replay + shards + merge on a synthetic capture, and replay of a real stories260K capture.
#include <doctest/doctest.h>

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "kvlab/core/config.h"
#include "kvlab/core/report.h"
#include "kvlab/io/synthetic.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

// Replay's two query windows on the small captures below (32 captured queries).
const std::string kWindows = " --eval-queries last:16 --obs-queries 16";

struct Result {
  int code;
  std::string out;
};

Result run_kvlab(const std::string& args) {
  Result r;
  r.code = test::run_command(test::kvlab_bin() + " --threads 2 " + args, &r.out);
  return r;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n + (!s.empty() && s.back() != '\n');
}

// A failed command prints exactly one line, "error: ...", and exits non-zero.
void check_one_error(const Result& r, const std::string& needle) {
  INFO("output: " << r.out);
  CHECK(r.code != 0);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.rfind("error: ", 0) == 0);
  CHECK(r.out.find(needle) != std::string::npos);
}

std::string small_capture(const std::string& dir) {
  SyntheticSpec s;
  s.kind = "heavy";
  s.n_layers = 2;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.n_tokens = 200;
  s.n_q = 32;  // 16 observation + 16 evaluation queries (kWindows)
  s.n_samples = 2;
  auto path = dir + "/cap.h5";
  write_synthetic_capture(path, s);
  return path;
}

}  // namespace

TEST_CASE("cli: --version and --help") {
  auto v = run_kvlab("--version");
  CHECK(v.code == 0);
  CHECK(v.out.find("kvlab 0.") != std::string::npos);
  CHECK(v.out.find("LibTorch") != std::string::npos);
  CHECK(v.out.find("CUDA") != std::string::npos);
  CHECK(v.out.find("git ") != std::string::npos);
  // kvlab re-executes itself with the passive OpenMP policy unless the user chose one (main.cpp).
  std::string out;
  CHECK(test::run_command("env -u OMP_WAIT_POLICY " + test::kvlab_bin() + " --version", &out) == 0);
  CHECK(out.find("OpenMP wait policy PASSIVE") != std::string::npos);
  CHECK(test::run_command("env OMP_WAIT_POLICY=active " + test::kvlab_bin() + " --version", &out) == 0);
  CHECK(out.find("OpenMP wait policy active") != std::string::npos);
  auto h = run_kvlab("--help");
  CHECK(h.code == 0);
  for (auto cmd : {"inspect", "synth", "replay", "merge", "bench", "dump", "generate"}) {
    INFO(cmd);
    CHECK(h.out.find(cmd) != std::string::npos);
  }
}

TEST_CASE("cli: inspect prints the shapes; --json parses") {
  auto dir = test::temp_dir("cli_inspect");
  auto cap = small_capture(dir);
  auto r = run_kvlab("inspect " + cap);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("n_q_heads=4 n_kv_heads=2 head_dim=16") != std::string::npos);
  CHECK(r.out.find("q: [4, 32, 16]  k,v: [2, 200, 16]") != std::string::npos);
  auto j = run_kvlab("inspect --json " + cap);
  REQUIRE(j.code == 0);
  auto parsed = nlohmann::json::parse(j.out);
  CHECK(parsed["n_samples"] == 2);
  CHECK(parsed["samples"][1]["n_tokens"] == 200);
  CHECK(parsed["layers"] == nlohmann::json::array({0, 1}));
}

TEST_CASE("cli: inspect reports non-finite q/k/v (count, first location) and exits non-zero") {
  auto dir = test::temp_dir("cli_nan");
  auto cap = small_capture(dir);
  {
    H5::H5File f(cap, H5F_ACC_RDWR);
    auto ds = f.openDataSet("/sample_0001/layer_01/v");
    std::vector<float> v(2 * 200 * 16);
    ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
    v[(1 * 200 + 17) * 16 + 3] = std::numeric_limits<float>::quiet_NaN();  // KV head 1, position 17
    v[(1 * 200 + 18) * 16 + 0] = std::numeric_limits<float>::infinity();
    ds.write(v.data(), H5::PredType::NATIVE_FLOAT);
  }
  for (std::string flags : {"", "--json "}) {
    auto r = run_kvlab("inspect " + flags + cap);
    INFO(r.out);
    CHECK(r.code != 0);
    for (const char* w : {"error: ", "2 non-finite values", "sample 1", "layer 1", "v = nan at KV head 1, position 17"})
      CHECK(r.out.find(w) != std::string::npos);
  }
}

TEST_CASE("cli: bad input gives one error line and a non-zero exit") {
  auto dir = test::temp_dir("cli_bad");
  auto cap = small_capture(dir);
  SUBCASE("truncated capture") {
    auto p = dir + "/trunc.h5";
    fs::copy_file(cap, p);
    fs::resize_file(p, fs::file_size(p) * 2 / 3);
    check_one_error(run_kvlab("inspect " + p), p);
  }
  SUBCASE("not a capture") {
    auto p = dir + "/text.h5";
    std::ofstream(p) << "not hdf5";
    check_one_error(run_kvlab("inspect " + p), "not an HDF5 file");
  }
  SUBCASE("missing dataset") {
    auto p = dir + "/missing.h5";
    fs::copy_file(cap, p);
    {
      H5::H5File f(p, H5F_ACC_RDWR);
      f.unlink("/sample_0001/layer_01/k");
    }
    check_one_error(run_kvlab("inspect " + p), "'/sample_0001/layer_01/k' is missing");
  }
  SUBCASE("wrong dtype") {
    auto p = dir + "/dtype.h5";
    fs::copy_file(cap, p);
    {
      H5::H5File f(p, H5F_ACC_RDWR);
      f.unlink("/sample_0000/layer_00/v");
      hsize_t dims[3] = {2, 200, 16};
      f.createDataSet("/sample_0000/layer_00/v", H5::PredType::IEEE_F64LE, H5::DataSpace(3, dims));
    }
    check_one_error(run_kvlab("inspect " + p), "expected float32");
  }
  SUBCASE("a variable-length string attribute (capture version 1)") {
    auto p = dir + "/vlen.h5";
    fs::copy_file(cap, p);
    {
      H5::H5File f(p, H5F_ACC_RDWR);
      f.removeAttr("model_id");
      H5::StrType vl(H5::PredType::C_S1, H5T_VARIABLE);
      f.createAttribute("model_id", vl, H5::DataSpace(H5S_SCALAR)).write(vl, std::string("synthetic"));
    }
    check_one_error(run_kvlab("inspect " + p), "attribute '/model_id': a variable-length string");
  }
  SUBCASE("corrupted captures the fuzzer found (tests/fixtures/fuzz_corpus/fuzz_capture/crash_*.h5)") {
    for (const char* name : {"crash_attr_sizes_a", "crash_attr_sizes_b", "crash_huge_cache_entry",
                             "crash_pipeline_name", "crash_unfiltered_chunk", "oom_metadata_length", "oom_4gib_h5c_protect", "crash_masked_checksum"}) {
      INFO(name);
      auto p = test::fixtures_dir() + "/fuzz_corpus/fuzz_capture/" + name + ".h5";
      check_one_error(run_kvlab("inspect " + p), p);
    }
  }
  SUBCASE("misspelled config key") {
    auto cfg = dir + "/bad.json";
    std::ofstream(cfg) << R"({"capture": ")" << cap << R"(", "raito": [0.2]})";
    check_one_error(run_kvlab("replay" + kWindows + " --config " + cfg), "unknown key 'raito' (did you mean 'ratio'?)");
  }
  SUBCASE("unknown method") {
    check_one_error(run_kvlab("replay" + kWindows + " --capture " + cap + " --method chelsa --ratio 0.2"), "Did you mean: chelsea?");
  }
  SUBCASE("ratio out of range") {
    check_one_error(run_kvlab("replay" + kWindows + " --capture " + cap + " --method uniform --ratio 1.5"),
                    "--ratio must be in (0, 1], got 1.5");
  }
  SUBCASE("unknown parameter") {
    check_one_error(run_kvlab("replay" + kWindows + " --capture " + cap + " --method snapkv --ratio 0.2 --param windw=8"),
                    "unknown parameter 'windw' (did you mean 'window'?)");
  }
  SUBCASE("layer not captured") {
    check_one_error(run_kvlab("replay" + kWindows + " --capture " + cap + " --method exact --ratio 1 --layers 5"), "--layers");
  }
  SUBCASE("too few captured queries for both windows") {
    auto r = run_kvlab("replay --capture " + cap + " --method h2o --ratio 0.2 --eval-queries last:16 --obs-queries 20");
    check_one_error(r, "32 queries were captured, but --eval-queries last:16 and --obs-queries 20 need 36");
  }
}

TEST_CASE("cli: replay writes complete results; shards merge to the unsharded rows") {
  auto dir = test::temp_dir("cli_replay");
  auto cap = small_capture(dir);
  std::string common = "replay" + kWindows + " --quiet --capture " + cap + " --method exact,uniform,h2o --ratio 0.25,0.5 --seeds 2";
  auto full = run_kvlab(common + " --out " + dir + "/full");
  REQUIRE_MESSAGE(full.code == 0, full.out);
  auto s0 = run_kvlab(common + " --shard 0/2 --out " + dir + "/s0");
  auto s1 = run_kvlab(common + " --shard 1/2 --out " + dir + "/s1");
  REQUIRE(s0.code == 0);
  REQUIRE(s1.code == 0);
  auto m = run_kvlab("merge " + dir + "/s0 " + dir + "/s1 --out " + dir + "/merged");
  REQUIRE_MESSAGE(m.code == 0, m.out);
  auto a = read_json_file(dir + "/full/result.json"), b = read_json_file(dir + "/merged/result.json");
  CHECK(a["complete"] == true);
  // 2 samples x 2 layers x 2 heads x 3 methods x 2 ratios x 2 seeds
  CHECK(a["rows"].size() == 96);
  CHECK(b["rows"].size() == 96);
  CHECK(a["aggregate"]["overall"].size() == 6);
  for (size_t i = 0; i < a["aggregate"]["overall"].size(); ++i) {
    auto ra = a["aggregate"]["overall"][i], rb = b["aggregate"]["overall"][i];
    CHECK(ra["method"] == rb["method"]);
    CHECK(ra["rel_err"].get<double>() == doctest::Approx(rb["rel_err"].get<double>()).epsilon(1e-12));
  }
  CHECK(a["context"].contains("git_sha"));
  CHECK(a["context"]["config"]["method"] == "exact,uniform,h2o");
  // A merge with a shard missing is refused.
  check_one_error(run_kvlab("merge " + dir + "/s0 --out " + dir + "/bad"), "1 of 2 shards");

  // Shards that keep their rows in rows.jsonl (--rows-out jsonl) merge to the same rows, kept in
  // rows.jsonl. Before: merge read result.json's empty "rows" and aggregated nothing.
  for (int i : {0, 1})
    REQUIRE(run_kvlab(common + " --rows-out jsonl --shard " + std::to_string(i) + "/2 --out " + dir + "/j" +
                      std::to_string(i)).code == 0);
  auto mj = run_kvlab("merge " + dir + "/j0 " + dir + "/j1 --out " + dir + "/merged_jsonl");
  REQUIRE_MESSAGE(mj.code == 0, mj.out);
  auto c = read_json_file(dir + "/merged_jsonl/result.json");
  CHECK(c["rows_file"] == "rows.jsonl");
  CHECK(c["rows"].empty());
  auto rows_b = b["rows"], rows_c = read_result_rows(dir + "/merged_jsonl/result.json");
  for (auto* rs : {&rows_b, &rows_c})
    for (auto& r : *rs) r.erase("compress_ms");
  CHECK(rows_c == rows_b);
  CHECK(c["aggregate"]["overall"].size() == b["aggregate"]["overall"].size());
  // A rows file cut short is one error naming it, not a silently smaller aggregate.
  {
    std::ofstream(dir + "/j1/rows.jsonl", std::ios::trunc) << "";
    check_one_error(run_kvlab("merge " + dir + "/j0 " + dir + "/j1 --out " + dir + "/bad2"), "rows.jsonl: holds 0 rows");
  }
}

TEST_CASE("cli: every method replays a real stories260K capture") {
  auto model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) {
    MESSAGE("stories260K not found under " << model << ": skipped");
    return;
  }
  auto dir = test::temp_dir("cli_stories");
  auto cap = dir + "/stories.h5";
  auto d = run_kvlab("dump --model " + model +
                 " --prompt 'Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                 "park with her friends. One day, she saw a big red ball under a tree and wanted to play with it.'"
                 " --queries last:32 --out " + cap);
  REQUIRE_MESSAGE(d.code == 0, d.out);
  auto r = run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method all --ratio 0.5 --out " + dir + "/rep");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  auto j = read_json_file(dir + "/rep/result.json");
  std::set<std::string> methods;
  // A unit's bytes are its live entries' K and V (issue 52: adakv's padding was counted): the
  // mean kept_fraction of a unit's heads is its bytes_fraction, for every method without a
  // separate denominator set (subgen, balancekv-mr hold keys without values there).
  std::map<std::string, std::pair<double, int>> kept_mean;
  std::map<std::string, double> bytes_of;
  for (const auto& row : j["rows"]) {
    methods.insert(row["method"].get<std::string>());
    CHECK(std::isfinite(row["rel_err"].get<double>()));
    if (row["method"] == "exact") CHECK(row["rel_err"].get<double>() < 1e-5);
    const std::string m = row["method"].get<std::string>();
    if (m == "subgen" || m == "balancekv-mr") continue;
    if (m == "think") {  // keys lose half their channels (ThinK): fewer bytes than entries
      CHECK(row["bytes_fraction"].get<double>() < row["kept_fraction"].get<double>());
      CHECK(row["bytes_fraction"].get<double>() > 0.75 * row["kept_fraction"].get<double>());
      continue;
    }
    const std::string unit = m + "|" + row["sample"].dump() + "|" + row["layer"].dump() + "|" + row["seed"].dump();
    kept_mean[unit].first += row["kept_fraction"].get<double>();
    kept_mean[unit].second += 1;
    bytes_of[unit] = row["bytes_fraction"].get<double>();
  }
  for (const auto& [unit, kept] : kept_mean) {
    INFO("unit " << unit);
    CHECK(kept.first / kept.second == doctest::Approx(bytes_of[unit]).epsilon(1e-9));
  }
  // Chelsea's calibration on the same model, and a replay that reads it (top 10% of heads full).
  auto cal = run_kvlab("calibrate chelsea --model " + model + " --text " + test::shared_dir() +
                       "/data/wikitext2/wiki.test.raw --samples 2 --tokens 200 --n-sink 4 --n-recent 8 --chunk 32 "
                       "--out " + dir + "/cal.json");
  REQUIRE_MESSAGE(cal.code == 0, cal.out);
  auto scores = read_json_file(dir + "/cal.json");
  REQUIRE(scores["scores"].size() == scores["n_layers"].get<size_t>());
  for (const auto& row : scores["scores"]) {
    REQUIRE(row.size() == scores["n_kv_heads"].get<size_t>());
    for (const auto& v : row) CHECK((v.get<double>() >= 0 && v.get<double>() <= 1));
  }
  auto ch = run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method chelsea --ratio 0.5 --param outliers=" +
                      dir + "/cal.json --param outlier_fraction=0.1 --out " + dir + "/rep_chelsea");
  REQUIRE_MESSAGE(ch.code == 0, ch.out);
  auto agg = read_json_file(dir + "/rep_chelsea/result.json")["aggregate"]["overall"][0];
  CHECK(agg["kept_fraction"].get<double>() > 0.3);
  auto listed = run_kvlab("replay --list-methods");
  std::istringstream lines(listed.out);
  size_t n_listed = 0, n_no_replay = 0, n_calibrated = 0, n_question = 0;
  // One line a method, then its paper preset's line (indented). --method all leaves out the methods
  // that need the model (criticalkv and criticaladakv its weights, kvzip and kvcompose a second prefill), and naming one is an error
  // naming --method; and those that need a calibration file none was given for (duo_attention).
  // The quantizers (issue 52) follow the methods, after a blank line and "quantizers: ...".
  size_t n_quantizers = 0;
  bool quantizers = false;
  for (std::string line; std::getline(lines, line);) {
    quantizers = quantizers || line.rfind("quantizers:", 0) == 0;
    if (quantizers) {
      n_quantizers += line.find(" quantizer ") != std::string::npos;
      continue;
    }
    n_listed += !line.empty() && line[0] != ' ';
    n_no_replay += line.find("[not in replay: needs") != std::string::npos;
    n_calibrated += line.find("[needs a calibration file") != std::string::npos;
    n_question += line.find("[in replay only with --param") != std::string::npos;
  }
  CHECK(n_no_replay == 4);
  CHECK(n_calibrated == 1);
  CHECK(n_question == 1);  // finch: its window is the question, which replay has none of
  CHECK(methods.size() == n_listed - n_no_replay - n_calibrated - n_question);
  CHECK(n_listed >= 17);
  CHECK(n_quantizers == 4);  // kivi, int, hqq, fp8
  auto crit = run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method criticalkv:knorm --ratio 0.5 --out " +
                        dir + "/rep_crit");
  CHECK(crit.code != 0);
  CHECK(crit.out.find("--method criticalkv:knorm: needs the layer's output projection W_o") != std::string::npos);
  // The advice names only commands that run it (issue 50: it named ppl, which refuses a method that
  // does not stream).
  CHECK(crit.out.find("run it in generate or a task command") != std::string::npos);
  CHECK(crit.out.find("ppl") == std::string::npos);
  auto zip = run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method kvzip --ratio 0.5 --out " + dir +
                       "/rep_zip");
  CHECK(zip.code != 0);
  CHECK(zip.out.find("--method kvzip: needs a second prefill through the model") != std::string::npos);
}

TEST_CASE("cli: ppl streams each method's cache from the first token (stories260K)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  const std::string text = test::shared_dir() + "/data/wikitext2/wiki.test.raw";
  if (!fs::exists(model + "/model.safetensors") || !fs::exists(text)) {
    MESSAGE("skipped: stories260K or wikitext2 not found (set KVLAB_SHARED)");
    return;
  }
  auto dir = test::temp_dir("kvlab_cli_ppl");
  const std::string base = "ppl --quiet --model " + model + " --text " + text + " --max-tokens 120";
  // The full cache token by token (exact through the compressed-cache path) equals the chunked
  // full-cache reference; a window of 16 entries does not.
  auto r = run_kvlab(base + " --method exact,local --cache-size 16 --out " + dir + "/p");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  auto rows = read_json_file(dir + "/p/result.json")["rows"];
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["method"] == "full");
  CHECK(rows[0]["n_predicted"] == 119);
  CHECK(rows[1]["method"] == "exact");
  CHECK(rows[1]["ppl"].get<double>() == doctest::Approx(rows[0]["ppl"].get<double>()).epsilon(1e-6));
  CHECK(rows[1]["kl_full"].get<double>() < 1e-8);
  CHECK(rows[1]["top1_agree"].get<double>() == 1.0);
  CHECK(rows[2]["method"] == "local");
  CHECK(rows[2]["kl_full"].get<double>() > 1e-3);
  CHECK(rows[2]["kv_bytes_peak"].get<int64_t>() < rows[1]["kv_bytes_peak"].get<int64_t>() / 4);
  // issue 25: the branches fed one after another (--no-batch) give the batched rows (float rounding apart).
  auto rn = run_kvlab(base + " --method exact,local,h2o --cache-size 16 --no-batch --out " + dir + "/pn");
  REQUIRE_MESSAGE(rn.code == 0, rn.out);
  auto rb = run_kvlab(base + " --method exact,local,h2o --cache-size 16 --out " + dir + "/pb");
  REQUIRE_MESSAGE(rb.code == 0, rb.out);
  auto one = read_json_file(dir + "/pn/result.json")["rows"], all = read_json_file(dir + "/pb/result.json")["rows"];
  REQUIRE(one.size() == all.size());
  for (size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(all[i]["ppl"].get<double>() == doctest::Approx(one[i]["ppl"].get<double>()).epsilon(1e-6));
    CHECK(all[i]["top1_agree"] == one[i]["top1_agree"]);
    CHECK(all[i]["kv_bytes_peak"] == one[i]["kv_bytes_peak"]);
  }
  // --segments: segment 0 is the single-segment run; segment 1 is the text's next 119 tokens after
  // BOS (its own numbers); an interrupted run resumes: the same --out finds both segments done and
  // recomputes nothing; --rerotate marks the rows.
  auto rs = run_kvlab(base + " --method local --cache-size 16 --segments 2 --rerotate --out " + dir + "/ps");
  REQUIRE_MESSAGE(rs.code == 0, rs.out);
  auto seg = read_json_file(dir + "/ps/result.json");
  CHECK(seg["complete"] == true);
  REQUIRE(seg["rows"].size() == 4);
  CHECK(seg["rows"][0]["segment"] == 0);
  CHECK(seg["rows"][0]["ppl"] == rows[0]["ppl"]);  // the full cache's, same 120 tokens
  CHECK(seg["rows"][1]["rerotate"] == true);
  CHECK(seg["rows"][2]["segment"] == 1);
  CHECK(seg["rows"][2]["ppl"] != rows[0]["ppl"]);
  auto again = run_kvlab(base + " --method local --cache-size 16 --segments 2 --rerotate --out " + dir + "/ps");
  REQUIRE_MESSAGE(again.code == 0, again.out);
  CHECK(again.out.find("(2 done before)") != std::string::npos);
  CHECK(read_json_file(dir + "/ps/result.json")["rows"] == seg["rows"]);
  check_one_error(run_kvlab(base + " --method local --cache-size 16 --segments 100000 --out " + dir + "/pz"),
                  "--segments 100000 of --max-tokens 120: --text");
  CHECK_FALSE(fs::exists(dir + "/pz"));
  check_one_error(run_kvlab(base + " --method tova --cache-size 16 --rerotate --out " + dir + "/pz"), "--rerotate: tova");
  CHECK_FALSE(fs::exists(dir + "/pz"));
  // --compress-every N (issue 53): a prefill-only method reads the text too, every branch peaks at
  // the same bytes (cache size + N entries), and the rule changes a streaming method's numbers.
  auto ce = run_kvlab(base + " --method exact,knorm,local --cache-size 16 --compress-every 4 --out " + dir + "/pce");
  REQUIRE_MESSAGE(ce.code == 0, ce.out);
  const auto ce_rows = read_json_file(dir + "/pce/result.json")["rows"];
  REQUIRE(ce_rows.size() == 4);  // full, exact, knorm, local
  CHECK(ce_rows[1]["compress_every"] == 0);  // the full cache never compresses
  CHECK(ce_rows[1]["ppl"].get<double>() == doctest::Approx(ce_rows[0]["ppl"].get<double>()).epsilon(1e-6));
  CHECK(ce_rows[2]["compress_every"] == 4);
  CHECK(ce_rows[2]["kv_bytes_peak"] == ce_rows[3]["kv_bytes_peak"]);
  CHECK(ce_rows[3]["ppl"] != rows[2]["ppl"]);  // local by its own rule (p: full, exact, local)
  check_one_error(run_kvlab(base + " --method knorm --cache-size 16 --out " + dir + "/pz"), "knorm compresses once");
  check_one_error(run_kvlab(base + " --method expected_attention --cache-size 16 --compress-every 4 --out " + dir + "/pz"),
                  "--decode-rule compress: expected_attention un-rotates its keys");
  CHECK_FALSE(fs::exists(dir + "/pz"));
  // generate --method: the same ids batched and not.
  const std::string gen = "generate --model " + model + " --prompt-ids 1,403,407,261,378,432,383,286,261,376,298,315 "
                          "--method exact,snapkv,streaming_llm,h2o --ratio 0.5 --max-new-tokens 12 --ignore-eos --json";
  auto ga = run_kvlab(gen), gb = run_kvlab(gen + " --no-batch");
  REQUIRE_MESSAGE(ga.code == 0, ga.out);
  REQUIRE_MESSAGE(gb.code == 0, gb.out);
  auto ja = nlohmann::json::parse(ga.out.substr(ga.out.find('{'))), jb = nlohmann::json::parse(gb.out.substr(gb.out.find('{')));
  REQUIRE(ja["branches"].size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(ja["branches"][i]["generated_ids"] == jb["branches"][i]["generated_ids"]);
  // Bad input: one line naming what is wrong.
  check_one_error(run_kvlab(base + " --method snapkv --out " + dir + "/q"), "snapkv compresses once after a prefill");
  check_one_error(run_kvlab(base + " --method buzz --cache-size 4 --out " + dir + "/q"), "below BUZZ's minimum");
  check_one_error(run_kvlab(base + " --method h2o --cache-size 0 --out " + dir + "/q"), "--cache-size must be >= 1");
  check_one_error(run_kvlab("generate --model " + model + " --prompt-ids 1,2,3 --max-new-tokens 100000"),
                  "exceed");
  check_one_error(run_kvlab("generate --model " + model + " --prompt-ids 1,2,3,4,5,6,7,8,9 --method h2o --ratio 0.5 "
                            "--keep-last 2"), "--keep-last 2: h2o streams while decoding");
}

// Issue 50: `bench compress` failed on its own default --method all (expected_attention and
// compactor were not given the RoPE frequencies they read).
TEST_CASE("cli: bench compress runs its default --method all, on the synthetic capture and on a capture") {
  auto dir = test::temp_dir("kvlab_cli_bench_compress");
  for (const std::string src : {std::string(), " --capture " + small_capture(dir) + " --queries 16"}) {
    INFO("source: " << src);
    auto r = run_kvlab("bench compress --quiet --overwrite --sizes 64,128 --tokens 128 --reps 1 --out " + dir +
                       "/b.json" + src);
    REQUIRE_MESSAGE(r.code == 0, r.out);
    auto j = read_json_file(dir + "/b.json");
    std::set<std::string> seen;
    for (const auto& row : j["rows"]) seen.insert(row["method"].get<std::string>());
    for (const std::string m : {"expected_attention", "capkv", "compactor", "snapkv", "chelsea"}) CHECK(seen.count(m) == 1);
    CHECK(seen.count("kvzip") == 0);  // needs the model: left out of `all` in a bench without one
  }
}

TEST_CASE("cli: bench generate measures every method beside exact on one prefill per context (stories260K)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  const std::string text = test::shared_dir() + "/data/wikitext2/wiki.test.raw";
  if (!fs::exists(model + "/model.safetensors") || !fs::exists(text)) {
    MESSAGE("skipped: stories260K or wikitext2 not found (set KVLAB_SHARED)");
    return;
  }
  auto dir = test::temp_dir("kvlab_cli_bench_generate");
  auto r = run_kvlab("bench generate --model " + model + " --text " + text + " --context 120,240 --new-tokens 6 "
                     "--obs-queries 16 --method streaming_llm,snapkv --param snapkv.window=8 --out " + dir + "/b");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  auto j = read_json_file(dir + "/b/result.json");
  CHECK(j["prefills"] == 2);
  REQUIRE(j["rows"].size() == 6);  // exact added first, per context
  for (size_t i = 0; i < 6; ++i) {
    const auto& row = j["rows"][i];
    CHECK(row["context"] == (i < 3 ? 120 : 240));
    CHECK(row["method"] == std::vector<std::string>{"exact", "streaming_llm", "snapkv"}[i % 3]);
    CHECK(row["decoded"] == 5);
    if (i % 3 == 0) CHECK(row["kv_vs_exact"].get<double>() == 1.0);
    // ratio 0.2 of the prompt (+ snapkv's exact window of 8): the bytes really drop
    else CHECK(row["kv_vs_exact"].get<double>() < 0.3);
  }
  check_one_error(run_kvlab("bench generate --model " + model + " --text " + text + " --context 100000"),
                  "exceed");
}

TEST_CASE("cli: replay refuses a unit with NaN/Inf naming capture, sample, layer and head; --skip-nonfinite skips it") {
  auto dir = test::temp_dir("cli_replay_nan");
  auto cap = small_capture(dir);
  {
    H5::H5File f(cap, H5F_ACC_RDWR);
    auto ds = f.openDataSet("/sample_0001/layer_01/v");
    std::vector<float> v(2 * 200 * 16);
    ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
    v[(1 * 200 + 17) * 16 + 3] = std::numeric_limits<float>::quiet_NaN();  // KV head 1, position 17
    ds.write(v.data(), H5::PredType::NATIVE_FLOAT);
  }
  const std::string common = "replay" + kWindows + " --quiet --capture " + cap + " --method exact,uniform --ratio 0.5";
  // Units before it were measured (the header line, then the error as the last line).
  auto fail = run_kvlab(common + " --out " + dir + "/fail");
  INFO(fail.out);
  CHECK(fail.code != 0);
  const std::string last = fail.out.substr(fail.out.rfind('\n', fail.out.size() - 2) + 1);
  CHECK(last == "error: capture '" + cap + "': sample 1 ('synthetic_1'), layer 1: 1 non-finite value in q/k/v; the "
                "first is v = nan at KV head 1, position 17 (dim 3); --skip-nonfinite skips such units and lists them "
                "in result.json\n");
  CHECK(read_json_file(dir + "/fail/result.json")["complete"] == false);

  auto r = run_kvlab(common + " --skip-nonfinite --out " + dir + "/skip");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("skipped sample 1 layer 1") != std::string::npos);
  auto j = read_json_file(dir + "/skip/result.json");
  CHECK(j["complete"] == true);
  REQUIRE(j["skipped_nonfinite"]["count"] == 1);
  CHECK(j["skipped_nonfinite"]["units"][0]["sample"] == 1);
  CHECK(j["skipped_nonfinite"]["units"][0]["layer"] == 1);
  CHECK(j["skipped_nonfinite"]["units"][0]["first"] == "v = nan at KV head 1, position 17 (dim 3)");
  // 3 finite units x 2 heads x 2 methods, none from the skipped unit; every number finite.
  CHECK(j["rows"].size() == 12);
  for (const auto& row : j["rows"]) {
    CHECK_FALSE((row["sample"] == 1 && row["layer"] == 1));
    CHECK(std::isfinite(row["rel_err"].get<double>()));
  }
  for (const auto& a : j["aggregate"]["overall"]) CHECK(std::isfinite(a["rel_err"].get<double>()));
  // Sharded: the shard holding the unit lists it, and merge joins the lists.
  for (std::string i : {"0", "1"}) {
    auto sh = run_kvlab(common + " --skip-nonfinite --shard " + i + "/2 --out " + dir + "/s" + i);
    REQUIRE_MESSAGE(sh.code == 0, sh.out);
  }
  CHECK(read_json_file(dir + "/s0/result.json")["skipped_nonfinite"]["count"] == 0);
  auto m = run_kvlab("merge " + dir + "/s0 " + dir + "/s1 --out " + dir + "/merged");
  REQUIRE_MESSAGE(m.code == 0, m.out);
  auto merged = read_json_file(dir + "/merged/result.json");
  CHECK(merged["rows"].size() == 12);
  CHECK(merged["skipped_nonfinite"] == j["skipped_nonfinite"]);
}

namespace {

// Writes a run file with one synth step into `out` (tiny sizes) and returns the run file's path.
std::string synth_run_file(const std::string& dir, const std::string& out) {
  nlohmann::json config = {{"out", out}, {"kind", "random"}, {"tokens", 64}, {"queries", 16}, {"layers", 1},
                           {"q_heads", 2}, {"kv_heads", 1},  {"head_dim", 8}, {"seed", 0}};
  nlohmann::json spec = {{"name", "digest"}, {"steps", {{{"command", "synth"}, {"config", config}}}}};
  const std::string path = dir + "/run.json";
  std::ofstream(path) << spec.dump(2);
  return path;
}

std::string sha256sum(const std::string& path) {
  std::string out;
  REQUIRE(test::run_command("sha256sum '" + path + "'", &out) == 0);
  return out.substr(0, 64);
}

// Processes whose command line mentions `needle`.
int processes_mentioning(const std::string& needle) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = test::read_file(e.path().string() + "/cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    n += cmdline.find(needle) != std::string::npos && cmdline.find("sh -c") == std::string::npos;
  }
  return n;
}

// A `kvlab run` of one dump step long enough to be interrupted (4000 prompts, about 30 s on 2
// cores) under TMPDIR=dir/tmp: writes dir/prompts.jsonl and dir/run.json and returns the start of a
// shell script that launches it in the background (its pid in $pid, its output in dir/log) and
// waits until the capture is being written, plus 0.3 s; the caller appends how it stops it.
std::string long_dump_run_script(const std::string& dir, const std::string& model, const std::string& name) {
  fs::create_directories(dir + "/tmp");
  {
    std::ofstream data(dir + "/prompts.jsonl");
    for (int i = 0; i < 4000; ++i)
      data << nlohmann::json{{"prompt", "Once upon a time, there was a little girl named Lily. She loved to play "
                                        "outside in the park with her friends. " + std::to_string(i)}}.dump() << "\n";
  }
  nlohmann::json config = {{"model", model}, {"dataset", dir + "/prompts.jsonl"}, {"out", dir + "/c.h5"}};
  nlohmann::json spec = {{"name", name}, {"steps", {{{"command", "dump"}, {"config", config}}}}};
  std::ofstream(dir + "/run.json") << spec.dump();
  return "TMPDIR='" + dir + "/tmp' '" + test::kvlab_bin() + "' --threads 1 run '" + dir + "/run.json' > '" + dir +
         "/log' 2>&1 & pid=$!; for i in $(seq 1 1200); do [ -e '" + dir + "/c.h5.partial' ] && break; sleep 0.05; done; "
         "sleep 0.3; ";
}

}  // namespace

TEST_CASE("cli: run skips a capture step only when the capture has the digest in its sidecar") {
  auto dir = test::temp_dir("cli_run_digest");
  const std::string cap = dir + "/c.h5", side = cap + ".config.json";
  const std::string run_file = synth_run_file(dir, cap);
  auto r = run_kvlab("run " + run_file);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(read_json_file(side)["capture_sha256"] == sha256sum(cap));
  fs::copy_file(cap, dir + "/original.h5");
  r = run_kvlab("run " + run_file);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("exists with the same config") != std::string::npos, r.out);

  SUBCASE("a truncated capture is made again") {
    fs::resize_file(cap, fs::file_size(cap) * 2 / 3);
    r = run_kvlab("run " + run_file);
    REQUIRE_MESSAGE(r.code == 0, r.out);
    CHECK_MESSAGE(r.out.find(cap + " is not a complete capture") != std::string::npos, r.out);
    CHECK(r.out.find("running it again") != std::string::npos);
    CHECK(r.out.find("skipped") == std::string::npos);
  }
  SUBCASE("a capture replaced by another is made again") {
    auto s = run_kvlab("synth --out " + cap + " --overwrite --kind random --tokens 64 --queries 16 --layers 1 "
                       "--q-heads 2 --kv-heads 1 --head-dim 8 --seed 1");
    REQUIRE_MESSAGE(s.code == 0, s.out);
    r = run_kvlab("run " + run_file);
    REQUIRE_MESSAGE(r.code == 0, r.out);
    CHECK_MESSAGE(r.out.find(cap + " is not the capture this config made") != std::string::npos, r.out);
    CHECK(r.out.find("skipped") == std::string::npos);
  }
  // Either way the capture is the config's again (seed 0), and the sidecar holds its digest.
  CHECK(read_json_file(side)["capture_sha256"] == sha256sum(cap));
  CaptureReader now(cap), orig(dir + "/original.h5");
  CHECK(at::equal(now.read_layer(0, 0).k, orig.read_layer(0, 0).k));
}

TEST_CASE("cli: SIGTERM to kvlab run reaches its running step; no child or /tmp/kvlab-run-* folder is left") {
  auto model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) {
    MESSAGE("stories260K not found under " << model << ": skipped");
    return;
  }
  auto dir = test::temp_dir("cli_run_signal");
  const std::string script = long_dump_run_script(dir, model, "sig") + "kill -TERM $pid; wait $pid; echo \"rc=$?\"";
  std::string out;
  test::run_command(script, &out);
  const std::string log = test::read_file(dir + "/log");
  INFO("script: " << out << "\nlog: " << log);
  CHECK(out.find("rc=0") == std::string::npos);
  CHECK(log.find("error: interrupted by SIGTERM during steps[0] (dump)") != std::string::npos);
  CHECK(processes_mentioning(dir + "/tmp/kvlab-run-") == 0);  // the dump child has exited
  CHECK(fs::is_empty(dir + "/tmp"));                           // its config folder is gone
  CHECK_FALSE(fs::exists(dir + "/c.h5"));
  CHECK_FALSE(fs::exists(dir + "/c.h5.config.json"));
}

TEST_CASE("cli: dump --generate captures the prompt and N greedy tokens; clusterability --last N reads them") {
  auto model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) {
    MESSAGE("stories260K not found under " << model << ": skipped");
    return;
  }
  auto dir = test::temp_dir("cli_dump_generate");
  const std::string prompt = " --prompt 'Once upon a time, there was a little girl named Lily.'";
  auto d = run_kvlab("dump --model " + model + prompt + " --generate 40 --queries last:40 --out " + dir + "/g.h5");
  REQUIRE_MESSAGE(d.code == 0, d.out);
  // The generate command's greedy ids (EOS ignored) are the capture's tokens.
  auto g = run_kvlab("generate --model " + model + prompt + " --max-new-tokens 40 --ignore-eos --json");
  REQUIRE_MESSAGE(g.code == 0, g.out);
  const auto gj = nlohmann::json::parse(g.out.substr(g.out.find('{')));
  CaptureReader cap(dir + "/g.h5");
  const at::Tensor tokens = cap.tokens(0);
  const std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
  CHECK(ids == gj["ids"].get<std::vector<int64_t>>());
  CHECK(gj["generated_ids"].size() == 40);
  auto c = run_kvlab("clusterability --capture " + dir + "/g.h5 --last 40 --k-max 4 --silhouette-k 2 --out " + dir +
                     "/cl");
  REQUIRE_MESSAGE(c.code == 0, c.out);
  int64_t scored = 0;
  const auto cl = read_json_file(dir + "/cl/result.json");
  for (const auto& row : cl["rows"])
    if (row.contains("n_points")) {
      CHECK(row["n_points"].get<int64_t>() == 40);
      ++scored;
    }
  CHECK(scored > 0);
  check_one_error(run_kvlab("clusterability --capture " + dir + "/g.h5 --last 100000 --out " + dir + "/cl2"),
                  "--last must be in [0, ");
}

TEST_CASE("cli: an interrupted replay of a stories260K capture resumes from its checkpoint (rows inline or in rows.jsonl); rows as uninterrupted") {
  auto model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) {
    MESSAGE("stories260K not found under " << model << ": skipped");
    return;
  }
  auto dir = test::temp_dir("cli_resume");
  auto d = run_kvlab("dump --model " + model + " --prompt 'Once upon a time, there was a little girl named Lily. She "
                     "loved to play outside in the park with her friends. One day, she saw a big red ball.' "
                     "--queries last:32 --out " + dir + "/a.h5");
  REQUIRE_MESSAGE(d.code == 0, d.out);
  fs::copy_file(dir + "/a.h5", dir + "/b.h5");
  const std::string common = "replay" + kWindows + " --quiet --method exact,uniform,h2o --ratio 0.5 --seeds 2";
  auto full = run_kvlab(common + " --capture " + dir + "/a.h5 --out " + dir + "/full");
  REQUIRE_MESSAGE(full.code == 0, full.out);

  // Interrupt the run on b.h5 at its third unit (layer 2): a NaN there stops it after the
  // checkpoint of layers 0 and 1.
  auto poke = [&](float value) {
    H5::H5File f(dir + "/b.h5", H5F_ACC_RDWR);
    auto ds = f.openDataSet("/sample_0000/layer_02/v");
    hsize_t dims[3];
    ds.getSpace().getSimpleExtentDims(dims);
    std::vector<float> v(dims[0] * dims[1] * dims[2]);
    ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
    const float old = v[5];
    v[5] = value;
    ds.write(v.data(), H5::PredType::NATIVE_FLOAT);
    return old;
  };
  const auto a = read_json_file(dir + "/full/result.json");
  // Both layouts of the checkpoint: rows inline in result.json, and rows.jsonl beside it.
  for (const std::string rows_out : {"inline", "jsonl"}) {
    CAPTURE(rows_out);
    const std::string out = dir + "/resumed_" + rows_out;
    const float kept = poke(std::numeric_limits<float>::quiet_NaN());
    const std::string resumed_cmd = common + " --rows-out " + rows_out + " --capture " + dir + "/b.h5 --out " + out;
    auto first = run_kvlab(resumed_cmd);
    REQUIRE(first.code != 0);
    auto partial = read_json_file(out + "/result.json");
    CHECK(partial["complete"] == false);
    CHECK(partial.contains("rows_file") == (rows_out == "jsonl"));
    std::set<int> layers_done;
    for (const auto& row : read_result_rows(out + "/result.json")) layers_done.insert(row["layer"].get<int>());
    CHECK(layers_done == std::set<int>{0, 1});

    poke(kept);
    auto second = run_kvlab(resumed_cmd);
    REQUIRE_MESSAGE(second.code == 0, second.out);
    CHECK_MESSAGE(second.out.find("resuming " + out + ": 2 of 5 units already measured") != std::string::npos,
                  second.out);
    const auto b = read_json_file(out + "/result.json");
    CHECK(b["complete"] == true);
    const auto& rows_a = a["rows"];
    const auto rows_b = read_result_rows(b, out + "/result.json");
    // scripts/compare_rows.py: rows equal as JSON except the timing field.
    REQUIRE(rows_a.size() == rows_b.size());
    CHECK(rows_a.size() == 5 * 4 * 2 * 3);  // 5 layers x 4 KV heads x 2 seeds x 3 methods
    for (size_t i = 0; i < rows_a.size(); ++i) {
      auto ra = rows_a[i], rb = rows_b[i];
      ra.erase("compress_ms");
      rb.erase("compress_ms");
      CHECK_MESSAGE(ra == rb, "row " << i << ": " << ra.dump() << " vs " << rb.dump());
    }
    for (size_t i = 0; i < a["aggregate"]["overall"].size(); ++i)
      CHECK(a["aggregate"]["overall"][i]["rel_err"] == b["aggregate"]["overall"][i]["rel_err"]);
  }
}

TEST_CASE("cli: generate --logits-out and calibrate --out never replace a file without --overwrite") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) {
    MESSAGE("skipped: stories260K not found (set KVLAB_SHARED)");
    return;
  }
  auto dir = test::temp_dir("kvlab_cli_outputs");
  const std::string mine = dir + "/mine.json";
  std::ofstream(mine) << "{\"keep\": true}\n";
  check_one_error(run_kvlab("generate --model " + model + " --prompt-ids 1,2,3 --max-new-tokens 2 --logits-out " + mine),
                  "--logits-out " + mine + ": exists");
  check_one_error(run_kvlab("calibrate chelsea --model " + model + " --text " + test::shared_dir() +
                            "/data/wikitext2/wiki.test.raw --out " + mine),
                  "--out " + mine + ": exists");
  CHECK(read_json_file(mine)["keep"] == true);  // untouched
  auto r = run_kvlab("generate --model " + model + " --prompt-ids 1,2,3 --max-new-tokens 2 --overwrite --logits-out " +
                     mine);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(read_json_file(mine)["logits"].size() == 2);
}

TEST_CASE("cli: replay --kept-out writes what each unit kept, matching its rows") {
  const std::string dir = test::temp_dir("kvlab_cli_kept");
  const std::string cap = small_capture(dir);
  auto r = run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method snapkv,chelsea --ratio 0.5 " +
                     "--keep-first 4 --kept-out --out " + dir + "/rep");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const auto rows = read_json_file(dir + "/rep/result.json")["rows"];
  const auto lines = read_json_lines(dir + "/rep/kept.jsonl");
  CHECK(lines.size() == 2 * 2 * 2);  // samples x layers x methods
  for (const auto& l : lines) {
    INFO(l["method"], " sample ", l["sample"], " layer ", l["layer"]);
    REQUIRE(l["kv_heads"].size() == 2);
    for (size_t h = 0; h < 2; ++h) {
      const auto pos = l["kv_heads"][h]["positions"].get<std::vector<int64_t>>();
      for (int64_t p = 0; p < 4; ++p) CHECK(pos.at(p) == p);         // --keep-first, exact
      for (int64_t p = 184; p < 200; ++p) CHECK(std::count(pos.begin(), pos.end(), p) == 1);  // the evaluation tail
      // Its row's kept entries: the region's live entries.
      for (const auto& row : rows)
        if (row["method"] == l["method"] && row["sample"] == l["sample"] && row["layer"] == l["layer"] &&
            row["head"].get<size_t>() == h)
          CHECK(double(pos.size()) == row["kept_entries"].get<double>() + 4 + 16);
      if (l["method"] == "chelsea") CHECK(std::count(pos.begin(), pos.end(), -1) > 0);  // merged entries
    }
  }
}

TEST_CASE("cli: token counts that overflow int64 or pass the context are one-line errors (issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!std::filesystem::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_bounds");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --method h2o --ratio 0.5 --quiet --out " + dir + "/n";
  // Before: the haystack grew until the OOM killer (22.7 GB resident).
  check_one_error(run_kvlab(niah + " --lengths 9223372036854775807 --depths 50"), "--lengths");
  // Before: decoding ran past the model's 512 positions until killed.
  check_one_error(run_kvlab(niah + " --lengths 300 --depths 50 --max-new-tokens 9223372036854775807"), "context of 512");
  check_one_error(run_kvlab("generate --model " + model + " --prompt-ids 1,2,3 --max-new-tokens 9223372036854775807"),
                  "--max-new-tokens");
  // The question and the template count: a long question no longer runs an 804-token prompt.
  check_one_error(run_kvlab(niah + " --lengths 400 --depths 50 --question '" + std::string(2000, 'a') + "'"),
                  "with the question and the chat template");
  // Duplicate cells wrote one prediction and counted two.
  check_one_error(run_kvlab(niah + " --lengths 300 --depths 50,50"), "--depths: 50 is listed twice");
}

TEST_CASE("cli: kvzip runs in a task command and in generate, its second prefill timed (issue 22)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_kvzip");
  for (const std::string protocol : {"whole", "context"}) {
    INFO("protocol " << protocol);
    auto r = run_kvlab("niah --model " + model + " --haystack-dir " + test::shared_dir() +
                       "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --method exact,kvzip --ratio 0.5 "
                       "--max-new-tokens 4 --quiet --protocol " + protocol + " --out " + dir + "/" + protocol);
    REQUIRE_MESSAGE(r.code == 0, r.out);
    std::ifstream in(dir + "/" + protocol + "/pred/kvzip_ratio0.5/niah.jsonl");
    std::string line;
    REQUIRE(std::getline(in, line));
    const auto j = nlohmann::json::parse(line);
    CHECK(j["reconstruction_seconds"].get<double>() > 0);
    CHECK(j["seconds"].get<double>() >= j["reconstruction_seconds"].get<double>());
    // The second prefill is counted once: not again inside compress_seconds, where the branch that
    // made it had it too (compress_seconds >= reconstruction_seconds before).
    CHECK(j["compress_seconds"].get<double>() < j["reconstruction_seconds"].get<double>());
    CHECK(j["entries_start"].get<double>() < 0.6 * j["prompt_tokens"].get<double>());
  }
  auto g = run_kvlab("generate --model " + model + " --prompt 'Once upon a time there was a little girl named Lily. "
                     "She liked to play outside with her dog.' --method kvzip,adakv:kvzip --ratio 0.5 "
                     "--max-new-tokens 4 --json");
  REQUIRE_MESSAGE(g.code == 0, g.out);
  const auto at = g.out.find("{\n  \"");  // the JSON object on stdout (stderr's lines are "[generate] ...")
  REQUIRE(at != std::string::npos);
  const auto end = g.out.find("\n}", at);
  const auto branches = nlohmann::json::parse(g.out.substr(at, end + 2 - at))["branches"];
  REQUIRE(branches.size() == 2);
  for (const auto& b : branches) CHECK(b["reconstruction_seconds"].get<double>() > 0);
}

TEST_CASE("cli: a method whose threshold sets its memory runs once whatever the budgets (simlayerkv, issue 53)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_own_memory");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --max-new-tokens 4 --quiet ";
  // Threshold 0: every layer is lazy and keeps its 4 first and 15 last positions.
  auto r = run_kvlab(niah + "--method snapkv,simlayerkv --ratio 0.5,0.25 --param simlayerkv.lazy_threshold=0 "
                     "--param simlayerkv.n_recent=16 --out " + dir + "/niah");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::set<std::string> folders;
  for (const auto& e : fs::directory_iterator(dir + "/niah/pred")) folders.insert(e.path().filename().string());
  CHECK(folders == std::set<std::string>{"exact", "snapkv_ratio0.5", "snapkv_ratio0.25", "simlayerkv"});
  std::ifstream in(dir + "/niah/pred/simlayerkv/niah.jsonl");
  std::string text;
  REQUIRE(std::getline(in, text));
  CHECK(nlohmann::json::parse(text)["entries_start"].get<double>() == doctest::Approx(19.0));
  const auto rows = nlohmann::json::parse(test::read_file(dir + "/niah/result.json"))["rows"];
  int own = 0;
  for (const auto& row : rows)
    if (row["method"] == "simlayerkv") own += row["setting"] == "own";
  CHECK(own >= 1);
  // It has no budget to compress to again while decoding.
  auto d = run_kvlab(niah + "--method simlayerkv --ratio 0.5 --decode-rule compress:32 --out " + dir + "/decode");
  CHECK(d.code != 0);
  CHECK(d.out.find("simlayerkv keeps what its own threshold decides") != std::string::npos);
}

TEST_CASE("cli: think holds snapkv's entries in fewer bytes; finch's window is the question; what they cannot do yet is "
          "refused before the model loads (issue 53)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_think_finch");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --max-new-tokens 4 --quiet ";
  auto r = run_kvlab(niah + "--method snapkv,think,finch --ratio 0.5 --protocol whole --out " + dir + "/niah");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::map<std::string, nlohmann::json> by;
  const auto result = nlohmann::json::parse(test::read_file(dir + "/niah/result.json"));  // named: rows of a temporary dangle
  for (const auto& row : result["rows"])
    by[row["method"].get<std::string>()] = row;
  REQUIRE(by.count("snapkv"));
  REQUIRE(by.count("think"));
  REQUIRE(by.count("finch"));
  // think wraps snapkv at its defaults: the same entries, half of each key's channels not stored.
  CHECK(by["think"]["entries_start"].get<double>() == doctest::Approx(by["snapkv"]["entries_start"].get<double>()));
  CHECK(by["think"]["bytes_mean"].get<double>() < 0.8 * by["snapkv"]["bytes_mean"].get<double>());
  CHECK(by["think"]["bytes_mean"].get<double>() > 0.7 * by["snapkv"]["bytes_mean"].get<double>());
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--method think --bytes 0.5", "--method think with --bytes"},
           {"--method think --ratio 0.5 --decode-rule compress:32", "--method think with --decode-rule compress"},
           {"--method think+kivi2 --ratio 0.5", "--method think+kivi2 with a quantizer"},
           {"--method finch --ratio 0.5 --protocol context", "--param finch.window=N"}}) {
    INFO(flags);
    auto e = run_kvlab(niah + flags + " --out " + dir + "/refused");
    CHECK(e.code != 0);
    CHECK(e.out.find(says) != std::string::npos);
    CHECK(!fs::exists(dir + "/refused/result.json"));
  }
  // --method all leaves them out there instead (finch: replay prefills no question).
  auto syn = run_kvlab("synth --out " + dir + "/syn.h5 --kind random --tokens 300 --queries 64 --layers 1 --q-heads 4 "
                       "--kv-heads 2 --head-dim 16 --samples 1");
  REQUIRE_MESSAGE(syn.code == 0, syn.out);
  auto all = run_kvlab("replay --quiet --capture " + dir + "/syn.h5 --method all --bytes 0.5 --eval-queries last:32 "
                       "--obs-queries 32 --out " + dir + "/all");
  REQUIRE_MESSAGE(all.code == 0, all.out);
  const auto rows = nlohmann::json::parse(test::read_file(dir + "/all/result.json"))["rows"];
  std::set<std::string> ran;
  for (const auto& row : rows) ran.insert(row["method"].get<std::string>());
  CHECK(ran.count("snapkv") == 1);
  CHECK(ran.count("think") == 0);
  CHECK(ran.count("finch") == 0);
}

TEST_CASE("cli: quantized branches by name in a task command and replay (issue 52)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_quant");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --max-new-tokens 4 --quiet --ratio 0.5 ";
  auto r = run_kvlab(niah + "--method snapkv,snapkv+kivi2.r16.g8,kivi2.r16.g8 --out " + dir + "/niah");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::map<std::string, nlohmann::json> line;  // branch folder -> its prediction
  for (const std::string b : {"exact", "snapkv_ratio0.5", "snapkv+kivi2.r16.g8_ratio0.5", "kivi2.r16.g8"}) {
    std::ifstream in(dir + "/niah/pred/" + b + "/niah.jsonl");
    std::string text;
    REQUIRE_MESSAGE(std::getline(in, text), b);
    line[b] = nlohmann::json::parse(text);
  }
  // Same entries, fewer bytes; the full cache quantized keeps every entry.
  CHECK(line["snapkv+kivi2.r16.g8_ratio0.5"]["entries_start"] == line["snapkv_ratio0.5"]["entries_start"]);
  CHECK(line["snapkv+kivi2.r16.g8_ratio0.5"]["bytes_peak"].get<double>() < line["snapkv_ratio0.5"]["bytes_peak"].get<double>());
  CHECK(line["kivi2.r16.g8"]["entries_start"] == line["exact"]["entries_start"]);
  CHECK(line["kivi2.r16.g8"]["bytes_peak"].get<double>() < 0.6 * line["exact"]["bytes_peak"].get<double>());
  const auto rows = nlohmann::json::parse(test::read_file(dir + "/niah/result.json"))["rows"];
  std::set<std::string> quantized;
  for (const auto& row : rows)
    if (row.contains("kv_quant")) quantized.insert(row["method"].get<std::string>() + "|" + row["kv_quant"].get<std::string>());
  CHECK(quantized == std::set<std::string>{"snapkv+kivi2.r16.g8|kivi2.r16.g8", "kivi2.r16.g8|kivi2.r16.g8"});

  // A streaming method is not stored quantized yet: refused before the model loads, naming the fix.
  auto s = run_kvlab(niah + "--method h2o+int4 --decode-rule stream --out " + dir + "/stream");
  CHECK(s.code != 0);
  CHECK(s.out.find("--method h2o+int4") != std::string::npos);
  CHECK(s.out.find("--decode-rule prefill") != std::string::npos);
  auto bad = run_kvlab(niah + "--method snapkv+kivi3 --out " + dir + "/bad");
  CHECK(bad.code != 0);
  CHECK(bad.out.find("'kivi3': KIVI quantizes to 2 or 4 bits") != std::string::npos);

  // --decode-rule rerotate: the rows say so; a stream that cannot move its keys is refused.
  auto rr = run_kvlab(niah + "--method streaming_llm,h2o --decode-rule rerotate --out " + dir + "/rerotate");
  REQUIRE_MESSAGE(rr.code == 0, rr.out);
  const auto rerotated = nlohmann::json::parse(test::read_file(dir + "/rerotate/result.json"));
  REQUIRE(rerotated["rows"].size() >= 3);
  for (const auto& row : rerotated["rows"]) CHECK(row["decode_rule"] == "rerotate");
  auto tova = run_kvlab(niah + "--method tova --decode-rule rerotate --out " + dir + "/tova");
  CHECK(tova.code != 0);
  CHECK(tova.out.find("tova keeps copies of its keys") != std::string::npos);

  // --decode-rule compress:N (issue 53): every method, streaming ones too, holds the same entries
  // at every step; a method whose held set is not tokens is refused naming it, before the model loads.
  auto dc = run_kvlab(niah + "--method knorm,h2o,streaming_llm --decode-rule compress:2 --out " + dir + "/compress");
  REQUIRE_MESSAGE(dc.code == 0, dc.out);
  const auto compressed = nlohmann::json::parse(test::read_file(dir + "/compress/result.json"));
  std::set<double> peaks;
  for (const auto& row : compressed["rows"]) {
    CHECK(row["decode_rule"] == "compress:2");
    if (row["method"] != "exact") peaks.insert(row["entries_peak"].get<double>());
  }
  CHECK(peaks.size() == 1);
  // snapkv scores with its last 32 queries; a compression every 2 tokens sees 2: refused, not starved.
  auto sk = run_kvlab(niah + "--method snapkv --decode-rule compress:2 --out " + dir + "/sk");
  CHECK(sk.code != 0);
  CHECK(sk.out.find("--decode-rule compress:2: snapkv scores with its last") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir + "/sk"));
  auto ea = run_kvlab(niah + "--method expected_attention --decode-rule compress --out " + dir + "/ea");
  CHECK(ea.code != 0);
  CHECK(ea.out.find("--decode-rule compress: expected_attention un-rotates its keys") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir + "/ea"));
}

TEST_CASE("cli: commands refuse to write over files they did not make (issue 26)") {
  const std::string dir = test::temp_dir("kvlab_cli_owned");
  const std::string cap = small_capture(dir);
  // bench compress --out its own capture: the capture became the JSON report (rc 0).
  check_one_error(run_kvlab("bench compress --capture " + cap + " --method uniform --sizes 64 --out " + cap),
                  "an input of this command");
  CHECK(std::filesystem::file_size(cap) > 1000);
  // A folder holding a user's own files and no config.json.
  std::filesystem::create_directories(dir + "/mine");
  { std::ofstream(dir + "/mine/result.json") << "{\"mine\": true}\n"; }
  check_one_error(run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method uniform --ratio 0.5 --out " +
                            dir + "/mine"),
                  "holds files kvlab did not make");
  CHECK(test::read_file(dir + "/mine/result.json") == "{\"mine\": true}\n");
  // A file where a folder should be.
  check_one_error(run_kvlab("replay" + kWindows + " --quiet --capture " + cap + " --method uniform --ratio 0.5 --out " +
                            cap),
                  "not a folder");
}

TEST_CASE("cli: generate --method prints each branch's text as the plain run prints it (issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!std::filesystem::exists(model + "/model.safetensors")) return;
  // Before: "Shewasveryhappy…" (each SentencePiece token decoded alone loses its leading space).
  const std::string common = "generate --model " + model + " --prompt 'Once upon a time' --max-new-tokens 24";
  std::string plain, branch;
  REQUIRE(test::run_command(test::kvlab_bin() + " " + common + " 2>/dev/null", &plain) == 0);
  REQUIRE(test::run_command(test::kvlab_bin() + " " + common + " --method exact --ratio 1 2>/dev/null", &branch) == 0);
  // The plain run: its text on the line before "ids: ..."; the branch: after "=== exact ratio=1".
  const auto ids = plain.find("\nids: ");
  REQUIRE(ids != std::string::npos);
  const std::string text = plain.substr(plain.rfind('\n', ids - 1) + 1, ids - plain.rfind('\n', ids - 1) - 1);
  const auto head = branch.find("=== exact ratio=1\n");
  REQUIRE(head != std::string::npos);
  const auto at = head + std::string("=== exact ratio=1\n").size();
  const std::string branch_text = branch.substr(at, branch.find("\nids:", at) - at);
  CHECK(text.find(' ') != std::string::npos);
  CHECK(text.size() > 20);
  CHECK(branch_text == text);
}

TEST_CASE("cli: ppl's default --max-tokens fits a 512-position model (issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!std::filesystem::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_ppl_default");
  auto r = run_kvlab("ppl --quiet --model " + model + " --text " + test::shared_dir() +
                     "/data/wikitext2/wiki.test.raw --method local --cache-size 64 --out " + dir + "/p");
  REQUIRE_MESSAGE(r.code == 0, r.out);  // before: "--max-tokens 1024 exceeds ... context of 512"
  check_one_error(run_kvlab("ppl --quiet --model " + model + " --text " + test::shared_dir() +
                            "/data/wikitext2/wiki.test.raw --method local --cache-size 64 --max-tokens 600 --out " +
                            dir + "/q"),
                  "exceeds");
}

TEST_CASE("cli: a run folder in use is refused; a lock left by a dead run is taken over (issue 26)") {
  const std::string dir = test::temp_dir("kvlab_cli_lock");
  const std::string cap = small_capture(dir);
  const std::string replay = "replay" + kWindows + " --quiet --capture " + cap + " --method uniform --ratio 0.5 --out " +
                             dir + "/r";
  auto r = run_kvlab(replay);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(test::read_file(dir + "/r/.kvlab.lock").empty());  // a finished run leaves no pid
  // Another run holds the folder (here: this test, as pid 4242 says).
  const int fd = ::open((dir + "/r/.kvlab.lock").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, "4242\n", 5, 0) == 5);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  check_one_error(run_kvlab(replay), "another kvlab run (pid 4242) is writing there");  // before: both ran, rc 0
  ::close(fd);  // the holder dies: the kernel drops its lock, its pid stays in the file
  r = run_kvlab(replay);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("the run of pid 4242 that wrote there did not finish (killed?); taking over") !=
                    std::string::npos, r.out);
}

TEST_CASE("cli: kvlab run killed with -9 leaves no step running (issue 26)") {
  auto model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  auto dir = test::temp_dir("cli_run_kill9");
  // Before: the dump step went on writing after its parent was killed.
  const std::string script = long_dump_run_script(dir, model, "kill9") +
                             "kill -KILL $pid; wait $pid; for i in $(seq 1 100); do pgrep -f '" + dir +
                             "/tmp/kvlab-run-' > /dev/null || break; sleep 0.05; done; echo done";
  std::string out;
  test::run_command(script, &out);
  INFO("script: " << out << "\nlog: " << test::read_file(dir + "/log"));
  CHECK(processes_mentioning(dir + "/tmp/kvlab-run-") == 0);
}

TEST_CASE("cli: resume redoes predictions made from other settings or records; duplicate ids are refused (issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_resume_key");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --method h2o --ratio 0.5 --quiet --out " +
                           dir + "/n";
  auto generated = [&] {
    std::vector<int64_t> n;
    for (const auto& e : fs::recursive_directory_iterator(dir + "/n/pred"))
      if (e.path().extension() == ".jsonl") {
        std::ifstream f(e.path());
        for (std::string line; std::getline(f, line);)
          if (!line.empty()) n.push_back(nlohmann::json::parse(line)["generated_tokens"].get<int64_t>());
      }
    return n;
  };
  auto r = run_kvlab(niah + " --max-new-tokens 8");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  for (int64_t g : generated()) CHECK(g > 4);
  // Before: --overwrite with another --max-new-tokens kept the 8-token predictions.
  r = run_kvlab(niah + " --max-new-tokens 4 --overwrite");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("made from another record, setting or model; running them again") != std::string::npos, r.out);
  const auto now = generated();
  CHECK(now.size() == 2);  // exact and h2o, one line each
  for (int64_t g : now) CHECK(g <= 4);
  // Predictions of another model (its model_key differs) are redone; lines from before model_key
  // existed are reused. Before, the model was in neither key.
  auto rewrite_keys = [&](const std::function<void(nlohmann::json&)>& edit) {
    for (const auto& e : fs::recursive_directory_iterator(dir + "/n/pred"))
      if (e.path().extension() == ".jsonl") {
        std::vector<nlohmann::json> lines;
        {
          std::ifstream f(e.path());
          for (std::string line; std::getline(f, line);)
            if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
        }
        std::ofstream f(e.path(), std::ios::trunc);
        for (auto& l : lines) {
          edit(l);
          f << l.dump() << "\n";
        }
      }
  };
  rewrite_keys([](nlohmann::json& l) {
    CHECK(l.contains("model_key"));  // (its value names the model path as given: no golden here)
    l.erase("model_key");
  });
  r = run_kvlab(niah + " --max-new-tokens 4 --overwrite");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("running them again") == std::string::npos, r.out);
  rewrite_keys([](nlohmann::json& l) { l["model_key"] = "0123456789abcdef"; });
  r = run_kvlab(niah + " --max-new-tokens 4 --overwrite");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("made from another record, setting or model; running them again") != std::string::npos, r.out);

  // Two LongBench records with one _id: before, one prediction was written and two counted.
  fs::create_directories(dir + "/lb");
  fs::copy(test::shared_dir() + "/data/longbench/config", dir + "/lb/config");
  {
    std::ifstream in(test::shared_dir() + "/data/longbench/passage_retrieval_zh.jsonl");
    std::string a, b;
    std::getline(in, a);
    std::getline(in, b);
    auto jb = nlohmann::json::parse(b);
    jb["_id"] = nlohmann::json::parse(a)["_id"];
    std::ofstream(dir + "/lb/passage_retrieval_zh.jsonl") << a << "\n" << jb.dump() << "\n";
  }
  check_one_error(run_kvlab("longbench --quiet --model " + model + " --data-dir " + dir + "/lb --datasets "
                            "passage_retrieval_zh --samples 2 --method h2o --ratio 0.5 --out " + dir + "/l"),
                  "records 1 and 2 have the same id");
}

TEST_CASE("cli: a complete task run resumed to redo a record says incomplete before any prediction file changes") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_redo_mark");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300 --depths 50 --method h2o --ratio 0.5 "
                           "--max-new-tokens 4 --quiet --out " + dir + "/n";
  auto r = run_kvlab(niah);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const std::string exact = dir + "/n/pred/exact/niah.jsonl", h2o = dir + "/n/pred/h2o_ratio0.5/niah.jsonl";
  // Both lines made by "another model": the resume redoes the record, dropping them first.
  for (const std::string& f : {exact, h2o}) {
    std::vector<nlohmann::json> lines = read_json_lines(f);
    REQUIRE(lines.size() == 1);
    lines[0]["model_key"] = "0123456789abcdef";
    std::ofstream(f, std::ios::trunc) << lines[0].dump() << "\n";
  }
  // A kill while the files change, made deterministic: kvlab rewrites each file through
  // <file>.partial (write, rename); h2o's is a FIFO, so kvlab rewrites exact's file and then blocks
  // opening the FIFO until it is killed. Before: result.json still said complete over an exact file
  // without its line.
  REQUIRE(mkfifo((h2o + ".partial").c_str(), 0644) == 0);
  // Nothing in the script waits on the FIFO: the poll gives up after 20 s and kvlab is killed.
  const std::string script = test::kvlab_bin() + " --threads 1 " + niah + " > " + dir +
                             "/log 2>&1 & pid=$!; for i in $(seq 1 400); do [ -s " + exact +
                             " ] || break; sleep 0.05; done; sleep 0.2; kill -KILL $pid; wait $pid; echo done";
  std::string out;
  test::run_command(script, &out);
  INFO("script: " << out << "\nlog: " << test::read_file(dir + "/log"));
  CHECK(read_json_lines(exact).empty());  // the stale line dropped
  CHECK(read_json_file(dir + "/n/result.json")["complete"] == false);
  CHECK(read_json_lines(h2o).size() == 1);  // not rewritten yet
  // Resumed: the record is decoded again and the run is complete.
  fs::remove(h2o + ".partial");
  r = run_kvlab(niah);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(read_json_file(dir + "/n/result.json")["complete"] == true);
  for (const std::string& f : {exact, h2o}) {
    const auto lines = read_json_lines(f);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0]["model_key"] != "0123456789abcdef");
  }
}

TEST_CASE("cli: merge checks task shards' prediction files against their result.json first; NIAH merges draw the heat map "
          "(issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_merge_tasks");
  const std::string niah = "niah --model " + model + " --haystack-dir " + test::shared_dir() +
                           "/data/niah/PaulGrahamEssays --lengths 300,350 --depths 25,75 --method h2o --ratio 0.5 "
                           "--max-new-tokens 4 --quiet";
  for (int s = 0; s < 2; ++s) {
    auto r = run_kvlab(niah + " --shard " + std::to_string(s) + "/2 --out " + dir + "/s" + std::to_string(s));
    REQUIRE_MESSAGE(r.code == 0, r.out);
  }
  const std::string file = "/pred/h2o_ratio0.5/niah.jsonl";
  auto lines_of = [](const std::string& path) {
    std::vector<std::string> v;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  auto write_lines = [](const std::string& path, const std::vector<std::string>& v) {
    std::ofstream out(path, std::ios::trunc);
    for (const auto& l : v) out << l << "\n";
  };
  const auto original = lines_of(dir + "/s1" + file);
  REQUIRE(original.size() == 2);
  auto merge = [&](const std::string& out) { return run_kvlab("merge " + dir + "/s0 " + dir + "/s1 --out " + dir + "/" + out); };

  // Before: each of these merged with rc 0, wrong counts and records out of order.
  write_lines(dir + "/s1" + file, {original[0]});
  check_one_error(merge("m1"), "lacks record");
  write_lines(dir + "/s1" + file, {original[0], original[1], original[1]});
  check_one_error(merge("m2"), "repeats record");
  write_lines(dir + "/s1" + file, {original[0], original[1].substr(0, original[1].size() / 2)});
  check_one_error(merge("m3"), "is not JSON");
  fs::remove(dir + "/s1" + file);
  check_one_error(merge("m4"), "is missing");
  for (const char* m : {"m1", "m2", "m3", "m4"}) CHECK_FALSE(fs::exists(dir + "/" + m));  // nothing half-written

  write_lines(dir + "/s1" + file, original);
  auto r = merge("ok");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const std::string svg = test::read_file(dir + "/ok/heatmap.svg");  // before: no heat map
  CHECK(read_json_file(dir + "/ok/result.json")["context"]["protocol"]["protocol"] == "whole");  // before: absent
  CHECK(svg.find("data-branch=\"h2o_ratio0.5\"") != std::string::npos);
  CHECK(svg.find("data-length=\"300\"") != std::string::npos);
}

TEST_CASE("cli: flag errors from the parser are one 'error:' line with exit 2 (issue 26)") {
  // Before: CLI11's two lines without "error:", exits 104-114 by kind.
  for (const std::string args : {"replay --ratio abc", "--threads 0 replay", "generate --nonsense"}) {
    INFO("args: " << args);
    auto r = run_kvlab(args);
    check_one_error(r, "--help lists the flags");
    CHECK(r.code == 2);
  }
  auto r = run_kvlab("replay --ratio abc");
  CHECK(r.out.find("--ratio = abc") != std::string::npos);
}

TEST_CASE("cli: generate --prompt-file reads the prompt text from a file, as --prompt (issue 26)") {
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(model + "/model.safetensors")) return;
  const std::string dir = test::temp_dir("kvlab_cli_prompt_file");
  std::ofstream(dir + "/p.txt") << "Once upon a time";  // no newline: the file's bytes are the prompt
  auto from_file = run_kvlab("generate --model " + model + " --prompt-file " + dir + "/p.txt --max-new-tokens 8");
  auto inline_ = run_kvlab("generate --model " + model + " --prompt 'Once upon a time' --max-new-tokens 8");
  REQUIRE_MESSAGE(from_file.code == 0, from_file.out);
  REQUIRE_MESSAGE(inline_.code == 0, inline_.out);
  const auto ids = [](const std::string& out) { return out.substr(out.find("\nids: ")); };
  CHECK(ids(from_file.out).substr(0, 60) == ids(inline_.out).substr(0, 60));
  check_one_error(run_kvlab("generate --model " + model + " --prompt-file " + dir + "/p.txt --prompt x"),
                  "give exactly one of --prompt, --prompt-file and --prompt-ids");
  check_one_error(run_kvlab("generate --model " + model + " --prompt-file " + dir + "/none.txt"),
                  "--prompt-file " + dir + "/none.txt: not a readable file");
}

TEST_CASE("cli: non-finite and nonsensical numbers are one-line errors (issue 26)") {
  // Before: buzz-steady ran with T/w = inf (rc 0), bench attention divided by a 0-size matmul, tsne took -1 as auto.
  check_one_error(run_kvlab("buzz-steady --t-over-w 1.5,inf"), "--t-over-w must be a finite number, got inf");
  check_one_error(run_kvlab("bench attention --matmul-size 0"), "--matmul-size must be in [1, 16384], got 0");
  check_one_error(run_kvlab("tsne --capture x.h5 --learning-rate nan"), "--learning-rate must be a finite number");
  check_one_error(run_kvlab("tsne --capture x.h5 --learning-rate -1"), "--learning-rate must be > 0, or 0 for auto");
}

TEST_CASE("cli: bounds that reached LibTorch raw, ignored branch flags and empty silhouettes are one-line errors (issue 26)") {
  // Before: calibrate --n-recent -1 and bench attention --head-dim 0 printed LibTorch's own message
  // ("start (16) + length (49) exceeds dimension size", "max(): Expected reduction dim"); generate
  // without --method ran the exact cache ignoring --ratio; --keep-first -2 failed after the
  // prefill; clusterability --silhouette-k >= the points scored 0.000 (n singletons).
  check_one_error(run_kvlab("bench attention --head-dim 0"), "--head-dim must be in [1, 4096], got 0");
  check_one_error(run_kvlab("bench attention --kv-heads 0"), "--kv-heads must be in [1, 1024], got 0");
  const std::string model = test::shared_dir() + "/models/stories260K";
  if (fs::exists(model + "/model.safetensors")) {
    auto dir = test::temp_dir("kvlab_cli_bounds");
    check_one_error(run_kvlab("calibrate chelsea --model " + model + " --text " + test::shared_dir() +
                              "/data/wikitext2/wiki.test.raw --samples 1 --tokens 64 --n-recent -1 --out " + dir +
                              "/c.json"),
                    "--n-recent must be in [0, --tokens), got -1");
    CHECK_FALSE(fs::exists(dir + "/c.json"));
    for (const char* method : {"", " --method ''"})
      check_one_error(run_kvlab("generate --model " + model + " --prompt 'Once upon' --max-new-tokens 2 --ratio 0.5" +
                                method),
                      "--ratio applies to compressed-cache branches: give --method too");
    check_one_error(run_kvlab("generate --model " + model + " --prompt 'Once upon' --max-new-tokens 2 --keep-first 3"),
                    "--keep-first applies to compressed-cache branches");
    check_one_error(run_kvlab("generate --model " + model +
                              " --prompt 'Once upon' --max-new-tokens 2 --method h2o --ratio 0.5 --keep-first -2"),
                    "--keep-first and --keep-last must be >= 0, got -2 and 0");
  } else {
    MESSAGE("skipped the stories260K cases: not found (set KVLAB_SHARED)");
  }
  auto dir = test::temp_dir("kvlab_cli_silhouette");
  const std::string cap = small_capture(dir);  // 200 tokens per sample
  check_one_error(run_kvlab("clusterability --capture " + cap + " --silhouette-k 100000 --out " + dir + "/c"),
                  "--silhouette-k 100000 must be below the points scored per head (200 in sample 0");
  CHECK_FALSE(fs::exists(dir + "/c"));
}

TEST_CASE("cli: run --dry-run refuses what a step's command would refuse; files an earlier step makes are not required yet "
          "(issue 26)") {
  // Before: --dry-run checked each step with --print-config, which parsed the config but ran none of
  // the command's own checks: an unknown method, a bad --protocol or --max-new-tokens 0 passed the
  // dry run and failed only when the step ran, after the steps before it.
  auto dir = test::temp_dir("kvlab_cli_dry_run");
  const std::string model = test::shared_dir() + "/models/stories260K";
  auto dry_run = [&](const nlohmann::json& steps) {
    const std::string path = dir + "/run.json";
    std::ofstream(path) << nlohmann::json{{"name", "dry"}, {"steps", steps}}.dump(2);
    return run_kvlab("run " + path + " --dry-run");
  };
  auto step = [](const std::string& command, const nlohmann::json& config) {
    return nlohmann::json{{"command", command}, {"config", config}};
  };
  auto with = [](nlohmann::json config, const std::string& key, const nlohmann::json& value) {
    config[key] = value;
    return config;
  };
  const nlohmann::json synth = step("synth", {{"out", dir + "/c.h5"}, {"kind", "random"}, {"tokens", 64},
                                              {"queries", 16}, {"layers", 1}, {"q_heads", 2}, {"kv_heads", 1},
                                              {"head_dim", 8}});
  const nlohmann::json task = {{"model", model}, {"method", "h2o"}, {"ratio", {0.5}}, {"out", dir + "/t"}};
  const nlohmann::json replay = {{"capture", dir + "/c.h5"}, {"method", "h2o"}, {"ratio", {0.5}},
                                 {"out", dir + "/r"}};
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {step("longeval", with(task, "method", "h2o_typo")), "h2o_typo"},
      {step("longeval", with(task, "max_new_tokens", 0)), "--max-new-tokens must be >= 1, got 0"},
      {step("longeval", with(task, "protocol", "both")), "--protocol"},
      {step("niah", with(task, "depths", {50, 50})), "--depths: 50 is listed twice"},
      {step("summarize", with(task, "ratio", {1.5})), "--ratio"},
      {step("longbench", with(task, "datasets", "no_such_dataset")), "no_such_dataset"},
      {step("replay", with(replay, "params", {{"h2o", {{"no_such_parameter", 1}}}})), "no_such_parameter"},
      {step("replay", with(replay, "eval_queries", "first:3")), "--eval-queries"},
      {step("synth", with(synth["config"], "queries", 65)), "--queries must be in [1, --tokens=64], got 65"},
      {step("calibrate chelsea", {{"model", model}, {"text", "t.txt"}, {"threshold", 2}, {"out", dir + "/o.json"}}),
       "--threshold must be a cosine in (-1, 1], got 2"},
      {step("tsne", {{"capture", dir + "/c.h5"}, {"max_iter", 10}}), "--max-iter must be in [250, 1000000], got 10"},
  };
  for (const auto& [s, message] : bad) {
    auto r = dry_run({synth, s});
    INFO(s.dump() << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK(r.out.find(message) != std::string::npos);
    CHECK(r.out.find("rejected its config") != std::string::npos);
  }
  // The same steps, valid, pass; so does a paper-preset chelsea whose outlier file a calibration
  // step before it would make (the dry run leaves that check to the step), though the step alone
  // is refused now, naming the file.
  const std::string outliers = dir + "/outliers.json";
  nlohmann::json chelsea = with(with(task, "method", "chelsea"), "params", {{"chelsea", {{"outliers", outliers}}}});
  chelsea["preset"] = "paper";
  auto r = dry_run({synth, step("longeval", task), step("replay", replay),
                    step("calibrate chelsea", {{"model", model}, {"text", "t.txt"}, {"out", outliers}}),
                    step("niah", chelsea)});
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("# step 4: niah") != std::string::npos);
  CHECK_FALSE(fs::exists(outliers));
  std::ofstream(dir + "/niah.json") << chelsea.dump();
  check_one_error(run_kvlab("niah --config " + dir + "/niah.json"), outliers);
}

TEST_CASE("cli: the crashes, silent accepts and bad inputs of issue 50 are one short error line") {
  auto dir = test::temp_dir("kvlab_cli_issue50");
  const std::string tiny = test::fixtures_dir() + "/tiny_models/qwen2";  // no tokenizer: --prompt-ids
  const std::string gen = "generate --prompt-ids 1,5,6 --max-new-tokens 2 --model ";
  // One "error: ..." line of at most 300 characters.
  auto short_error = [](const Result& r, const std::string& needle) {
    check_one_error(r, needle);
    CHECK(r.out.size() <= 301);
  };
  // Every line of `r` at most 300 characters.
  auto short_lines = [](const Result& r) {
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) CHECK_MESSAGE(line.size() <= 300, line.substr(0, 400));
  };
  SUBCASE("ruler eval without a folder (was SIGSEGV)") {
    std::ofstream(dir + "/empty.json") << "{}";
    for (const std::string& args : {std::string(), " --out " + dir + "/D", " --config " + dir + "/empty.json"})
      short_error(run_kvlab("ruler eval" + args), "dirs is required");
    std::ofstream(dir + "/run.json") << R"({"name": "x", "steps": [{"command": "ruler eval", "config": {}}]})";
    for (const char* flag : {"", " --dry-run"}) {
      auto r = run_kvlab("run " + dir + "/run.json" + flag);
      INFO(flag << ": " << r.out);
      CHECK(r.code == 1);
      CHECK(r.out.find("dirs is required") != std::string::npos);
      short_lines(r);
    }
  }
  SUBCASE("a config value nested 50,000 or 100,000 deep (was SIGSEGV, or a 100 KB line)") {
    for (int depth : {50000, 100000}) {
      const std::string path = dir + "/deep" + std::to_string(depth) + ".json";
      std::ofstream(path) << "{\"out\":" << std::string(size_t(depth), '[') << std::string(size_t(depth), ']') << "}";
      for (const char* command : {"synth", "generate", "ruler eval", "run"}) {
        INFO(command << " depth " << depth);
        short_error(run_kvlab(std::string(command) + (std::string(command) == "run" ? " " : " --config ") + path),
                    path + ": nested deeper than 64 levels");
      }
    }
  }
  SUBCASE("a list flag naming a value twice (was one branch run twice into one file)") {
    short_error(run_kvlab(gen + tiny + " --method h2o --ratio 0.5,0.5"), "--ratio: 0.5 is listed twice");
    short_error(run_kvlab(gen + tiny + " --method balancekv --T 2,2"), "--T: 2 is listed twice");
    short_error(run_kvlab("ppl --model " + tiny + " --method h2o --cache-size 16,16"), "--cache-size: 16 is listed twice");
  }
  SUBCASE("a method parameter given twice (was the last one used)") {
    auto r = run_kvlab(gen + tiny + " --method snapkv --ratio 0.5 --param snapkv.window=8 --param snapkv.window=16");
    short_error(r, "'snapkv.window=8'");
    CHECK(r.out.find("'snapkv.window=16'") != std::string::npos);
    // A parameter for every method and the same one scoped to one method set one value twice too.
    r = run_kvlab(gen + tiny + " --method snapkv --ratio 0.5 --param window=8 --param snapkv.window=16");
    short_error(r, "'window=8'");
    CHECK(r.out.find("'snapkv.window=16'") != std::string::npos);
  }
  SUBCASE("a model with rms_norm_eps >= 1 or a non-finite weight (was <unk>, exit 0)") {
    const std::string m = dir + "/m";
    fs::create_directories(m);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(tiny + "/" + f, m + "/" + f);
    CHECK(run_kvlab(gen + m).code == 0);
    nlohmann::json cfg = read_json_file(m + "/config.json");
    const nlohmann::json good = cfg;
    cfg["rms_norm_eps"] = 2.0;
    std::ofstream(m + "/config.json", std::ios::trunc) << cfg.dump();
    short_error(run_kvlab(gen + m), "key 'rms_norm_eps' must be in (0, 1), found 2");
    std::ofstream(m + "/config.json", std::ios::trunc) << good.dump();
    std::fstream st(m + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    st.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    st.read(header.data(), std::streamsize(header_len));
    const auto h = nlohmann::json::parse(header);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    st.seekp(std::streamoff(8 + header_len + h["model.norm.weight"]["data_offsets"][0].get<uint64_t>()));
    st.write(reinterpret_cast<const char*>(&nan), 4);
    st.close();
    short_error(run_kvlab(gen + m), "tensor 'model.norm.weight' holds a NaN or Inf value");
  }
  SUBCASE("longeval --data with --lines, and NIAH's empty --needle or --question (were accepted)") {
    std::ofstream(dir + "/cases.jsonl") << "";
    for (const char* lines : {"300", "200"})
      short_error(run_kvlab("longeval --model " + tiny + " --data " + dir + "/cases.jsonl --lines " + lines),
                  "--data and --lines");
    short_error(run_kvlab("niah --model " + tiny + " --needle ''"), "--needle must not be empty");
    short_error(run_kvlab("niah --model " + tiny + " --question ''"), "--question must not be empty");
  }
  SUBCASE("a DuoAttention heads file calibrated on another model (was used)") {
    const std::string stories = test::shared_dir() + "/models/stories260K";
    const std::string text = test::shared_dir() + "/data/wikitext2/wiki.test.raw";
    if (!fs::exists(stories + "/model.safetensors") || !fs::exists(text)) {
      MESSAGE("skipped: stories260K or WikiText-2 not found");
      return;
    }
    const std::string heads = dir + "/duo_stories.json";
    auto cal = run_kvlab("calibrate duo --model " + stories + " --text " + text +
                         " --samples 2 --tokens 64 --q-len 8 --out " + heads);
    REQUIRE_MESSAGE(cal.code == 0, cal.out);
    CHECK(read_json_file(heads).contains("model_key"));
    // The same shape, another model (here a copy under another name: another id).
    const std::string other = dir + "/other260K";
    fs::create_directories(other);
    for (const auto& e : fs::directory_iterator(stories)) fs::copy_file(e.path(), other + "/" + e.path().filename().string());
    const std::string duo = " --prompt-ids 1,5,6,7,8,9,10,11,12,13 --max-new-tokens 2 --method duo_attention --budget 4 "
                            "--param duo_attention.heads=" + heads;
    auto mine = run_kvlab("generate --model " + stories + duo);
    CHECK_MESSAGE(mine.code == 0, mine.out);
    auto theirs = run_kvlab("generate --model " + other + duo);  // after generate's line on the model
    CHECK(theirs.code == 1);
    const std::string last = theirs.out.substr(theirs.out.rfind("error: "));
    CHECK(last.find("was calibrated on another model (stories260K, not other260K)") != std::string::npos);
    CHECK(last.size() <= 301);
  }
  SUBCASE("counts no run can hold or finish, refused before any work (were hangs)") {
    // ruler --data-only --samples 1e9 grew 13 MB/s without a word; calibrate duo --samples 1e9 had an
    // ETA of 139 days; ruler --lengths 2^63-1 against a claimed context of 2^63-1 ran silent.
    for (const char* n : {"1000000000", "2147483648", "9223372036854775807"})
      short_error(run_kvlab("ruler --model " + tiny + " --data-only --lengths 4096 --samples " + std::string(n) +
                            " --out " + dir + "/r"), "--samples " + std::string(n) + ":");
    CHECK_FALSE(fs::exists(dir + "/r"));
    short_error(run_kvlab("ruler --model " + tiny + " --data-only --lengths 9223372036854775807 --out " + dir + "/r"),
                "--lengths: 9223372036854775807 is more tokens than kvlab handles");
    for (const char* cmd : {"calibrate duo", "calibrate chelsea"})
      short_error(run_kvlab(std::string(cmd) + " --model " + tiny + " --text t.txt --samples 1000000000 --out " + dir +
                            "/d.json"), "--samples must be in [1, 100000]");
    short_error(run_kvlab("buzz-steady --evictions 9223372036854775807 --out " + dir + "/b"),
                "--evictions must be <= 1000000");
    {  // run: 200,000 steps were checked one child process each, silent for over an hour
      nlohmann::json steps = nlohmann::json::array();
      for (int i = 0; i < 10001; ++i) steps.push_back({{"command", "buzz-steady"}, {"config", nlohmann::json::object()}});
      std::ofstream(dir + "/many.json") << nlohmann::json{{"name", "many"}, {"steps", steps}}.dump();
      short_error(run_kvlab("run " + dir + "/many.json --dry-run"), "10001 steps, more than a run file may hold (10000)");
    }
    // One position: every head scored 1.0.
    short_error(run_kvlab("calibrate duo --model " + tiny + " --text t.txt --q-len 1 --out " + dir + "/d.json"),
                "--q-len must be >= 2");
    const std::string m = dir + "/huge";
    fs::create_directories(m);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(tiny + "/" + f, m + "/" + f);
    nlohmann::json cfg = read_json_file(m + "/config.json");
    cfg["max_position_embeddings"] = std::numeric_limits<int64_t>::max();
    std::ofstream(m + "/config.json", std::ios::trunc) << cfg.dump();
    short_error(run_kvlab(gen + m), "claims a context of 9223372036854775807 tokens");
  }
}
