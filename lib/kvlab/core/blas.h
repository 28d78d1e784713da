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
  std::string core;       // the kernels a DYNAMIC_ARCH OpenBLAS chose ("Haswell", "SkylakeX"; "" = unknown)
};

BlasInfo blas_info();
// Sets the BLAS's own thread count where it has one (OpenBLAS); LibTorch's is at::set_num_threads.
void set_blas_threads(int n);

// A warning when OPENBLAS_CORETYPE pins a DYNAMIC_ARCH OpenBLAS to AVX2 kernels ("Haswell",
// "Zen") on a CPU with AVX-512 (F, BW, DQ, VL), else "". kvlab respects the variable (someone set
// it, perhaps for results that match across machines) but says what it costs: on this project's
// Zen 5 machines, where the environment sets OPENBLAS_CORETYPE=Haswell, OpenBLAS's own choice
// (Cooperlake) runs a 1024^3 sgemm at 189 instead of 107 GFLOP/s and prefill of 4096 tokens at
// 425 instead of 262 tokens/s on one thread (issue 13).
std::string blas_core_warning();

// The OPENBLAS_CORETYPE a process should run under, "" = leave it as it is: when the variable is
// unset, a DYNAMIC_ARCH OpenBLAS chose kernels without AVX-512 (its own choice, not a pin) and the
// CPU has AVX-512 (F, BW, DQ, VL), "Cooperlake" (with AVX512_BF16) or "SkylakeX". OpenBLAS 0.3.21
// does not know CPUs newer than itself (Sapphire Rapids) and falls back to its SSE3 kernels
// ("Prescott"): there, prefill of 1,432 tokens of SmolLM2-135M on one thread took 32.1 s, and
// 9.8 s with Cooperlake's (2026-12-07). OpenBLAS reads the variable once, when it is loaded, so
// kvlab's main and the tests' main set it and execute themselves again (/proc/self/exe).
std::string blas_core_to_pin();

}  // namespace kvlab
