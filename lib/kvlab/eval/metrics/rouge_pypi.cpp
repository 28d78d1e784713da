#include "kvlab/eval/metrics/rouge_pypi.h"

#include "kvlab/eval/metrics/pystr.h"
#include "kvlab/eval/metrics/unicode.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kvlab::eval {

namespace {

using Sentence = std::vector<int>;  // word ids

// Word -> id, so LCS compares ints; equal ids <=> equal Python strings.
class Vocab {
 public:
  int id(const std::string& w) { return ids_.try_emplace(w, static_cast<int>(ids_.size())).first->second; }

 private:
  std::unordered_map<std::string, int> ids_;
};

// [" ".join(_.split()) for _ in text.split(".") if len(_) > 0], then each .split(" ").
std::vector<Sentence> sentences(std::string_view text, Vocab& vocab) {
  std::vector<Sentence> out;
  for (const std::string& piece : py_split(text, ".")) {
    if (piece.empty()) continue;
    std::vector<std::string> words;
    for (auto& w : py_split_ws(utf8_decode(piece))) words.push_back(utf8_encode(w));
    const std::string sentence = py_join(words, " ");
    Sentence s;
    for (const std::string& w : py_split(sentence, " ")) s.push_back(vocab.id(w));
    out.push_back(std::move(s));
  }
  return out;
}

size_t distinct_words(const std::vector<Sentence>& sents) {
  std::unordered_set<int> seen;
  for (auto& s : sents) seen.insert(s.begin(), s.end());
  return seen.size();
}

// _recon_lcs(x, y): adds the words read back to `lcs_words`; false where `_recon` would need
// more than max_calls nested calls (RecursionError).
bool recon_lcs(const Sentence& x, const Sentence& y, int max_calls, std::unordered_set<int>& lcs_words) {
  const size_t n = x.size(), m = y.size();
  // Every step lowers i or j or both, and the walk stops when one is 0: at least min(n, m)
  // steps. Skip the table when that alone is too deep.
  if (static_cast<long long>(std::min(n, m)) + 1 > max_calls) return false;
  std::vector<int> table((n + 1) * (m + 1), 0);
  auto T = [&](size_t i, size_t j) -> int& { return table[i * (m + 1) + j]; };
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j)
      T(i, j) = x[i - 1] == y[j - 1] ? T(i - 1, j - 1) + 1 : std::max(T(i - 1, j), T(i, j - 1));
  std::vector<int> words;
  long long calls = 1;
  size_t i = n, j = m;
  while (i != 0 && j != 0) {
    if (x[i - 1] == y[j - 1]) {
      words.push_back(x[i - 1]);
      --i, --j;
    } else if (T(i - 1, j) > T(i, j - 1)) {
      --i;
    } else {
      --j;
    }
    ++calls;
  }
  if (calls > max_calls) return false;
  lcs_words.insert(words.begin(), words.end());
  return true;
}

}  // namespace

std::optional<double> rouge_pypi_l_f(std::string_view prediction, std::string_view reference,
                                     int max_recon_calls) {
  Vocab vocab;
  const std::vector<Sentence> hyp = sentences(prediction, vocab);
  const std::vector<Sentence> ref = sentences(reference, vocab);
  if (hyp.empty() || ref.empty()) return std::nullopt;  // "Hypothesis/Reference is empty."
  const double m = static_cast<double>(distinct_words(ref));
  const double n = static_cast<double>(distinct_words(hyp));
  std::unordered_set<int> lcs_union;
  for (const Sentence& r : ref)
    for (const Sentence& h : hyp)
      if (!recon_lcs(r, h, max_recon_calls, lcs_union)) return std::nullopt;
  const double llcs = static_cast<double>(lcs_union.size());
  const double r_lcs = llcs / m;
  const double p_lcs = llcs / n;
  return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8));
}

}  // namespace kvlab::eval
