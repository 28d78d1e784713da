// jieba's HMM segmenter for runs of characters the dictionary does not cover
// (jieba 0.42.1, jieba/finalseg/__init__.py: `cut`, `__cut`, `viterbi`), reproduced exactly.
//
// Tables: finalseg/prob_start.py, prob_trans.py, prob_emit.py of the installed jieba (Debian's
// python3-jieba), read at run time; the tables are not copied into this repository.
//
// cut(sentence):
//   split into runs of [\u4E00-\u9FD5] ("han") and the rest;
//   han run   -> Viterbi over states BMES; a word ends at E (B..E) or S (one character);
//                a trailing unfinished B/M run is one word (`if nexti < len(sentence)`)
//   other run -> re.split("([a-zA-Z0-9]+(?:\.\d+)?%?)"), the non-empty pieces in order
// viterbi (one observation per code point), as in Python, with the same double arithmetic:
//   V[0][y]  = start[y] + emit[y].get(c0, MIN_FLOAT)
//   V[t][y]  = max over y0 in PrevStatus[y] of (V[t-1][y0] + trans[y0].get(y, MIN_FLOAT) + em)
//   end      = max over y in "ES" of V[last][y]
// with MIN_FLOAT = -3.14e100 and Python's tuple max: equal probabilities go to the larger
// state letter ('S' > 'M' > 'E' > 'B'). Sums against -3.14e100 absorb small terms, so such
// ties do happen (e.g. for characters absent from the emission table).
#pragma once

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvlab::eval {

class JiebaHmm {
 public:
  // Reads <finalseg_dir>/prob_start.py, prob_trans.py, prob_emit.py; throws kvlab::Error naming
  // a missing or malformed file.
  static JiebaHmm load(const std::string& finalseg_dir);

  // jieba.finalseg.cut(sentence) for a sentence of code points.
  std::vector<std::u32string> cut(const std::u32string& sentence) const;

  size_t emit_entries() const;  // number of (state, character) emission probabilities

 private:
  std::vector<std::u32string> cut_han(const std::u32string& han) const;  // finalseg.__cut

  // State index order B, M, E, S (jieba's 'BMES').
  std::array<double, 4> start_{};
  std::array<std::array<double, 4>, 4> trans_{};  // [from][to], MIN_FLOAT where absent
  std::array<std::unordered_map<char32_t, double>, 4> emit_;
};

}  // namespace kvlab::eval
