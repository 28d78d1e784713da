// fuzzywuzzy 0.18.0 `fuzz.ratio` on the pure-Python path that LongBench's environment takes
// (its requirements.txt has fuzzywuzzy but not python-Levenshtein, so fuzz.py falls back to
// `difflib.SequenceMatcher`; with python-Levenshtein installed the numbers would differ).
//
// fuzz_ratio(s1, s2), decorators applied outside-in, as in fuzz.py:
//   s1 == s2                    -> 100   (check_for_equivalence, before the emptiness check:
//                                         two empty strings score 100)
//   len(s1) == 0 or len(s2) == 0 -> 0    (check_empty_string)
//   else int(round(100 * SequenceMatcher(None, s1, s2).ratio()))   (round half to even)
// SequenceMatcher (CPython 3.11 Lib/difflib.py) over code points, isjunk=None, autojunk=True:
//   when len(b) >= 200, characters occurring more than len(b) // 100 + 1 times in b are
//   "popular" and left out of the index; ratio() = 2 * M / (len(a) + len(b)) where M sums the
//   sizes of get_matching_blocks() (longest-match recursion; find_longest_match takes the
//   earliest longest match in a, then b, and extends it by popular characters on both sides).
#pragma once

#include <string>
#include <string_view>

namespace kvlab::eval {

// difflib.SequenceMatcher(None, a, b).ratio(); a, b are code points.
double sequence_matcher_ratio(const std::u32string& a, const std::u32string& b);

// fuzzywuzzy fuzz.ratio(s1, s2) for UTF-8 strings: an integer 0..100.
int fuzz_ratio(std::string_view s1, std::string_view s2);

}  // namespace kvlab::eval
