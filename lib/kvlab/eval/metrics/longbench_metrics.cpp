#include "kvlab/eval/metrics/longbench_metrics.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/difflib.h"
#include "kvlab/eval/metrics/jieba.h"
#include "kvlab/eval/metrics/pystr.h"
#include "kvlab/eval/metrics/rouge_pypi.h"
#include "kvlab/eval/metrics/unicode.h"

#include <algorithm>
#include <unordered_map>

namespace kvlab::eval {

namespace {

// string.punctuation
bool is_ascii_punct(char32_t c) {
  return c < 0x80 && std::u32string_view(U"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~").find(c) !=
                         std::u32string_view::npos;
}

// normalize_zh_answer's cn_punctuation, verbatim from metrics.py.
bool is_cn_punct(char32_t c) {
  static constexpr std::u32string_view kCn =
      U"！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏.";
  return kCn.find(c) != std::u32string_view::npos;
}

// re.sub(r"\b(a|an|the)\b", " ", text): alternatives tried in order at each position.
std::u32string remove_articles(const std::u32string& t) {
  static const std::u32string kArticles[] = {U"a", U"an", U"the"};
  std::u32string out;
  size_t i = 0;
  while (i < t.size()) {
    bool matched = false;
    if (i == 0 || !is_word(t[i - 1])) {
      for (const auto& art : kArticles) {
        const size_t end = i + art.size();
        if (t.compare(i, art.size(), art) == 0 && (end == t.size() || !is_word(t[end]))) {
          out.push_back(U' ');
          i = end;
          matched = true;
          break;
        }
      }
    }
    if (!matched) out.push_back(t[i++]);
  }
  return out;
}

// " ".join(text.split()) (sep " ") or "".join(text.split()) (sep "").
std::string join_split(const std::u32string& t, std::string_view sep) {
  std::vector<std::string> words;
  for (auto& w : py_split_ws(t)) words.push_back(utf8_encode(w));
  return py_join(words, sep);
}

std::vector<std::string> split_ws_utf8(std::string_view s) {
  std::vector<std::string> out;
  for (auto& w : py_split_ws(utf8_decode(s))) out.push_back(utf8_encode(w));
  return out;
}

// re.findall(r"\d+", s) with Unicode \d.
std::vector<std::u32string> find_numbers(const std::u32string& s) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_decimal(s[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_decimal(s[j])) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// re.findall(prefix + r"(\d+)", s)[0]; nullopt-like empty string when there is none.
bool first_prefixed_number(const std::u32string& s, std::u32string_view prefix, std::u32string* out) {
  for (size_t i = 0; i + prefix.size() < s.size(); ++i) {
    if (s.compare(i, prefix.size(), prefix.data(), prefix.size()) != 0) continue;
    size_t j = i + prefix.size();
    size_t k = j;
    while (k < s.size() && is_decimal(s[k])) ++k;
    if (k > j) {
      *out = s.substr(j, k - j);
      return true;
    }
  }
  return false;
}

// The shared tail of count/retrieval scores: share of the prediction's numbers equal to id.
double share_equal(std::string_view prediction, const std::u32string& id) {
  const auto numbers = find_numbers(utf8_decode(prediction));
  if (numbers.empty()) return 0.0;
  const auto right = std::count(numbers.begin(), numbers.end(), id);
  return static_cast<double>(right) / static_cast<double>(numbers.size());
}

double retrieval_with(std::string_view prediction, std::string_view ground_truth,
                      std::u32string_view prefix, const char* pattern) {
  std::u32string id;
  KVLAB_CHECK(first_prefixed_number(utf8_decode(ground_truth), prefix, &id),
              "retrieval score: the ground truth '{}' has no match of r'{}' (LongBench's "
              "metrics.py fails here too: matches[0] of an empty list)",
              ground_truth, pattern);
  return share_equal(prediction, id);
}

double rouge_at(std::string_view prediction, std::string_view ground_truth, int frames_below) {
  return rouge_pypi_l_f(prediction, ground_truth, kPythonRecursionLimit - frames_below)
      .value_or(0.0);  // `except: return 0.0`
}

std::string jieba_join(std::string_view s) { return py_join(jieba_cut(s), " "); }

}  // namespace

std::string normalize_answer(std::string_view s) {
  std::u32string t = py_lower(utf8_decode(s));
  t.erase(std::remove_if(t.begin(), t.end(), is_ascii_punct), t.end());
  return join_split(remove_articles(t), " ");
}

std::string normalize_zh_answer(std::string_view s) {
  std::u32string t = py_lower(utf8_decode(s));
  t.erase(std::remove_if(t.begin(), t.end(),
                         [](char32_t c) { return is_ascii_punct(c) || is_cn_punct(c); }),
          t.end());
  return join_split(t, "");
}

double f1_score(const std::vector<std::string>& prediction,
                const std::vector<std::string>& ground_truth) {
  std::unordered_map<std::string, long long> gt_counts;
  for (auto& t : ground_truth) ++gt_counts[t];
  std::unordered_map<std::string, long long> pred_counts;
  for (auto& t : prediction) ++pred_counts[t];
  long long num_same = 0;
  for (auto& [tok, c] : pred_counts) {
    auto it = gt_counts.find(tok);
    if (it != gt_counts.end()) num_same += std::min(c, it->second);
  }
  if (num_same == 0) return 0;
  const double precision = 1.0 * static_cast<double>(num_same) / static_cast<double>(prediction.size());
  const double recall = 1.0 * static_cast<double>(num_same) / static_cast<double>(ground_truth.size());
  return (2 * precision * recall) / (precision + recall);
}

double qa_f1_score(std::string_view prediction, std::string_view ground_truth) {
  return f1_score(split_ws_utf8(normalize_answer(prediction)),
                  split_ws_utf8(normalize_answer(ground_truth)));
}

double qa_f1_zh_score(std::string_view prediction, std::string_view ground_truth) {
  auto tokens = [](std::string_view s) {
    std::vector<std::string> out;
    for (auto& t : jieba_cut(s)) {
      std::string n = normalize_zh_answer(t);
      if (!n.empty()) out.push_back(std::move(n));
    }
    return out;
  };
  return f1_score(tokens(prediction), tokens(ground_truth));
}

double rouge_score(std::string_view prediction, std::string_view ground_truth) {
  return rouge_at(prediction, ground_truth, kEvalPyFramesBelowRecon);
}

double rouge_zh_score(std::string_view prediction, std::string_view ground_truth) {
  return rouge_at(jieba_join(prediction), jieba_join(ground_truth), kEvalPyFramesBelowRecon + 1);
}

double classification_score(std::string_view prediction, std::string_view ground_truth,
                            const std::vector<std::string>& all_classes) {
  std::vector<std::string> em;
  for (auto& c : all_classes)
    if (prediction.find(c) != std::string_view::npos) em.push_back(c);
  // for match_term in em_match_list: ... em_match_list.remove(match_term)
  // CPython's list iterator keeps an index; remove() drops the first equal element.
  for (size_t idx = 0; idx < em.size(); ++idx) {
    const std::string term = em[idx];
    if (ground_truth.find(term) != std::string_view::npos && term != ground_truth) {
      em.erase(std::find(em.begin(), em.end(), term));
    }
  }
  if (std::find(em.begin(), em.end(), ground_truth) != em.end())
    return 1.0 / static_cast<double>(em.size());
  return 0.0;
}

double retrieval_score(std::string_view prediction, std::string_view ground_truth) {
  return retrieval_with(prediction, ground_truth, U"Paragraph ", "Paragraph (\\d+)");
}

double retrieval_zh_score(std::string_view prediction, std::string_view ground_truth) {
  return retrieval_with(prediction, ground_truth, U"段落", "段落(\\d+)");
}

double count_score(std::string_view prediction, std::string_view ground_truth) {
  return share_equal(prediction, utf8_decode(ground_truth));
}

double code_sim_score(std::string_view prediction, std::string_view ground_truth) {
  std::string line;
  for (const std::string& l : py_split(py_lstrip(prediction, '\n'), "\n")) {
    if (l.find('`') == std::string::npos && l.find('#') == std::string::npos &&
        l.find("//") == std::string::npos) {
      line = l;
      break;
    }
  }
  return fuzz_ratio(line, ground_truth) / 100.0;
}

}  // namespace kvlab::eval
