// A reader for the Python dict literals jieba ships as its HMM tables
// (jieba/finalseg/prob_start.py, prob_trans.py, prob_emit.py: `P={'B': {'\u4e00': -3.65, ...}}`):
// string keys (with \uXXXX, \UXXXXXXXX, \xXX and the one-letter escapes), float values
// (strtod, which reads a Python float literal to the same double), nested dicts. Nothing else.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlab::eval {

struct PyLiteral {
  bool is_dict = false;
  double number = 0;                                      // when !is_dict
  std::vector<std::pair<std::u32string, PyLiteral>> items;  // when is_dict, in file order
};

// Parses the value assigned by the first line that starts with `name=` (or `name =`) in
// Python source `text`; `where` (a path) is named in errors, which throw kvlab::Error.
PyLiteral parse_py_assignment(std::string_view text, std::string_view name,
                              const std::string& where);

}  // namespace kvlab::eval
