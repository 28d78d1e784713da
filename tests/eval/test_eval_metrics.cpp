// Golden tests of lib/kvlab/eval/metrics against the Python originals: LongBench metrics.py and
// eval.py (commit 2e00731f), the `rouge` and `fuzzywuzzy` packages, jieba 0.42.1, numpy, and
// Google's rouge-score. Expected values: tests/fixtures/eval_metrics/golden.json, made by
// data_scripts/make_eval_metrics_golden.py. Every float must agree within 1e-9 (they agree
// exactly today), tokens and strings exactly.
// The Chinese metrics and the jieba cases need Debian's python3-jieba (apt-get install
// python3-jieba); without it they fail with the loader's message naming the missing file.
#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/difflib.h"
#include "kvlab/eval/metrics/jieba.h"
#include "kvlab/eval/metrics/longbench_eval.h"
#include "kvlab/eval/metrics/longbench_metrics.h"
#include "kvlab/eval/metrics/porter.h"
#include "kvlab/eval/metrics/rouge_google.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
namespace ev = kvlab::eval;

constexpr double kTol = 1e-9;

const json& golden() {
  static const json g = [] {
    const std::string path =
        std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/eval_metrics/golden.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("missing golden file " + path);
    return json::parse(in);
  }();
  return g;
}

std::vector<std::string> strings(const json& j) {
  if (j.is_null()) return {};
  return j.get<std::vector<std::string>>();
}

bool uses_jieba(const std::string& metric) {
  return metric == "qa_f1_zh_score" || metric == "rouge_zh_score";
}

double call_metric(const std::string& name, const std::string& p, const std::string& g,
                   const std::vector<std::string>& classes) {
  if (name == "qa_f1_score") return ev::qa_f1_score(p, g);
  if (name == "qa_f1_zh_score") return ev::qa_f1_zh_score(p, g);
  if (name == "rouge_score") return ev::rouge_score(p, g);
  if (name == "rouge_zh_score") return ev::rouge_zh_score(p, g);
  if (name == "classification_score") return ev::classification_score(p, g, classes);
  if (name == "retrieval_score") return ev::retrieval_score(p, g);
  if (name == "retrieval_zh_score") return ev::retrieval_zh_score(p, g);
  if (name == "count_score") return ev::count_score(p, g);
  if (name == "code_sim_score") return ev::code_sim_score(p, g);
  throw std::runtime_error("golden names an unknown metric " + name);
}

// Runs the metric cases with (want_jieba) or without jieba; returns how many ran.
int check_metric_cases(bool want_jieba) {
  int n = 0;
  for (const json& c : golden()["metrics"]) {
    const std::string name = c["metric"];
    if (uses_jieba(name) != want_jieba) continue;
    const std::string p = c["prediction"], g = c["ground_truth"];
    const double expected = c["expected"];
    const double got = call_metric(name, p, g, strings(c["all_classes"]));
    INFO(name, "(prediction=", p.substr(0, 200), ", ground_truth=", g.substr(0, 200), ")");
    CHECK(std::fabs(got - expected) <= kTol);
    ++n;
  }
  return n;
}

// The values make_eval_metrics_golden.py's lcg_values makes.
std::vector<double> lcg_values(size_t n) {
  uint64_t state = 12345;
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(static_cast<double>(state >> 11) / 9007199254740992.0);
  }
  return out;
}

}  // namespace

TEST_CASE("LongBench metrics without jieba equal metrics.py") {
  CHECK(check_metric_cases(false) > 200);
}

TEST_CASE("LongBench Chinese metrics (jieba) equal metrics.py") {
  REQUIRE_NOTHROW(ev::default_jieba());  // else: the loader's message (apt-get install python3-jieba)
  CHECK(check_metric_cases(true) > 100);
}

TEST_CASE("jieba segmentation equals jieba.cut(text, cut_all=False)") {
  REQUIRE_NOTHROW(ev::default_jieba());
  for (const json& c : golden()["jieba"]) {
    const std::string text = c["text"];
    INFO("text: ", text);
    CHECK(ev::jieba_cut(text) == strings(c["tokens"]));
  }
}

TEST_CASE("a missing jieba install is named with its fix") {
  try {
    ev::Jieba::load("/nonexistent/jieba");
    FAIL("expected kvlab::Error");
  } catch (const kvlab::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("/nonexistent/jieba/dict.txt") != std::string::npos);
    CHECK(what.find("apt-get install python3-jieba") != std::string::npos);
  }
}

TEST_CASE("fuzz.ratio and the normalizers equal fuzzywuzzy and metrics.py") {
  for (const json& c : golden()["fuzz_ratio"]) {
    const std::string a = c["s1"], b = c["s2"];
    INFO("s1=", a.substr(0, 100), " s2=", b.substr(0, 100));
    CHECK(ev::fuzz_ratio(a, b) == c["expected"].get<int>());
  }
  for (const json& c : golden()["normalize"]) {
    const std::string t = c["text"];
    INFO("text: ", t.substr(0, 100));
    CHECK(ev::normalize_answer(t) == c["answer"].get<std::string>());
    CHECK(ev::normalize_zh_answer(t) == c["zh"].get<std::string>());
  }
}

TEST_CASE("scorer and scorer_e equal eval.py") {
  REQUIRE_NOTHROW(ev::default_jieba());  // multifieldqa_zh, dureader and vcsum segment with jieba
  for (const json& c : golden()["scorers"]) {
    const std::string dataset = c["dataset"];
    const auto preds = strings(c["predictions"]);
    const auto answers = c["answers"].get<std::vector<std::vector<std::string>>>();
    const auto lengths = c["lengths"].get<std::vector<int64_t>>();
    const auto classes = strings(c["all_classes"]);
    INFO("dataset ", dataset, ", ", preds.size(), " records");
    CHECK(ev::scorer(dataset, preds, answers, classes) == c["expected"].get<double>());
    const ev::LongBenchEScores e = ev::scorer_e(dataset, preds, answers, lengths, classes);
    const json& want = c["expected_e"];
    auto same = [](double got, const json& w) {
      return w.is_null() ? std::isnan(got) : got == w.get<double>();
    };
    CHECK(same(e.upto_4k, want["0-4k"]));
    CHECK(same(e.from_4k, want["4-8k"]));
    CHECK(same(e.from_8k, want["8k+"]));
  }
}

TEST_CASE("dataset2metric covers the 21 LongBench datasets") {
  CHECK(ev::longbench_datasets().size() == 21);
  CHECK(ev::longbench_metric_name("multifieldqa_zh") == "qa_f1_zh_score");
  CHECK(ev::longbench_metric_name("repobench-p") == "code_sim_score");
  CHECK(ev::longbench_metric_name("vcsum") == "rouge_zh_score");
  CHECK_THROWS_AS(ev::longbench_metric("longbook_qa"), kvlab::Error);
  CHECK(ev::longbench_clean_prediction("trec", "\n\nCity\nMore") == "City");
  CHECK(ev::longbench_clean_prediction("trec", " \nCity") == " ");  // strips '\n' only
  CHECK(ev::longbench_clean_prediction("lcc", "\nx\ny") == "\nx\ny");
  // metrics.py's matches[0] of an empty list: an error, not a score.
  CHECK_THROWS_AS(ev::retrieval_score("Paragraph 1", "no paragraph id"), kvlab::Error);
}

TEST_CASE("numpy mean and round, Python round") {
  for (const json& c : golden()["numerics"]["mean"]) {
    std::vector<double> v =
        c.contains("lcg_n") ? lcg_values(c["lcg_n"].get<size_t>()) : c["values"].get<std::vector<double>>();
    INFO("n = ", v.size());
    CHECK(ev::numpy_mean(v) == c["expected"].get<double>());
  }
  for (const json& c : golden()["numerics"]["round"]) {
    const double x = c["x"];
    INFO("x = ", x);
    CHECK(ev::python_round(x, 2) == c["python"].get<double>());
    CHECK(ev::numpy_round(x, 2) == c["numpy"].get<double>());
  }
  CHECK(std::isnan(ev::numpy_mean({})));
}

TEST_CASE("rouge-score ROUGE-1/2/L F1 and NLTK's Porter stemmer") {
  for (const json& c : golden()["google_rouge"]) {
    const std::string t = c["target"], p = c["prediction"];
    const bool stem = c["use_stemmer"];
    INFO("use_stemmer=", stem, " target=", t.substr(0, 100), " prediction=", p.substr(0, 100));
    const ev::GoogleRouge r = ev::google_rouge(t, p, stem);
    CHECK(std::fabs(r.rouge1.fmeasure - c["rouge1"].get<double>()) <= kTol);
    CHECK(std::fabs(r.rouge2.fmeasure - c["rouge2"].get<double>()) <= kTol);
    CHECK(std::fabs(r.rougeL.fmeasure - c["rougeL"].get<double>()) <= kTol);
  }
  for (const json& c : golden()["porter"]) {
    const std::string w = c[0];
    INFO("word: ", w);
    CHECK(ev::porter_stem(w) == c[1].get<std::string>());
  }
}
