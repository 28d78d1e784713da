#include "kvlab/eval/metrics/pystr.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/unicode.h"

namespace kvlab::eval {

namespace {

// CPython Objects/unicodeobject.c handle_capital_sigma: Σ at i is final (ς) when
//   \p{cased}\p{case-ignorable}* Σ !(\p{case-ignorable}* \p{cased})
char32_t lower_capital_sigma(std::u32string_view s, size_t i) {
  size_t j = i;
  char32_t c = 0;
  bool found = false;
  while (j > 0) {
    c = s[--j];
    if (!is_case_ignorable(c)) {
      found = true;
      break;
    }
  }
  bool final_sigma = found && is_cased(c);
  if (final_sigma && i + 1 < s.size()) {
    size_t k = i + 1;
    for (; k < s.size(); ++k) {
      c = s[k];
      if (!is_case_ignorable(c)) break;
    }
    final_sigma = k == s.size() || !is_cased(c);
  }
  return final_sigma ? U'\u03C2' : U'\u03C3';
}

}  // namespace

std::u32string py_lower(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == U'\u03A3') {
      out.push_back(lower_capital_sigma(s, i));
    } else if (c == U'\u0130') {
      out.push_back(U'i');  // SpecialCasing: LATIN CAPITAL LETTER I WITH DOT ABOVE
      out.push_back(U'\u0307');
    } else {
      out.push_back(lower_simple(c));
    }
  }
  return out;
}

std::vector<std::u32string> py_split_ws(std::u32string_view s) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> py_split(std::string_view s, std::string_view sep) {
  KVLAB_CHECK(!sep.empty(), "py_split: empty separator (Python raises ValueError too)");
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) break;
    out.emplace_back(s.substr(start, pos - start));
    start = pos + sep.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string py_join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.append(sep);
    out.append(parts[i]);
  }
  return out;
}

std::string py_lstrip(std::string_view s, char c) {
  size_t i = 0;
  while (i < s.size() && s[i] == c) ++i;
  return std::string(s.substr(i));
}

}  // namespace kvlab::eval
