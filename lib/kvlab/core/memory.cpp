#include "kvlab/core/memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvlab {

namespace {
int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string k = key;
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size()));
  return -1;
}
}  // namespace

int64_t peak_rss_kib() { return status_kib("VmHWM:"); }
int64_t current_rss_kib() { return status_kib("VmRSS:"); }

int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? int64_t(pages) * int64_t(size) : -1;
}

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace kvlab
