// KVLAB_CLONES: a function GCC builds for AVX-512, for AVX2+FMA and for the baseline, the one to
// run picked when the program loads. kvlab builds for baseline x86-64 (SSE2), so plain loops
// that the compiler vectorises (the decode kernels of issue 25) would otherwise never use the
// wide registers of the machine they run on. Elsewhere (clang, other CPUs) it is nothing.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KVLAB_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KVLAB_CLONES
#endif

#include <cstdint>

namespace kvlab {

// Partial sums per dot product in the decode kernels: one AVX-512 register of floats.
constexpr int64_t kSimdLanes = 16;

// Σ_c a[c] b[c] over n floats: kSimdLanes partial sums, then the lanes, then the tail. Always
// inlined, so it takes the instruction set of the KVLAB_CLONES function that calls it.
__attribute__((always_inline)) inline float dot_lanes(const float* a, const float* b, int64_t n) {
  const int64_t nv = n / kSimdLanes * kSimdLanes;
  float lanes[kSimdLanes] = {};
  for (int64_t c = 0; c < nv; c += kSimdLanes)
    for (int64_t l = 0; l < kSimdLanes; ++l) lanes[l] += a[c + l] * b[c + l];
  float s = 0.f;
  for (int64_t l = 0; l < kSimdLanes; ++l) s += lanes[l];
  for (int64_t c = nv; c < n; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace kvlab
