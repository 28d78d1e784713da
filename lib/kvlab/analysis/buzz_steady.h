// BUZZ's sampled region in the steady state (BUZZ §3.4, Theorem 3.1, Table A / Fig. 4): for a
// cache of C entries = k sinks + window w + threshold T, stream tokens one at a time through
// BUZZ's own cache state (compress/buzz.h: entry counts never depend on scores) and record the
// number of old samples (the sampled region) after each eviction. Theorem 3.1 picks T/w so that
// this steady-state size equals w: ρ = (s² + 1)/(s + 1) for odd s, s − 1 for even s.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab {

struct BuzzSteadyState {
  double t_over_w_asked = 0;
  int64_t n_sink = 0, window = 0, threshold = 0, stride = 0;
  double t_over_w = 0;          // T / w as realised in integers
  double theorem_ratio = 0;     // ρ of Theorem 3.1 for this stride
  double fixed_point = 0;       // (T + 1) / ρ: the real fixed point of the old-sample recurrence
  double sampled_mean = 0;      // mean old samples after each eviction, first `warmup` evictions left out
  int64_t sampled_min = 0, sampled_max = 0;
  double sampled_over_window = 0;  // sampled_mean / w (1 at Theorem 3.1's optimum)
  int64_t evictions = 0;
  int64_t peak_size = 0;        // largest cache size seen between steps (<= C)
};

// Layout for a cache of `capacity` entries at T/w ≈ ratio: w = round((C − k)/(1 + ratio)), T = C − k − w.
// Streams until `evictions` evictions have run; the first `warmup` are transients.
BuzzSteadyState buzz_steady_state(int64_t capacity, int64_t n_sink, int64_t stride, double ratio,
                                  int64_t evictions = 200, int64_t warmup = 50);

}  // namespace kvlab
