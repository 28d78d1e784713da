// release_free_memory (core/memory.h): freed heap memory goes back to the system.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvlab/core/memory.h"

using namespace kvlab;

// AddressSanitizer (-DKVLAB_USE_ASAN=ON) replaces malloc: the blocks are not on glibc's heap.
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_TEST_ASAN 1
#endif
#endif

TEST_CASE("release_free_memory returns freed heap pages that glibc would keep") {
#if !defined(__GLIBC__) || !defined(__linux__) || defined(KVLAB_TEST_ASAN)
  MESSAGE("not glibc's allocator on Linux: nothing to measure");
#else
  // 24,000 blocks of 12 KiB (~280 MiB; each under glibc's mmap threshold, so on the heap), every
  // page written; then every block but the last is freed. The live block at the top keeps glibc
  // from shrinking the heap by itself, as a record's long-lived allocations do in a task run.
  constexpr int kBlocks = 24000;
  constexpr size_t kBytes = 12 * 1024;
  std::vector<char*> blocks(kBlocks);
  for (auto& b : blocks) {
    b = static_cast<char*>(std::malloc(kBytes));
    REQUIRE(b != nullptr);
    std::memset(b, 1, kBytes);
  }
  for (int i = 0; i + 1 < kBlocks; ++i) std::free(blocks[i]);
  const int64_t kept = current_rss_kib();
  release_free_memory();
  const int64_t after = current_rss_kib();
  std::free(blocks.back());
  INFO("resident before " << kept << " KiB, after " << after << " KiB");
  CHECK(kept - after > 200 * 1024);  // most of the ~280 MiB freed
#endif
}
