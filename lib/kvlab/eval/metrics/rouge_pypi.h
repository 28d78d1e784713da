// ROUGE-L F of the PyPI `rouge` package 1.0.1 (rouge/rouge.py, rouge/rouge_score.py), as
// LongBench calls it: `Rouge().get_scores([pred], [ref], avg=True)["rouge-l"]["f"]`.
//
// Quirks reproduced (not ROUGE-1.5.5's definition):
//   sentences = [" ".join(s.split()) for s in text.split(".") if len(s) > 0]
//               ASCII '.' only; a whitespace-only piece becomes the sentence ""
//   words     = sentence.split(" "): case-sensitive, punctuation attached, "" is a word
//   m, n      = numbers of DISTINCT words of the reference / the prediction (exclusive=True)
//   llcs      = number of distinct words in the union over (reference sentence, prediction
//               sentence) pairs of the words on the LCS that `_recon` reads back: from the
//               table's corner, a match goes diagonally, else up when table[i-1][j] >
//               table[i][j-1], else left (x = reference words, y = prediction words)
//   F         = 2.0 * ((P * R) / (P + R + 1e-8)), P = llcs / n, R = llcs / m
//               (identical strings give 0.999999995, not 1)
// get_scores raises, and LongBench's rouge_score returns 0.0, when:
//   - either text has no sentence (empty, or only '.'): ValueError from rouge_n / rouge_l
//   - `_recon` recurses deeper than Python allows: it makes 1 + (steps until i or j is 0)
//     nested calls, and CPython raises RecursionError once the Python stack passes
//     sys.getrecursionlimit() (1000). The frames below `_recon` when eval.py calls the metric
//     are counted by the caller (longbench_metrics.h): max_recon_calls = 1000 - those frames.
#pragma once

#include <optional>
#include <string_view>

namespace kvlab::eval {

// CPython's default sys.getrecursionlimit().
constexpr int kPythonRecursionLimit = 1000;

// get_scores(...)["rouge-l"]["f"], or nullopt where get_scores raises (see above).
std::optional<double> rouge_pypi_l_f(std::string_view prediction, std::string_view reference,
                                     int max_recon_calls);

}  // namespace kvlab::eval
