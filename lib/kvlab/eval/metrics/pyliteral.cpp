#include "kvlab/eval/metrics/pyliteral.h"

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/unicode.h"

#include <cstdlib>

namespace kvlab::eval {

namespace {

class Parser {
 public:
  Parser(std::string_view text, size_t pos, const std::string& where)
      : s_(text), i_(pos), where_(where) {}

  PyLiteral value() {
    skip_ws();
    KVLAB_CHECK(i_ < s_.size(), "{}: unexpected end of file in a Python literal", where_);
    if (s_[i_] == '{') return dict();
    PyLiteral v;
    v.number = number();
    return v;
  }

 private:
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }

  void expect(char c) {
    skip_ws();
    KVLAB_CHECK(i_ < s_.size() && s_[i_] == c, "{}: expected '{}' at byte {} of a Python literal",
                where_, c, i_);
    ++i_;
  }

  PyLiteral dict() {
    PyLiteral d;
    d.is_dict = true;
    expect('{');
    skip_ws();
    while (i_ < s_.size() && s_[i_] != '}') {
      std::u32string key = string();
      expect(':');
      d.items.emplace_back(std::move(key), value());
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') ++i_;
      skip_ws();
    }
    expect('}');
    return d;
  }

  double number() {
    size_t j = i_;
    while (j < s_.size() && std::string_view("+-0123456789.eE").find(s_[j]) != std::string_view::npos)
      ++j;
    KVLAB_CHECK(j > i_, "{}: expected a number at byte {}", where_, i_);
    std::string tok(s_.substr(i_, j - i_));
    char* end = nullptr;
    double v = std::strtod(tok.c_str(), &end);
    KVLAB_CHECK(end == tok.c_str() + tok.size(), "{}: bad number '{}' at byte {}", where_, tok, i_);
    i_ = j;
    return v;
  }

  char32_t hex(size_t digits) {
    KVLAB_CHECK(i_ + digits <= s_.size(), "{}: short escape at byte {}", where_, i_);
    char32_t c = 0;
    for (size_t k = 0; k < digits; ++k) {
      char h = s_[i_ + k];
      int d = (h >= '0' && h <= '9') ? h - '0'
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                       : -1;
      KVLAB_CHECK(d >= 0, "{}: bad hex digit in an escape at byte {}", where_, i_ + k);
      c = c * 16 + static_cast<char32_t>(d);
    }
    i_ += digits;
    return c;
  }

  std::u32string string() {
    skip_ws();
    KVLAB_CHECK(i_ < s_.size() && (s_[i_] == '\'' || s_[i_] == '"'),
                "{}: expected a string key at byte {}", where_, i_);
    const char quote = s_[i_++];
    std::string raw;  // UTF-8 of the literal's characters
    while (true) {
      KVLAB_CHECK(i_ < s_.size(), "{}: unterminated string", where_);
      char c = s_[i_++];
      if (c == quote) break;
      if (c != '\\') {
        raw.push_back(c);
        continue;
      }
      KVLAB_CHECK(i_ < s_.size(), "{}: unterminated escape", where_);
      char e = s_[i_++];
      switch (e) {
        case 'u': utf8_append(raw, hex(4)); break;
        case 'U': utf8_append(raw, hex(8)); break;
        case 'x': utf8_append(raw, hex(2)); break;
        case 'n': raw.push_back('\n'); break;
        case 'r': raw.push_back('\r'); break;
        case 't': raw.push_back('\t'); break;
        case '\\': case '\'': case '"': raw.push_back(e); break;
        default: KVLAB_FAIL("{}: unsupported escape '\\{}' at byte {}", where_, e, i_ - 1);
      }
    }
    return utf8_decode(raw);
  }

  std::string_view s_;
  size_t i_;
  const std::string& where_;
};

}  // namespace

PyLiteral parse_py_assignment(std::string_view text, std::string_view name,
                              const std::string& where) {
  size_t line = 0;
  while (line < text.size()) {
    size_t eol = text.find('\n', line);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(line, eol - line);
    if (l.substr(0, name.size()) == name) {
      size_t k = name.size();
      while (k < l.size() && l[k] == ' ') ++k;
      if (k < l.size() && l[k] == '=') return Parser(text, line + k + 1, where).value();
    }
    line = eol + 1;
  }
  KVLAB_FAIL("{}: no line assigns '{}' (expected jieba's `{}={{...}}` table)", where, name, name);
}

}  // namespace kvlab::eval
