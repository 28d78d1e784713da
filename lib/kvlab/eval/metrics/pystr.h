// Python `str` methods the LongBench metrics call, with CPython's exact semantics.
//   py_lower(s)          s.lower(): full Unicode lowercase, U+0130 -> "i\u0307", and the
//                        final-sigma rule (Σ -> ς after a cased letter when no cased letter
//                        follows, skipping case-ignorable characters both ways)
//   py_split_ws(s)       s.split(): split on runs of Unicode whitespace, no empty pieces
//   py_split(s, sep)     s.split(sep): every piece, empty ones included
//   py_join(v, sep)      sep.join(v)
//   py_lstrip(s, c)      s.lstrip(c) for a one-character set
// UTF-8 functions work on bytes: exact for valid UTF-8 and an ASCII or whole-character sep.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab::eval {

std::u32string py_lower(std::u32string_view s);
std::vector<std::u32string> py_split_ws(std::u32string_view s);
std::vector<std::string> py_split(std::string_view s, std::string_view sep);
std::string py_join(const std::vector<std::string>& parts, std::string_view sep);
std::string py_lstrip(std::string_view s, char c);

}  // namespace kvlab::eval
