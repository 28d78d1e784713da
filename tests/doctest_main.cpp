#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include "kvlab/core/blas.h"

int main(int argc, char** argv) {
  // OpenBLAS's SSE3 fallback on a CPU it does not know (core/blas.h): run again on its AVX-512 kernels.
  if (const std::string core = kvlab::blas_core_to_pin(); !core.empty() && setenv("OPENBLAS_CORETYPE", core.c_str(), 1) == 0) {
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
  }
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
