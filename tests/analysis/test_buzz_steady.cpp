// BUZZ's simulated steady state against the old-sample recurrence iterated by hand and against
// Theorem 3.1: at T/w = ρ the sampled region settles at the window's size.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kvlab/analysis/buzz_steady.h"
#include "kvlab/core/check.h"

using namespace kvlab;

TEST_CASE("buzz steady state: the streamed cache follows a' = ceil(a/s_old) + ceil((T+1-a)/s)") {
  for (double ratio : {1.5, 4.5, 6.5}) {
    const auto s = buzz_steady_state(200, 4, 5, ratio, 300, 100);
    CHECK(s.window + s.threshold + s.n_sink == 200);
    // Iterate the recurrence by hand from an empty sampled region; the same mean over the same
    // evictions (the first eviction starts from a = 0, with T + 1 new tokens).
    int64_t a = 0;
    double sum = 0;
    int64_t lo = INT64_MAX, hi = 0;
    for (int e = 1; e <= 300; ++e) {
      a = (a + 2) / 3 + (s.threshold + 1 - a + 4) / 5;  // s_old = floor((5+1)/2) = 3, s_new = 5
      if (e > 100) sum += double(a), lo = std::min(lo, a), hi = std::max(hi, a);
    }
    CHECK(s.sampled_mean == doctest::Approx(sum / 200));
    CHECK(s.sampled_min == lo);
    CHECK(s.sampled_max == hi);
    CHECK(s.peak_size <= 200);
  }
}

TEST_CASE("buzz steady state: Theorem 3.1's ratio puts the sampled region at the window size") {
  const double rho = (25.0 + 1) / 6;  // s = 5 (odd): (s² + 1)/(s + 1) = 4.33
  const auto at = buzz_steady_state(200, 4, 5, rho);
  CHECK(at.theorem_ratio == doctest::Approx(rho));
  CHECK(at.sampled_over_window == doctest::Approx(1.0).epsilon(0.08));
  // Below ρ the window is the larger part (the sampled region ≈ (T+1)/ρ is small), above it the
  // sampled region outgrows the window.
  CHECK(buzz_steady_state(200, 4, 5, 1.5).sampled_over_window < 0.5);
  CHECK(buzz_steady_state(200, 4, 5, 6.5).sampled_over_window > 1.4);
  CHECK(buzz_steady_state(200, 4, 4, 3.0).theorem_ratio == doctest::Approx(3.0));  // even s: s − 1
  CHECK_THROWS_WITH_AS(buzz_steady_state(200, 4, 2, 3.0), doctest::Contains("--stride"), Error);
}
