// Errors: the library only ever throws kvlab::Error for bad user input (files, flags, configs);
// `main` is the only place that catches. Invariants use TORCH_INTERNAL_ASSERT.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace kvlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace kvlab

// KVLAB_CHECK(cond, "fmt {}", args...): throws kvlab::Error with the formatted message.
// Messages say what was expected, what was found, and which flag / file / key to change.
#define KVLAB_CHECK(cond, ...)                                  \
  do {                                                          \
    if (!(cond)) throw ::kvlab::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define KVLAB_FAIL(...) throw ::kvlab::Error(::fmt::format(__VA_ARGS__))
