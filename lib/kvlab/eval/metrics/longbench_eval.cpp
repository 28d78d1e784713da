#include "kvlab/eval/metrics/longbench_eval.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/longbench_metrics.h"
#include "kvlab/eval/metrics/pystr.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace kvlab::eval {

namespace {

struct Entry {
  const char* dataset;
  const char* metric_name;
  LongBenchMetric metric;
};

// Adapters to the one signature (Python's **kwargs swallows all_classes).
template <double (*F)(std::string_view, std::string_view)>
double ignore_classes(std::string_view p, std::string_view g, const std::vector<std::string>&) {
  return F(p, g);
}

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {"narrativeqa", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"qasper", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"multifieldqa_en", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"multifieldqa_zh", "qa_f1_zh_score", ignore_classes<qa_f1_zh_score>},
      {"hotpotqa", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"2wikimqa", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"musique", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"dureader", "rouge_zh_score", ignore_classes<rouge_zh_score>},
      {"gov_report", "rouge_score", ignore_classes<rouge_score>},
      {"qmsum", "rouge_score", ignore_classes<rouge_score>},
      {"multi_news", "rouge_score", ignore_classes<rouge_score>},
      {"vcsum", "rouge_zh_score", ignore_classes<rouge_zh_score>},
      {"trec", "classification_score", classification_score},
      {"triviaqa", "qa_f1_score", ignore_classes<qa_f1_score>},
      {"samsum", "rouge_score", ignore_classes<rouge_score>},
      {"lsht", "classification_score", classification_score},
      {"passage_retrieval_en", "retrieval_score", ignore_classes<retrieval_score>},
      {"passage_count", "count_score", ignore_classes<count_score>},
      {"passage_retrieval_zh", "retrieval_zh_score", ignore_classes<retrieval_zh_score>},
      {"lcc", "code_sim_score", ignore_classes<code_sim_score>},
      {"repobench-p", "code_sim_score", ignore_classes<code_sim_score>},
  };
  return t;
}

const Entry& entry(std::string_view dataset) {
  for (const Entry& e : table())
    if (dataset == e.dataset) return e;
  KVLAB_FAIL("unknown LongBench dataset '{}'; eval.py's dataset2metric knows: {}", dataset,
             fmt::join(longbench_datasets(), ", "));
}

// numpy pairwise_sum for doubles (numpy/_core/src/umath/loops_utils.h.src), PW_BLOCKSIZE 128.
double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

}  // namespace

const std::vector<std::string>& longbench_datasets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Entry& e : table()) v.emplace_back(e.dataset);
    return v;
  }();
  return names;
}

LongBenchMetric longbench_metric(std::string_view dataset) { return entry(dataset).metric; }
std::string longbench_metric_name(std::string_view dataset) { return entry(dataset).metric_name; }

std::string longbench_clean_prediction(std::string_view dataset, std::string_view prediction) {
  if (dataset == "trec" || dataset == "triviaqa" || dataset == "samsum" || dataset == "lsht")
    return py_split(py_lstrip(prediction, '\n'), "\n")[0];
  return std::string(prediction);
}

double longbench_record_score(std::string_view dataset, std::string_view prediction,
                              const std::vector<std::string>& answers,
                              const std::vector<std::string>& all_classes) {
  const LongBenchMetric metric = longbench_metric(dataset);
  const std::string pred = longbench_clean_prediction(dataset, prediction);
  double score = 0.;
  for (const std::string& gt : answers) score = std::max(score, metric(pred, gt, all_classes));
  return score;
}

double scorer(std::string_view dataset, const std::vector<std::string>& predictions,
              const std::vector<std::vector<std::string>>& answers,
              const std::vector<std::string>& all_classes) {
  KVLAB_CHECK(!predictions.empty(), "LongBench scorer: no predictions for '{}' (eval.py divides "
              "by zero here)", dataset);
  const size_t n = std::min(predictions.size(), answers.size());  // zip()
  double total = 0.;
  for (size_t i = 0; i < n; ++i)
    total += longbench_record_score(dataset, predictions[i], answers[i], all_classes);
  return python_round(100 * total / static_cast<double>(predictions.size()), 2);
}

LongBenchEScores scorer_e(std::string_view dataset, const std::vector<std::string>& predictions,
                          const std::vector<std::vector<std::string>>& answers,
                          const std::vector<int64_t>& lengths,
                          const std::vector<std::string>& all_classes) {
  std::vector<double> b0, b1, b2;
  const size_t n = std::min({predictions.size(), answers.size(), lengths.size()});  // zip()
  for (size_t i = 0; i < n; ++i) {
    const double s = longbench_record_score(dataset, predictions[i], answers[i], all_classes);
    if (lengths[i] < 4000)
      b0.push_back(s);
    else if (lengths[i] < 8000)
      b1.push_back(s);
    else
      b2.push_back(s);
  }
  auto bucket = [](const std::vector<double>& v) { return numpy_round(100 * numpy_mean(v), 2); };
  return {bucket(b0), bucket(b1), bucket(b2)};
}

double python_round(double x, int ndigits) {
  // CPython's float.__round__ formats the exact binary value to ndigits decimals, rounding
  // half to even, and reads it back; glibc's printf rounds the exact value the same way.
  if (!std::isfinite(x)) return x;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", ndigits, x);
  return std::strtod(buf, nullptr);
}

double numpy_round(double x, int decimals) {
  const double f = std::pow(10.0, decimals);
  return std::nearbyint(x * f) / f;
}

double numpy_mean(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  // The reduction starts from the identity 0.0 and adds the pairwise sum of the whole
  // contiguous array (checked against numpy 2.4.6 up to 100000 elements: no 8192-element
  // buffer chunks for float64 input).
  const double sum = 0.0 + pairwise_sum(v.data(), v.size());
  return sum / static_cast<double>(v.size());
}

}  // namespace kvlab::eval
