// The BLAS LibTorch's CPU matmuls run on (found at run time with dlsym, no link dependency): what
// it is, how it threads, and setting its thread count. OpenBLAS built on pthreads keeps a thread
// pool of its own that fights LibTorch's OpenMP threads (prefill ~4x slower on 2 cores);
// scripts/setup.sh selects the OpenMP build.
#pragma once

#include <string>

namespace kvlab {

struct BlasInfo {
  std::string name;       // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." (openblas_get_config), or "unknown"
  std::string threading;  // "openmp" | "pthread" | "sequential" | "unknown"
  int threads = 0;        // its thread count (0 = unknown)
};

BlasInfo blas_info();
// Sets the BLAS's own thread count where it has one (OpenBLAS); LibTorch's is at::set_num_threads.
void set_blas_threads(int n);

}  // namespace kvlab
