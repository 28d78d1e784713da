// The process's resident memory, from /proc/self/status (Linux; -1 elsewhere).
#pragma once

#include <cstdint>

namespace kvlab {

int64_t peak_rss_kib();     // VmHWM: the most resident since the process started
int64_t current_rss_kib();  // VmRSS

}  // namespace kvlab
