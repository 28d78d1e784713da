// NIAH (tasks/niah.h): the haystack and needle placement of gkamradt's LLMTest_NeedleInAHaystack
// (its invariants: context cut to length − buffer, the needle's tokens intact at the depth, right
// after a "." token, depth 0 / 100 at the ends), the scorer by hand, and `kvlab niah` end to end on
// stories260K (grid, prediction files, a resumed run, errors naming the flag).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/niah.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {
std::string stories_dir() { return test::shared_dir() + "/models/stories260K"; }
std::string essays_dir() { return test::shared_dir() + "/data/niah/PaulGrahamEssays"; }
}  // namespace

TEST_CASE("niah: the needle sits whole at its depth, after a period, in a context of length - buffer") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  Tokenizer tok = load_model_tokenizer(resolve_model(stories_dir()));
  const std::string hay = read_haystack(essays_dir());
  CHECK(hay.size() > 100000);  // 49 essays
  NiahSpec spec;
  const auto needle = tok.encode(spec.needle, false);
  const auto period = tok.encode(".", false);
  for (int64_t L : {300, 1000}) {
    for (double d : {0.0, 10.0, 50.0, 90.0, 100.0}) {
      CAPTURE(L);
      CAPTURE(d);
      const NiahCase c = make_niah_case(tok, hay, spec, L, d);
      CHECK(c.context_tokens == L - spec.buffer);
      const auto ids = tok.encode(c.context, false);
      // The needle's tokens start at needle_token in the built token sequence; decoding and
      // re-encoding keeps the needle's text at the same place.
      CHECK(c.context.find(spec.needle) != std::string::npos);
      const double at = double(c.needle_token) / double(c.context_tokens - int64_t(needle.size()));
      if (d == 0) CHECK(c.needle_token == 0);
      if (d == 100) CHECK(c.needle_token == c.context_tokens - int64_t(needle.size()));
      if (d > 0 && d < 100) {
        CHECK(at <= d / 100 + 1e-9);        // moved back, never forward
        // To the nearest sentence end before it (at 300 tokens the first essay's opening has
        // few full stops, so the needle may move far back there, as in the original).
        if (L >= 1000) CHECK(at > d / 100 - 0.15);
        // The text before the needle ends with the "." token.
        const std::string before = c.context.substr(0, c.context.find(spec.needle));
        const auto before_ids = tok.encode(before, false);
        REQUIRE(!before_ids.empty());
        CHECK(std::find(period.begin(), period.end(), before_ids.back()) != period.end());
      }
      CHECK(std::abs(int64_t(ids.size()) - c.context_tokens) <= 8);  // re-encoding the decoded text
    }
  }
  CHECK_THROWS_WITH(make_niah_case(tok, hay, spec, 150, 50), doctest::Contains("--lengths"));
  CHECK_THROWS_WITH(make_niah_case(tok, hay, spec, 1000, 101), doctest::Contains("--depths"));
  CHECK_THROWS_WITH(read_haystack(essays_dir() + "/nope"), doctest::Contains("--haystack-dir"));
}

TEST_CASE("niah: score = key phrase found (any case); ROUGE-1 recall of the needle beside it") {
  const nlohmann::json gold = {{"needle", "The best thing to do in San Francisco is eat a sandwich."},
                               {"key_phrase", "eat a sandwich"}};
  auto s = niah_score("You should EAT A SANDWICH there.", gold);
  CHECK(s["score"] == 1.0);
  // Needle tokens (rouge-score: lowercase words): the best thing to do in san francisco is eat a
  // sandwich = 12 tokens, of which "eat", "a", "sandwich" occur in the output: recall 3/12.
  CHECK(s["rouge1_recall"].get<double>() == doctest::Approx(3.0 / 12.0));
  auto t = niah_score("Dolores Park.", gold);
  CHECK(t["score"] == 0.0);
  CHECK(t["rouge1_recall"].get<double>() == 0.0);
  CHECK(niah_score("The best thing to do in San Francisco is eat a sandwich.", gold)["rouge1_recall"] == 1.0);
}

TEST_CASE("niah: kvlab niah on stories260K — grid, predictions, resume, errors") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  const std::string dir = test::temp_dir("niah_cli");
  const std::string base = test::kvlab_bin() + " --threads 2 niah --model " + stories_dir() + " --haystack-dir " +
                           essays_dir() + " --lengths 300,400 --depths 0,50,100 --method streaming_llm --budget 16"
                           " --max-new-tokens 8 --quiet --obs-queries 8 --out " + dir + "/run";
  std::string out;
  REQUIRE(test::run_command(base, &out) == 0);
  INFO(out);
  CHECK(out.find("depth     300     400") != std::string::npos);
  const std::string exact = dir + "/run/pred/exact/niah.jsonl", sl = dir + "/run/pred/streaming_llm_budget16/niah.jsonl";
  auto count = [](const std::string& p) {
    std::ifstream f(p);
    int n = 0;
    for (std::string l; std::getline(f, l);) n += !l.empty();
    return n;
  };
  CHECK(count(exact) == 6);
  CHECK(count(sl) == 6);
  std::ifstream f(dir + "/run/result.json");
  auto res = nlohmann::json::parse(f);
  REQUIRE(res["rows"].size() == 2);
  CHECK(res["rows"][1]["record_scores"].size() == 6);
  CHECK(res["rows"][1]["record_scores"].contains("len400_depth50"));
  // The heat map: valid XML, one panel per branch, one cell per (length, depth), scores as in the rows.
  const std::string svg = dir + "/run/heatmap.svg";
  REQUIRE(fs::exists(svg));
  std::string py;
  CHECK(test::run_command("python3 -c \"import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); "
                          "ns = '{http://www.w3.org/2000/svg}'; "
                          "ps = [g for g in r.iter(ns + 'g') if g.get('class') == 'panel']; "
                          "print(len(ps), [len([c for c in p.iter(ns + 'g') if c.get('class') == 'cell']) for p in ps], "
                          "[c.get('data-score') for c in ps[1].iter(ns + 'g') if c.get('class') == 'cell' and "
                          "c.get('data-length') == '400' and c.get('data-depth') == '50'])\" " + svg, &py) == 0);
  const double cell = res["rows"][1]["record_scores"]["len400_depth50"].get<double>();
  CHECK(py == fmt::format("2 [6, 6] ['{:g}']\n", cell));
  // Resume: the same command over the same folder runs nothing again and gives the same rows.
  std::string out2;
  REQUIRE(test::run_command(base, &out2) == 0);
  std::ifstream f2(dir + "/run/result.json");
  auto res2 = nlohmann::json::parse(f2);
  CHECK(res2["rows"][1]["record_scores"] == res["rows"][1]["record_scores"]);
  CHECK(count(exact) == 6);
  // Errors name the flag.
  std::string err;
  CHECK(test::run_command(test::kvlab_bin() + " niah --model " + stories_dir() + " --haystack-dir /nonexistent --out " +
                          dir + "/e1", &err) != 0);
  CHECK(err.find("--haystack-dir /nonexistent") != std::string::npos);
  CHECK(test::run_command(test::kvlab_bin() + " niah --model " + stories_dir() + " --haystack-dir " + essays_dir() +
                          " --lengths 4096 --out " + dir + "/e2", &err) != 0);
  CHECK(err.find("--lengths: 4096 tokens") != std::string::npos);
  // --layer-error judges the question's queries: only where they go through the compressed cache.
  CHECK(test::run_command(test::kvlab_bin() + " niah --model " + stories_dir() + " --haystack-dir " + essays_dir() +
                          " --method snapkv --ratio 0.5 --layer-error --out " + dir + "/e3", &err) != 0);
  CHECK(err.find("--layer-error judges each branch on the question's queries") != std::string::npos);
  CHECK(err.find("found --protocol whole") != std::string::npos);
  CHECK(test::run_command(test::kvlab_bin() + " niah --model " + stories_dir() + " --haystack-dir " + essays_dir() +
                          " --method snapkv --ratio 0.5 --layer-error --protocol context --decode-rule rerotate --out " +
                          dir + "/e4", &err) != 0);
  CHECK(err.find("--layer-error cannot judge re-rotated keys") != std::string::npos);
}
