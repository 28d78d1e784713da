// blas_core_to_pin (core/blas.h): a test process never runs on OpenBLAS's fallback kernels without
// AVX-512 on a CPU that has it, unless the user pinned them (tests/doctest_main.cpp executes itself
// again with OPENBLAS_CORETYPE, as kvlab's main does). Before the pin, on Sapphire Rapids with
// OpenBLAS 0.3.21 this process ran on "Prescott" (SSE3) kernels.
#include <doctest/doctest.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include "kvlab/core/blas.h"

using namespace kvlab;

TEST_CASE("blas: OpenBLAS runs on AVX-512 kernels where the CPU has them and nobody pinned others") {
  const BlasInfo b = blas_info();
  MESSAGE("BLAS " << b.name << ", core " << b.core);
  // After doctest_main's exec the pin is in place, so there is nothing left to pin.
  CHECK(blas_core_to_pin() == "");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (!avx512 || b.name.find("DYNAMIC_ARCH") == std::string::npos) return;
  std::string core = b.core;
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool avx512_kernels = core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  const char* pin = std::getenv("OPENBLAS_CORETYPE");
  INFO("OPENBLAS_CORETYPE=" << std::string(pin ? pin : "(unset)"));
  CHECK((avx512_kernels || pin != nullptr));
  // A pin kvlab chose names AVX-512 kernels; any other pin is the user's (blas_core_warning says what it costs).
  if (pin && (std::string(pin) == "Cooperlake" || std::string(pin) == "SkylakeX")) CHECK(avx512_kernels);
#endif
}
