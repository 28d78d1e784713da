// Pre-tokenizers: the GPT-2 / Llama-3 / Qwen2 split regexes matched by hand over code points
// (no PCRE dependency; each alternative of the pattern is one commented block below), the
// Digits and Metaspace splitters, and GPT-2's byte->unicode map.
#include "kvlab/core/check.h"
#include "kvlab/core/text.h"
#include "kvlab/tokenizer/tokenizer_impl.h"

#include <algorithm>

namespace kvlab::detail {

namespace {
struct CodeRange {
  char32_t lo, hi;
};
#include "kvlab/tokenizer/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  const CodeRange* end = table + N;
  const CodeRange* it =
      std::upper_bound(table, end, cp, [](char32_t c, const CodeRange& r) { return c < r.lo; });
  return it != table && cp <= (it - 1)->hi;
}
}  // namespace

// ---- UTF-8 -------------------------------------------------------------------------------
char32_t utf8_next(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  int n = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) { n = 1; cp = b0 & 0x1F; }
  else if ((b0 & 0xF0) == 0xE0) { n = 2; cp = b0 & 0x0F; }
  else if ((b0 & 0xF8) == 0xF0) { n = 3; cp = b0 & 0x07; }
  else return 0xFFFD;
  if (i + n >= s.size()) return 0xFFFD;  // truncated sequence
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are invalid, as in Rust's from_utf8.
  static constexpr char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  *len = static_cast<size_t>(n) + 1;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const char32_t cp = utf8_next(s, i, &len);
    // A literal U+FFFD is 3 bytes; the error marker is length 1.
    if (cp == 0xFFFD && len == 1) return false;
    i += len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const char32_t cp = utf8_next(s, i, &len);
    if (cp == 0xFFFD && len == 1) {
      // Rust's from_utf8_lossy emits one U+FFFD per maximal invalid prefix: skip the
      // continuation bytes that a valid lead byte promised but that were cut short.
      const auto b0 = static_cast<unsigned char>(s[i]);
      size_t want = (b0 & 0xE0) == 0xC0 ? 1 : (b0 & 0xF0) == 0xE0 ? 2 : (b0 & 0xF8) == 0xF0 ? 3 : 0;
      size_t k = 1;
      while (want > 0 && i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80) {
        ++k;
        --want;
      }
      utf8_append(out, 0xFFFD);
      i += k;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetterRanges, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumberRanges, cp);
}

bool is_space(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- the split patterns --------------------------------------------------------------------
namespace {

// The regexes exactly as tokenizer.json files spell them.
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_other(char32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }
bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

char32_t lower_ascii(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// 's 't 're 've 'm 'll 'd at i; returns the length or 0.
size_t match_contraction(const std::vector<char32_t>& cp, size_t i, bool ignore_case) {
  const size_t n = cp.size();
  if (cp[i] != '\'' || i + 1 >= n) return 0;
  auto at = [&](size_t k) { return ignore_case ? lower_ascii(cp[k]) : cp[k]; };
  const char32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const char32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of chars satisfying pred starting at i.
template <class Pred>
size_t run_end(const std::vector<char32_t>& cp, size_t i, Pred pred) {
  while (i < cp.size() && pred(cp[i])) ++i;
  return i;
}

// `\s+(?!\S)|\s+` at i (cp[i] is whitespace): a whitespace run followed by a non-space gives its
// last char to the next token (" world"), unless the run is a single char.
size_t match_space_tail(const std::vector<char32_t>& cp, size_t i) {
  const size_t k = run_end(cp, i, is_space);
  if (k == cp.size() || k - i == 1) return k;
  return k - 1;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const std::vector<char32_t>& cp, size_t i) {
  if (size_t c = match_contraction(cp, i, false)) return i + c;
  const size_t n = cp.size();
  const size_t j = (cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  // Each ` ?X+` alternative: with the optional space if the char after it starts X, else
  // without (and then cp[i] itself must start X; a space never does).
  if (is_letter(cp[j])) return run_end(cp, j, is_letter);
  if (is_number(cp[j])) return run_end(cp, j, is_number);
  if (is_other(cp[j])) return run_end(cp, j, is_other);
  if (is_space(cp[i])) return match_space_tail(cp, i);
  return i + 1;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const std::vector<char32_t>& cp, size_t i, size_t max_digits) {
  if (size_t c = match_contraction(cp, i, true)) return i + c;
  const size_t n = cp.size();
  const char32_t c0 = cp[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+ : one optional leading char (space, punctuation) then letters.
  if (is_letter(c0)) return run_end(cp, i, is_letter);
  if (!is_newline(c0) && !is_number(c0) && i + 1 < n && is_letter(cp[i + 1]))
    return run_end(cp, i + 1, is_letter);
  // \p{N}{1,3}
  if (is_number(c0)) {
    size_t k = i;
    while (k < n && k - i < max_digits && is_number(cp[k])) ++k;
    return k;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t j = (c0 == ' ' && i + 1 < n && is_other(cp[i + 1])) ? i + 1 : i;
  if (is_other(cp[j])) return run_end(cp, run_end(cp, j, is_other), is_newline);
  // \s*[\r\n]+ : greedy \s* backtracks to the last newline of the whitespace run.
  const size_t k = run_end(cp, i, is_space);
  for (size_t p = k; p > i; --p)
    if (is_newline(cp[p - 1])) return p;
  if (is_space(c0)) return match_space_tail(cp, i);
  return i + 1;
}

}  // namespace

SplitPattern split_pattern_from_regex(const std::string& regex, const std::string& where) {
  if (regex == kGpt2Regex) return SplitPattern::Gpt2;
  if (regex == kLlama3Regex) return SplitPattern::Llama3;
  if (regex == kQwen2Regex) return SplitPattern::Qwen2;
  // GGUF tokenizer.ggml.pre names (llama.cpp's llama-vocab.cpp).
  if (regex == "gpt2" || regex == "default" || regex == "smollm" || regex == "gpt-2")
    return SplitPattern::Gpt2;
  if (regex == "llama3" || regex == "llama-bpe" || regex == "llama-v3" || regex == "dbrx" ||
      regex == "smaug-bpe")
    return SplitPattern::Llama3;
  if (regex == "qwen2") return SplitPattern::Qwen2;
  KVLAB_FAIL(
      "{}: unsupported pre-tokenizer split pattern '{}' (supported: the GPT-2, Llama-3 and "
      "Qwen2 regexes; GGUF pre names gpt2, smollm, llama-bpe, qwen2)",
      where, regex.size() > 200 ? regex.substr(0, 200) + "..." : regex);
}

void split_by_pattern(SplitPattern p, std::string_view text, std::vector<std::string>& out) {
  std::vector<char32_t> cp;
  std::vector<size_t> off;  // byte offset of each code point, plus the end
  cp.reserve(text.size());
  off.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    size_t len = 0;
    cp.push_back(utf8_next(text, i, &len));
    off.push_back(i);
    i += len;
  }
  off.push_back(text.size());
  for (size_t i = 0; i < cp.size();) {
    size_t e = p == SplitPattern::Gpt2     ? match_gpt2(cp, i)
               : p == SplitPattern::Llama3 ? match_llama3(cp, i, 3)
                                           : match_llama3(cp, i, 1);
    if (e <= i) e = i + 1;  // cannot happen for these patterns; guarantees progress
    out.emplace_back(text.substr(off[i], off[e] - off[i]));
    i = e;
  }
}

// ---- byte-level map ------------------------------------------------------------------------
const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    // Printable Latin-1 bytes map to themselves; the rest to U+0100 onwards, in byte order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : 256 + next++;
      utf8_append(t[b], cp);
    }
    return t;
  }();
  return table;
}

int byte_from_unicode(char32_t cp) {
  static const std::unordered_map<char32_t, int> inverse = [] {
    std::unordered_map<char32_t, int> m;
    const auto& t = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      size_t len = 0;
      m[utf8_next(t[b], 0, &len)] = b;
    }
    return m;
  }();
  auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

// ---- the step pipeline ---------------------------------------------------------------------
namespace {

void split_digits(std::string_view s, bool individual, std::vector<std::string>& out) {
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const char32_t c = utf8_next(s, i, &len);
    if (is_number(c)) {
      size_t e = i + len;
      if (!individual) {
        while (e < s.size()) {
          size_t l2 = 0;
          if (!is_number(utf8_next(s, e, &l2))) break;
          e += l2;
        }
      }
      if (i > start) out.emplace_back(s.substr(start, i - start));
      out.emplace_back(s.substr(i, e - i));
      start = i = e;
    } else {
      i += len;
    }
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
}

void metaspace(const PreTokenizerStep& st, std::string_view s, bool first,
               std::vector<std::string>& out) {
  std::string t = replace_all(s, " ", st.replacement);
  const bool starts = t.compare(0, st.replacement.size(), st.replacement) == 0;
  if (!starts && (st.prepend_scheme == "always" || (st.prepend_scheme == "first" && first)))
    t = st.replacement + t;
  if (!st.split) {
    out.push_back(std::move(t));
    return;
  }
  // MergedWithNext: each replacement char starts a new piece.
  size_t start = 0;
  for (size_t p = t.find(st.replacement, 1); p != std::string::npos;
       p = t.find(st.replacement, p + 1)) {
    if (p > start) out.push_back(t.substr(start, p - start));
    start = p;
  }
  if (start < t.size()) out.push_back(t.substr(start));
}

}  // namespace

std::string normalize_replace(std::string_view s, std::string_view from, std::string_view to) {
  return replace_all(s, from, to);
}

std::vector<std::string> pre_tokenize(const std::vector<PreTokenizerStep>& steps,
                                      std::string_view text, bool first) {
  std::vector<std::string> cur{std::string(text)};
  std::vector<std::string> next;
  for (const auto& st : steps) {
    next.clear();
    for (size_t idx = 0; idx < cur.size(); ++idx) {
      const std::string& piece = cur[idx];
      switch (st.kind) {
        case PreTokenizerStep::Kind::Split:
          split_by_pattern(st.pattern, piece, next);
          break;
        case PreTokenizerStep::Kind::Digits:
          split_digits(piece, st.individual_digits, next);
          break;
        case PreTokenizerStep::Kind::Metaspace:
          metaspace(st, piece, first && idx == 0, next);
          break;
        case PreTokenizerStep::Kind::ByteLevel: {
          std::string p = piece;
          if (st.add_prefix_space && (p.empty() || p[0] != ' ')) p = " " + p;
          std::vector<std::string> parts;
          if (st.use_regex) split_by_pattern(SplitPattern::Gpt2, p, parts);
          else parts.push_back(std::move(p));
          const auto& map = byte_to_unicode();
          for (const auto& part : parts) {
            std::string mapped;
            mapped.reserve(part.size() * 2);
            for (unsigned char b : part) mapped += map[b];
            next.push_back(std::move(mapped));
          }
          break;
        }
      }
    }
    std::swap(cur, next);
  }
  return cur;
}

}  // namespace kvlab::detail
