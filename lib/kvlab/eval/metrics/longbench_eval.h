// LongBench's dataset scoring, reproducing THUDM/LongBench LongBench/eval.py at commit 2e00731f:
// dataset2metric, scorer and scorer_e.
//
// Per record (both scorers):
//   for trec, triviaqa, samsum, lsht: prediction = prediction.lstrip('\n').split('\n')[0]
//   score = max(0., metric(prediction, answer, all_classes) for each answer)
// scorer:    round(100 * total / len(predictions), 2), total summed left to right in a Python
//            float; Python's round(): correctly rounded from the double's exact value, ties to
//            even (python_round)
// scorer_e:  records bucketed by `length` (< 4000 "0-4k", < 8000 "4-8k", else "8k+"), each
//            bucket round(100 * np.mean(scores), 2) -- numpy's mean (pairwise summation, then
//            / n) and numpy's round on an np.float64 (rint(x * 100) / 100), which differs
//            from Python's round in the last digit for some values (69.465 -> 69.46, not
//            69.47); an empty bucket is NaN (np.mean([]))
// `all_classes` is one list per dataset file: eval.py keeps the value of the file's last line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::eval {

// metric(prediction, ground_truth, all_classes), the form eval.py calls every metric with.
using LongBenchMetric = double (*)(std::string_view prediction, std::string_view ground_truth,
                                   const std::vector<std::string>& all_classes);

// The 21 LongBench datasets, in dataset2metric's order.
const std::vector<std::string>& longbench_datasets();
// dataset2metric[dataset]: the metric function and its metrics.py name ("qa_f1_score", ...).
// Unknown datasets throw kvlab::Error listing the known ones.
LongBenchMetric longbench_metric(std::string_view dataset);
std::string longbench_metric_name(std::string_view dataset);

// The first-line cleanup for trec, triviaqa, samsum, lsht; other datasets unchanged.
std::string longbench_clean_prediction(std::string_view dataset, std::string_view prediction);

// One record's score: max over the answers after cleanup (0 when there are no answers).
double longbench_record_score(std::string_view dataset, std::string_view prediction,
                              const std::vector<std::string>& answers,
                              const std::vector<std::string>& all_classes);

// eval.py scorer(dataset, predictions, answers, all_classes).
double scorer(std::string_view dataset, const std::vector<std::string>& predictions,
              const std::vector<std::vector<std::string>>& answers,
              const std::vector<std::string>& all_classes);

struct LongBenchEScores {
  double upto_4k = 0;   // "0-4k":  length < 4000
  double from_4k = 0;   // "4-8k":  4000 <= length < 8000
  double from_8k = 0;   // "8k+":   length >= 8000
};

// eval.py scorer_e(dataset, predictions, answers, lengths, all_classes).
LongBenchEScores scorer_e(std::string_view dataset, const std::vector<std::string>& predictions,
                          const std::vector<std::vector<std::string>>& answers,
                          const std::vector<int64_t>& lengths,
                          const std::vector<std::string>& all_classes);

// Python round(x, ndigits) for a float.
double python_round(double x, int ndigits);
// round(np.float64(x), decimals) = np.round: rint(x * 10**decimals) / 10**decimals (decimals >= 0).
double numpy_round(double x, int decimals);
// np.mean of a float64 list: np.add.reduce's pairwise summation over the whole array (below 8
// elements left to right; up to 128, 8 accumulators; above, split in halves rounded down to a
// multiple of 8), then / n. NaN for an empty list.
double numpy_mean(const std::vector<double>& v);

}  // namespace kvlab::eval
