#include "kvlab/eval/metrics/rouge_google.h"

#include "kvlab/eval/metrics/porter.h"
#include "kvlab/eval/metrics/pystr.h"
#include "kvlab/eval/metrics/unicode.h"

#include <algorithm>
#include <map>

namespace kvlab::eval {

namespace {

bool is_token_char(char32_t c) { return (c >= U'a' && c <= U'z') || (c >= U'0' && c <= U'9'); }

// scoring.fmeasure
double fmeasure(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0.0; }

RougeScore score_ngrams(const std::vector<std::string>& target,
                        const std::vector<std::string>& prediction, size_t n) {
  auto ngrams = [n](const std::vector<std::string>& toks) {
    std::map<std::vector<std::string>, long long> counts;
    for (size_t i = 0; i + n <= toks.size(); ++i)
      ++counts[std::vector<std::string>(toks.begin() + i, toks.begin() + i + n)];
    return counts;
  };
  const auto t = ngrams(target), p = ngrams(prediction);
  long long overlap = 0, t_count = 0, p_count = 0;
  for (auto& [g, c] : t) {
    auto it = p.find(g);
    overlap += std::min(c, it == p.end() ? 0LL : it->second);
    t_count += c;
  }
  for (auto& [g, c] : p) p_count += c;
  RougeScore s;
  s.precision = static_cast<double>(overlap) / static_cast<double>(std::max(p_count, 1LL));
  s.recall = static_cast<double>(overlap) / static_cast<double>(std::max(t_count, 1LL));
  s.fmeasure = fmeasure(s.precision, s.recall);
  return s;
}

}  // namespace

RougeScore google_rouge_l(const std::vector<std::string>& target, const std::vector<std::string>& prediction) {
  RougeScore s;
  if (target.empty() || prediction.empty()) return s;
  const size_t cols = prediction.size();
  std::vector<long long> prev(cols + 1, 0), cur(cols + 1, 0);
  for (size_t i = 1; i <= target.size(); ++i) {
    for (size_t j = 1; j <= cols; ++j)
      cur[j] = target[i - 1] == prediction[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  const double lcs = static_cast<double>(prev[cols]);
  s.precision = lcs / static_cast<double>(prediction.size());
  s.recall = lcs / static_cast<double>(target.size());
  s.fmeasure = fmeasure(s.precision, s.recall);
  return s;
}

std::vector<std::string> google_rouge_tokenize(std::string_view text, bool use_stemmer) {
  const std::u32string low = py_lower(utf8_decode(text));
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < low.size()) {
    if (!is_token_char(low[i])) {
      ++i;
      continue;
    }
    std::string tok;
    while (i < low.size() && is_token_char(low[i])) tok.push_back(static_cast<char>(low[i++]));
    if (use_stemmer && tok.size() > 3) tok = porter_stem(tok);
    if (!tok.empty()) tokens.push_back(std::move(tok));
  }
  return tokens;
}

GoogleRouge google_rouge(std::string_view target, std::string_view prediction, bool use_stemmer) {
  const auto t = google_rouge_tokenize(target, use_stemmer);
  const auto p = google_rouge_tokenize(prediction, use_stemmer);
  GoogleRouge g;
  g.rouge1 = score_ngrams(t, p, 1);
  g.rouge2 = score_ngrams(t, p, 2);
  g.rougeL = google_rouge_l(t, p);
  return g;
}

}  // namespace kvlab::eval
