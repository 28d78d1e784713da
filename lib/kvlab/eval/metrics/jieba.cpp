#include "kvlab/eval/metrics/jieba.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/jieba_files.h"
#include "kvlab/eval/metrics/unicode.h"

#include <cmath>
#include <utility>

namespace kvlab::eval {

namespace {

// re_han_default = "([\u4E00-\u9FD5a-zA-Z0-9+#&\._%\-]+)"
bool is_han_default(char32_t c) {
  if (c >= 0x4E00 && c <= 0x9FD5) return true;
  if ((c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') || (c >= U'0' && c <= U'9')) return true;
  return c == U'+' || c == U'#' || c == U'&' || c == U'.' || c == U'_' || c == U'%' || c == U'-';
}

bool is_ascii_space(char c) {  // bytes.strip() with no argument
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

// int(text) for the dictionary's frequency field: optional sign, ASCII digits.
bool parse_freq(std::string_view t, int64_t* out) {
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (i == t.size()) return false;
  int64_t v = 0;
  for (; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') return false;
    v = v * 10 + (t[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

}  // namespace

Jieba Jieba::load(const std::string& dir) {
  Jieba j;
  const std::string path = dir + "/dict.txt";
  const std::string text = read_jieba_file(path);
  j.freq_.reserve(600000);
  size_t pos = 0;
  int64_t lineno = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++lineno;
    // line.strip().decode('utf-8'); word, freq = line.split(' ')[:2]; freq = int(freq)
    while (!line.empty() && is_ascii_space(line.front())) line.remove_prefix(1);
    while (!line.empty() && is_ascii_space(line.back())) line.remove_suffix(1);
    const size_t sp = line.find(' ');
    KVLAB_CHECK(sp != std::string_view::npos, "invalid dictionary entry in {} at Line {}: {}", path,
                lineno, line);
    const std::string_view word = line.substr(0, sp);
    std::string_view freq_text = line.substr(sp + 1);
    freq_text = freq_text.substr(0, freq_text.find(' '));
    int64_t f = 0;
    KVLAB_CHECK(parse_freq(freq_text, &f), "invalid dictionary entry in {} at Line {}: {}", path,
                lineno, line);
    const std::u32string w = utf8_decode(word);
    j.freq_[std::string(word)] = f;
    j.total_ += f;
    std::string prefix;
    for (char32_t c : w) {
      utf8_append(prefix, c);
      j.freq_.try_emplace(prefix, 0);
    }
  }
  KVLAB_CHECK(j.total_ > 0, "{}: empty jieba dictionary", path);
  j.hmm_ = JiebaHmm::load(dir + "/finalseg");
  return j;
}

int64_t Jieba::freq(const std::string& w) const {
  auto it = freq_.find(w);
  return it == freq_.end() ? -1 : it->second;
}

void Jieba::cut_dag(const std::u32string& s, std::vector<std::u32string>& out) const {
  const size_t n = s.size();
  // get_DAG
  std::vector<std::vector<size_t>> dag(n);
  for (size_t k = 0; k < n; ++k) {
    std::string frag;
    utf8_append(frag, s[k]);
    size_t i = k;
    int64_t f;
    while (i < n && (f = freq(frag)) >= 0) {
      if (f > 0) dag[k].push_back(i);
      ++i;
      if (i < n) utf8_append(frag, s[i]);
    }
    if (dag[k].empty()) dag[k].push_back(k);
  }
  // calc: route[idx] = max((log(FREQ.get(frag) or 1) - logtotal + route[x + 1][0], x) ...)
  std::vector<std::pair<double, size_t>> route(n + 1, {0.0, 0});
  const double logtotal = std::log(static_cast<double>(total_));
  for (size_t idx = n; idx-- > 0;) {
    bool first = true;
    std::string frag;
    size_t built = idx;  // frag holds s[idx:built]
    for (size_t x : dag[idx]) {
      while (built <= x) utf8_append(frag, s[built++]);
      const int64_t f = freq(frag);
      const double p = (std::log(static_cast<double>(f > 0 ? f : 1)) - logtotal) + route[x + 1].first;
      // Tuple max; x grows along DAG[idx], so an equal probability goes to the later x.
      if (first || p >= route[idx].first) route[idx] = {p, x};
      first = false;
    }
  }
  // __cut_DAG
  auto flush = [&](std::u32string& buf) {
    if (buf.empty()) return;
    if (buf.size() == 1) {
      out.push_back(buf);
    } else if (freq(utf8_encode(buf)) <= 0) {  // not self.FREQ.get(buf)
      for (auto& t : hmm_.cut(buf)) out.push_back(std::move(t));
    } else {
      for (char32_t c : buf) out.emplace_back(1, c);
    }
    buf.clear();
  };
  std::u32string buf;
  size_t x = 0;
  while (x < n) {
    const size_t y = route[x].second + 1;
    if (y - x == 1) {
      buf.push_back(s[x]);
    } else {
      flush(buf);
      out.push_back(s.substr(x, y - x));
    }
    x = y;
  }
  flush(buf);
}

std::vector<std::string> Jieba::cut(std::string_view text) const {
  const std::u32string s = utf8_decode(text);
  std::vector<std::u32string> toks;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    const bool han = is_han_default(s[i]);
    while (j < s.size() && is_han_default(s[j]) == han) ++j;
    if (han) {
      cut_dag(s.substr(i, j - i), toks);
    } else {
      // re_skip_default.split(blk): "\r\n" or one whitespace character are tokens; the rest of
      // the block is yielded one character at a time (cut_all=False).
      for (size_t k = i; k < j;) {
        if (s[k] == U'\r' && k + 1 < j && s[k + 1] == U'\n') {
          toks.push_back(U"\r\n");
          k += 2;
        } else {
          toks.emplace_back(1, s[k]);
          k += 1;
        }
      }
    }
    i = j;
  }
  std::vector<std::string> out;
  out.reserve(toks.size());
  for (auto& t : toks) out.push_back(utf8_encode(t));
  return out;
}

const Jieba& default_jieba() {
  static const Jieba j = Jieba::load(jieba_default_dir());
  return j;
}

std::vector<std::string> jieba_cut(std::string_view text) { return default_jieba().cut(text); }

}  // namespace kvlab::eval
