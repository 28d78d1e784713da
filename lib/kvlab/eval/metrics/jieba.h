// Chinese word segmentation equal to jieba 0.42.1's default mode,
// `list(jieba.cut(text, cut_all=False))` (HMM=True), which LongBench's qa_f1_zh_score and
// rouge_zh_score use. Source reproduced: jieba/__init__.py, Tokenizer.gen_pfdict, get_DAG, calc,
// __cut_DAG, cut; the HMM part is jieba_hmm.h.
//
// Dictionary (gen_pfdict): every line "word freq [tag]" sets FREQ[word] = freq (a repeated word
// keeps the last freq, but every line's freq is added to total) and FREQ[prefix] = 0 for each
// prefix not yet present.
// cut(text):
//   blocks = re.split("([\u4E00-\u9FD5a-zA-Z0-9+#&\._%\-]+)", text)
//   matching block -> __cut_DAG(block)
//   other block    -> re.split("(\r\n|\s)"): "\r\n" is one token, every other character
//                     (whitespace or not) is its own token
// __cut_DAG(s):
//   DAG[k]   = every i with FREQ[s[k:i+1]] > 0, walking while s[k:i+1] is in FREQ; else [k]
//   route[k] = max over i in DAG[k] of (log(FREQ.get(s[k:i+1]) or 1) - log(total)
//              + route[i+1].prob, i), right to left; ties go to the larger i
//   follow the route; single characters collect in buf; a buf of length > 1 is handed to the
//   HMM when FREQ.get(buf) is falsy, else split into characters
// Tokens are code-point strings, returned as UTF-8. Results depend on context: the same word
// may be segmented differently inside different sentences.
#pragma once

#include "kvlab/eval/metrics/jieba_hmm.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvlab::eval {

class Jieba {
 public:
  // Reads <dir>/dict.txt and <dir>/finalseg/prob_*.py (jieba_files.h); throws kvlab::Error
  // naming a missing file and saying `apt-get install python3-jieba`.
  static Jieba load(const std::string& dir);

  // list(jieba.cut(text, cut_all=False)); text and tokens are UTF-8.
  std::vector<std::string> cut(std::string_view text) const;

  int64_t total() const { return total_; }
  size_t entries() const { return freq_.size(); }  // words and prefixes
  const JiebaHmm& hmm() const { return hmm_; }

 private:
  // Tokenizer.__cut_DAG for one block of the dictionary alphabet; appends to out.
  void cut_dag(const std::u32string& s, std::vector<std::u32string>& out) const;
  // FREQ.get(word): -1 when absent.
  int64_t freq(const std::string& utf8_word) const;

  std::unordered_map<std::string, int64_t> freq_;  // UTF-8 word or prefix -> freq (0: prefix)
  int64_t total_ = 0;
  JiebaHmm hmm_;
};

// The process-wide segmenter from jieba_default_dir(), loaded on first use (about a second).
const Jieba& default_jieba();

// list(jieba.cut(text, cut_all=False)) with default_jieba().
std::vector<std::string> jieba_cut(std::string_view text);

}  // namespace kvlab::eval
