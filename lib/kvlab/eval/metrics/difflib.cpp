#include "kvlab/eval/metrics/difflib.h"

#include "kvlab/eval/metrics/unicode.h"

#include <cmath>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace kvlab::eval {

namespace {

struct Match {
  size_t i, j, k;
};

class SequenceMatcher {
 public:
  SequenceMatcher(const std::u32string& a, const std::u32string& b) : a_(a), b_(b) { chain_b(); }

  // get_matching_blocks(): only the total size is needed for ratio().
  size_t matched() const {
    size_t total = 0;
    std::vector<std::tuple<size_t, size_t, size_t, size_t>> queue{{0, a_.size(), 0, b_.size()}};
    while (!queue.empty()) {
      auto [alo, ahi, blo, bhi] = queue.back();
      queue.pop_back();
      const Match m = find_longest_match(alo, ahi, blo, bhi);
      if (m.k == 0) continue;
      total += m.k;
      if (alo < m.i && blo < m.j) queue.emplace_back(alo, m.i, blo, m.j);
      if (m.i + m.k < ahi && m.j + m.k < bhi) queue.emplace_back(m.i + m.k, ahi, m.j + m.k, bhi);
    }
    return total;
  }

 private:
  // __chain_b: b2j maps each character of b to its ascending positions; with autojunk and
  // len(b) >= 200, characters seen more than len(b) // 100 + 1 times are dropped ("popular").
  void chain_b() {
    for (size_t i = 0; i < b_.size(); ++i) b2j_[b_[i]].push_back(i);
    const size_t n = b_.size();
    if (n >= 200) {
      const size_t ntest = n / 100 + 1;
      for (auto it = b2j_.begin(); it != b2j_.end();) {
        if (it->second.size() > ntest)
          it = b2j_.erase(it);
        else
          ++it;
      }
    }
  }

  // find_longest_match(alo, ahi, blo, bhi) with an empty bjunk: the junk-extension loops
  // never run; the popular-extension loops compare characters directly.
  Match find_longest_match(size_t alo, size_t ahi, size_t blo, size_t bhi) const {
    size_t besti = alo, bestj = blo, bestsize = 0;
    std::unordered_map<size_t, size_t> j2len, newj2len;
    for (size_t i = alo; i < ahi; ++i) {
      newj2len.clear();
      auto it = b2j_.find(a_[i]);
      if (it != b2j_.end()) {
        for (size_t j : it->second) {
          if (j < blo) continue;
          if (j >= bhi) break;
          size_t prev = 0;
          if (j > 0) {
            auto p = j2len.find(j - 1);
            if (p != j2len.end()) prev = p->second;
          }
          const size_t k = newj2len[j] = prev + 1;
          if (k > bestsize) {
            besti = i - k + 1;
            bestj = j - k + 1;
            bestsize = k;
          }
        }
      }
      std::swap(j2len, newj2len);
    }
    while (besti > alo && bestj > blo && a_[besti - 1] == b_[bestj - 1]) {
      --besti, --bestj, ++bestsize;
    }
    while (besti + bestsize < ahi && bestj + bestsize < bhi &&
           a_[besti + bestsize] == b_[bestj + bestsize]) {
      ++bestsize;
    }
    return {besti, bestj, bestsize};
  }

  const std::u32string& a_;
  const std::u32string& b_;
  std::unordered_map<char32_t, std::vector<size_t>> b2j_;
};

}  // namespace

double sequence_matcher_ratio(const std::u32string& a, const std::u32string& b) {
  const size_t length = a.size() + b.size();
  if (length == 0) return 1.0;  // _calculate_ratio
  const size_t matches = SequenceMatcher(a, b).matched();
  return 2.0 * static_cast<double>(matches) / static_cast<double>(length);
}

int fuzz_ratio(std::string_view s1, std::string_view s2) {
  if (s1 == s2) return 100;                  // check_for_equivalence
  if (s1.empty() || s2.empty()) return 0;    // check_empty_string
  const double r = sequence_matcher_ratio(utf8_decode(s1), utf8_decode(s2));
  return static_cast<int>(std::nearbyint(100 * r));  // utils.intr: int(round(n)), half to even
}

}  // namespace kvlab::eval
