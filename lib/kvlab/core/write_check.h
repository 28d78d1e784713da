// The check after writing a file through a std::ostream: flushes first (a buffered line is not
// written until then), and the error names the file and why ("No space left on device"), not only
// that the write failed.
#pragma once

#include <cerrno>
#include <cstring>
#include <ostream>
#include <string>

#include "kvlab/core/check.h"

namespace kvlab {

inline void check_written(std::ostream& f, const std::string& path) {
  errno = 0;
  f.flush();
  if (f.good()) return;
  const int e = errno;
  KVLAB_FAIL("{}: write failed ({})", path, e != 0 ? std::strerror(e) : "the stream reported an error");
}

}  // namespace kvlab
