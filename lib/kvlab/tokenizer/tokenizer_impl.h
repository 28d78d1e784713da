// Internals of kvlab::Tokenizer shared by tokenizer.cpp (pipeline), tokenizer_load.cpp (file
// formats), pretokenize.cpp (regex splits, byte-level map) and bpe.cpp (merge loops).
// Not part of the public API.
#pragma once

#include "kvlab/tokenizer/tokenizer.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvlab::detail {

// ---- UTF-8 -------------------------------------------------------------------------------
// Decodes one code point at s[i]; invalid bytes decode as U+FFFD with length 1 so hostile
// input never reads out of bounds.
char32_t utf8_next(std::string_view s, size_t i, size_t* len);
void utf8_append(std::string& out, char32_t cp);
bool utf8_valid(std::string_view s);
// Replaces each invalid sequence by U+FFFD (like Rust's String::from_utf8_lossy).
std::string utf8_lossy(std::string_view s);

bool is_letter(char32_t cp);   // \p{L}
bool is_number(char32_t cp);   // \p{N}
bool is_space(char32_t cp);    // \s (Unicode White_Space)

// ---- pre-tokenizers ------------------------------------------------------------------------
enum class SplitPattern { Gpt2, Llama3, Qwen2 };
// Recognises the regex text of a tokenizer.json Split / GGUF pre name; throws for others.
SplitPattern split_pattern_from_regex(const std::string& regex, const std::string& where);

struct PreTokenizerStep {
  enum class Kind { Split, ByteLevel, Digits, Metaspace } kind = Kind::Split;
  SplitPattern pattern = SplitPattern::Gpt2;  // Split; ByteLevel with use_regex uses Gpt2
  bool use_regex = true;                      // ByteLevel
  bool add_prefix_space = false;              // ByteLevel
  bool individual_digits = false;             // Digits
  std::string replacement = "\xe2\x96\x81";   // Metaspace ("▁")
  std::string prepend_scheme = "always";      // Metaspace: always | first | never
  bool split = true;                          // Metaspace
};

// Byte-level map of GPT-2: every byte gets a printable code point (UTF-8 encoded here).
const std::array<std::string, 256>& byte_to_unicode();
// Inverse, -1 for code points outside the map.
int byte_from_unicode(char32_t cp);

// Runs the steps on one segment (already normalized, no added tokens inside). `first` is true
// for the first segment of the text (Metaspace prepend_scheme "first").
std::vector<std::string> pre_tokenize(const std::vector<PreTokenizerStep>& steps,
                                      std::string_view text, bool first);
// Splits by one pattern into match pieces (Isolated behaviour).
void split_by_pattern(SplitPattern p, std::string_view text, std::vector<std::string>& out);

std::string normalize_replace(std::string_view s, std::string_view from, std::string_view to);

// ---- normalizers and decoders --------------------------------------------------------------
struct NormalizerStep {
  enum class Kind { Prepend, Replace, Identity } kind = Kind::Identity;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

struct DecoderStep {
  enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind =
      Kind::Fuse;
  std::string a, b;             // Replace: a -> b; Strip: a = content; Metaspace: a = replacement
  int start = 0, stop = 0;      // Strip
  bool prepend_first = true;    // Metaspace: strip the leading space of the first token
};

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
};

}  // namespace kvlab::detail

namespace kvlab {

struct Tokenizer::Impl {
  enum class Algo { RankBpe, ScoreBpe };
  std::string source;
  std::string kind;  // byte_bpe | spm_bpe | spm_scores
  Algo algo = Algo::RankBpe;
  bool byte_level = false;  // pieces are byte->unicode mapped

  std::vector<std::string> pieces;                      // id -> piece
  std::unordered_map<std::string, int64_t> piece_to_id;
  std::vector<uint8_t> special;                         // id -> 1 if special (skipped on decode)
  std::vector<float> scores;                            // ScoreBpe
  // RankBpe: (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;

  std::vector<detail::AddedToken> added;  // split out before anything else, never merged
  std::array<std::vector<uint32_t>, 256> added_by_byte;  // first byte -> indices, longest first
  std::vector<detail::NormalizerStep> normalizers;
  std::vector<detail::PreTokenizerStep> pre_tokenizers;
  std::vector<detail::DecoderStep> decoders;

  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;   // Llama 3: a pre-token already in the vocab is one token
  int64_t unk_id = -1;
  // SentencePiece vocabularies where "▁" only ever starts a piece: no merge can cross the point
  // before a "▁" that follows another char, so the (pre-tokenizer-less) text is cut there into
  // words that are merged and cached independently, with identical results and ~10x speed.
  bool chunk_at_space_marker = false;
  std::array<int64_t, 256> byte_ids{};  // <0xXX> piece ids, -1 if absent

  int64_t bos = -1, eos = -1;
  std::vector<int64_t> prefix_ids, suffix_ids;  // added by encode(add_bos=true)

  // Fills byte_ids and the special flags; validates ids. Called once by every loader.
  void finalize();
  // Model step on one pre-token; appends ids.
  void bpe_rank(std::string_view word, std::vector<int64_t>& out) const;
  void bpe_score(std::string_view word, std::vector<int64_t>& out) const;
  // Ids of one character that is not in the vocabulary (byte fallback or unk).
  void unknown_char(std::string_view ch, std::vector<int64_t>& out) const;
};

}  // namespace kvlab
