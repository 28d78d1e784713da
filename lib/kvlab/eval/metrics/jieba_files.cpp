#include "kvlab/eval/metrics/jieba_files.h"

#include "kvlab/core/check.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kvlab::eval {

std::string jieba_default_dir() {
  if (const char* d = std::getenv("KVLAB_JIEBA_DIR"); d && *d) return d;
  return "/usr/lib/python3/dist-packages/jieba";
}

std::string read_jieba_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVLAB_CHECK(in.good(),
              "jieba data file not found: {} (the Chinese metrics read jieba 0.42.1's dictionary "
              "and HMM tables at run time: run `apt-get install python3-jieba`, or set "
              "KVLAB_JIEBA_DIR to a folder holding dict.txt and finalseg/prob_*.py)",
              path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvlab::eval
