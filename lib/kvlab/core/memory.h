// The process's resident memory, from /proc/self/status (Linux; -1 elsewhere).
#pragma once

#include <cstdint>

namespace kvlab {

int64_t peak_rss_kib();     // VmHWM: the most resident since the process started
int64_t current_rss_kib();  // VmRSS
// The machine's physical memory in bytes (sysconf; -1 when unknown): the bound a command checks a
// count against before it allocates (issue 50).
int64_t physical_memory_bytes();

// Hands the allocator's free pages back to the system (glibc's malloc_trim; a no-op elsewhere).
// glibc keeps freed heap memory for reuse: after a task record's 73 branch caches (thousands of
// tensors under its mmap threshold) were freed, a RULER 4k worker stayed at 6.8 GB resident into
// the next record and peaked at 10.7 GB during it (9.6 GB in a fresh process). Called between
// records: on two 4k records of 37 branches, 6.41 GB resident fell to 1.04 GB between them.
void release_free_memory();

}  // namespace kvlab
