#include "kvlab/eval/metrics/jieba_hmm.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/jieba_files.h"
#include "kvlab/eval/metrics/pyliteral.h"
#include "kvlab/eval/metrics/unicode.h"

namespace kvlab::eval {

namespace {

constexpr double kMinFloat = -3.14e100;  // finalseg MIN_FLOAT
constexpr char kStateLetter[4] = {'B', 'M', 'E', 'S'};
// finalseg PrevStatus: B <- "ES", M <- "MB", E <- "BM", S <- "SE" (indices into BMES).
constexpr int kPrev[4][2] = {{2, 3}, {1, 0}, {0, 1}, {3, 2}};

int state_index(const std::u32string& key, const std::string& where) {
  if (key.size() == 1) {
    for (int i = 0; i < 4; ++i)
      if (key[0] == static_cast<char32_t>(kStateLetter[i])) return i;
  }
  KVLAB_FAIL("{}: unexpected state key '{}' (expected B, M, E or S)", where, utf8_encode(key));
}

bool is_finalseg_han(char32_t c) { return c >= 0x4E00 && c <= 0x9FD5; }  // re_han
bool is_ascii_alnum(char32_t c) {
  return (c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') || (c >= U'0' && c <= U'9');
}

// re.split("([a-zA-Z0-9]+(?:\.\d+)?%?)", text) keeping the non-empty pieces (finalseg.cut).
void split_skip(const std::u32string& s, size_t lo, size_t hi, std::vector<std::u32string>& out) {
  size_t pending = lo;  // start of the text not yet emitted
  size_t i = lo;
  while (i < hi) {
    if (!is_ascii_alnum(s[i])) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < hi && is_ascii_alnum(s[e])) ++e;
    if (e + 1 < hi && s[e] == U'.' && is_decimal(s[e + 1])) {
      e += 1;
      while (e < hi && is_decimal(s[e])) ++e;
    }
    if (e < hi && s[e] == U'%') ++e;
    if (i > pending) out.push_back(s.substr(pending, i - pending));
    out.push_back(s.substr(i, e - i));
    i = pending = e;
  }
  if (hi > pending) out.push_back(s.substr(pending, hi - pending));
}

}  // namespace

JiebaHmm JiebaHmm::load(const std::string& finalseg_dir) {
  JiebaHmm m;
  {
    const std::string path = finalseg_dir + "/prob_start.py";
    PyLiteral p = parse_py_assignment(read_jieba_file(path), "P", path);
    KVLAB_CHECK(p.is_dict && p.items.size() == 4, "{}: expected a dict of 4 states", path);
    for (auto& [k, v] : p.items) m.start_[state_index(k, path)] = v.number;
  }
  {
    const std::string path = finalseg_dir + "/prob_trans.py";
    PyLiteral p = parse_py_assignment(read_jieba_file(path), "P", path);
    KVLAB_CHECK(p.is_dict && p.items.size() == 4, "{}: expected a dict of 4 states", path);
    for (auto& row : m.trans_) row.fill(kMinFloat);
    for (auto& [from, row] : p.items) {
      KVLAB_CHECK(row.is_dict, "{}: expected a dict per state", path);
      for (auto& [to, v] : row.items) m.trans_[state_index(from, path)][state_index(to, path)] = v.number;
    }
  }
  {
    const std::string path = finalseg_dir + "/prob_emit.py";
    PyLiteral p = parse_py_assignment(read_jieba_file(path), "P", path);
    KVLAB_CHECK(p.is_dict && p.items.size() == 4, "{}: expected a dict of 4 states", path);
    for (auto& [state, table] : p.items) {
      KVLAB_CHECK(table.is_dict, "{}: expected a dict per state", path);
      auto& e = m.emit_[state_index(state, path)];
      for (auto& [ch, v] : table.items) {
        KVLAB_CHECK(ch.size() == 1, "{}: emission key '{}' is not one character", path,
                    utf8_encode(ch));
        e[ch[0]] = v.number;  // a repeated key keeps the last value, as a Python dict does
      }
    }
  }
  return m;
}

size_t JiebaHmm::emit_entries() const {
  size_t n = 0;
  for (auto& e : emit_) n += e.size();
  return n;
}

std::vector<std::u32string> JiebaHmm::cut_han(const std::u32string& obs) const {
  const size_t n = obs.size();
  auto emit = [&](int y, char32_t c) {
    auto it = emit_[y].find(c);
    return it == emit_[y].end() ? kMinFloat : it->second;
  };
  std::vector<std::array<double, 4>> V(n);
  std::vector<std::array<int, 4>> back(n);  // back[t][y]: the state at t-1 on y's best path
  for (int y = 0; y < 4; ++y) V[0][y] = start_[y] + emit(y, obs[0]);
  for (size_t t = 1; t < n; ++t) {
    for (int y = 0; y < 4; ++y) {
      const double em = emit(y, obs[t]);
      int best = -1;
      double best_p = 0;
      for (int y0 : kPrev[y]) {
        const double p = V[t - 1][y0] + trans_[y0][y] + em;
        // Python max over (prob, state) tuples: ties go to the larger state letter.
        if (best < 0 || p > best_p || (p == best_p && kStateLetter[y0] > kStateLetter[best])) {
          best = y0;
          best_p = p;
        }
      }
      V[t][y] = best_p;
      back[t][y] = best;
    }
  }
  // max((V[-1][y], y) for y in 'ES')
  const int E = 2, S = 3;
  int state = V[n - 1][S] >= V[n - 1][E] ? S : E;
  std::vector<int> pos(n);
  for (size_t t = n; t-- > 0;) {
    pos[t] = state;
    if (t > 0) state = back[t][state];
  }
  std::vector<std::u32string> out;
  size_t begin = 0, nexti = 0;
  for (size_t i = 0; i < n; ++i) {
    const char letter = kStateLetter[pos[i]];
    if (letter == 'B') {
      begin = i;
    } else if (letter == 'E') {
      out.push_back(obs.substr(begin, i + 1 - begin));
      nexti = i + 1;
    } else if (letter == 'S') {
      out.push_back(obs.substr(i, 1));
      nexti = i + 1;
    }
  }
  if (nexti < n) out.push_back(obs.substr(nexti));
  return out;
}

std::vector<std::u32string> JiebaHmm::cut(const std::u32string& s) const {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    const bool han = is_finalseg_han(s[i]);
    while (j < s.size() && is_finalseg_han(s[j]) == han) ++j;
    if (han) {
      for (auto& w : cut_han(s.substr(i, j - i))) out.push_back(std::move(w));
    } else {
      split_skip(s, i, j, out);
    }
    i = j;
  }
  return out;
}

}  // namespace kvlab::eval
