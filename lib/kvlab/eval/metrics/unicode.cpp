#include "kvlab/eval/metrics/unicode.h"

#include "kvlab/core/check.h"

#include <algorithm>
#include <iterator>

namespace kvlab::eval {
namespace detail {

struct CodeRange {
  char32_t lo, hi;  // inclusive
};
struct LowerPair {
  char32_t from, to;
};

#include "kvlab/eval/metrics/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t c) {
  // First range whose upper end is >= c; c is in the table iff that range starts at or below c.
  auto it = std::lower_bound(std::begin(table), std::end(table), c,
                             [](const CodeRange& r, char32_t v) { return r.hi < v; });
  return it != std::end(table) && it->lo <= c;
}

}  // namespace detail

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    char32_t c = 0;
    char32_t min = 0;
    if (b0 < 0x80) {
      len = 1, c = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, c = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, c = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, c = b0 & 0x07, min = 0x10000;
    }
    KVLAB_CHECK(len != 0 && i + len <= s.size(),
                "invalid UTF-8 at byte {} of a {}-byte string (metrics take UTF-8 text)", i,
                s.size());
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      KVLAB_CHECK((b & 0xC0) == 0x80, "invalid UTF-8 at byte {} of a {}-byte string", i + k,
                  s.size());
      c = (c << 6) | (b & 0x3F);
    }
    KVLAB_CHECK(c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF),
                "invalid UTF-8 (overlong, surrogate or out of range) at byte {}", i);
    out.push_back(c);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_decimal(char32_t c) { return detail::in_ranges(detail::kDecimalRanges, c); }
bool is_word(char32_t c) { return c == U'_' || detail::in_ranges(detail::kAlnumRanges, c); }
bool is_space(char32_t c) { return detail::in_ranges(detail::kSpaceRanges, c); }
bool is_cased(char32_t c) { return detail::in_ranges(detail::kCasedRanges, c); }
bool is_case_ignorable(char32_t c) { return detail::in_ranges(detail::kCaseIgnorableRanges, c); }

char32_t lower_simple(char32_t c) {
  if (c < 0x80) return (c >= U'A' && c <= U'Z') ? c + 32 : c;
  const auto& t = detail::kLowerPairs;
  auto it = std::lower_bound(std::begin(t), std::end(t), c,
                             [](const detail::LowerPair& p, char32_t v) { return p.from < v; });
  return (it != std::end(t) && it->from == c) ? it->to : c;
}

}  // namespace kvlab::eval
