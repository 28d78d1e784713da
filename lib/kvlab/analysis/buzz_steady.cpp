// Streams unit tokens through BuzzCache (one KV head, 1-dimensional keys) and counts.
#include "kvlab/analysis/buzz_steady.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "kvlab/compress/buzz.h"
#include "kvlab/core/check.h"

namespace kvlab {

BuzzSteadyState buzz_steady_state(int64_t capacity, int64_t n_sink, int64_t stride, double ratio, int64_t evictions,
                                  int64_t warmup) {
  KVLAB_CHECK(ratio > 0, "--t-over-w must be > 0, got {}", ratio);
  KVLAB_CHECK(n_sink >= 0 && capacity - n_sink >= 3, "--cache-size {} leaves fewer than 3 entries beside {} sinks",
              capacity, n_sink);
  KVLAB_CHECK(stride >= 3, "--stride must be >= 3 (old samples are thinned by ⌊(s+1)/2⌋ >= 2), got {}", stride);
  KVLAB_CHECK(evictions > warmup && warmup >= 0, "buzz_steady_state: evictions ({}) must exceed warmup ({})", evictions,
              warmup);
  // Each eviction streams about T tokens through the cache: 2^63-1 ran for ever (issue 50). The
  // steady state settles within a few hundred.
  constexpr int64_t kMaxEvictions = 1000000;
  KVLAB_CHECK(evictions <= kMaxEvictions, "--evictions must be <= {} (the steady state settles within a few "
              "hundred), got {}", kMaxEvictions, evictions);
  BuzzSteadyState r;
  r.t_over_w_asked = ratio;
  r.n_sink = n_sink;
  r.stride = stride;
  r.window = std::max<int64_t>(1, std::llround(double(capacity - n_sink) / (1 + ratio)));
  r.threshold = capacity - n_sink - r.window;
  KVLAB_CHECK(r.threshold >= 1, "--t-over-w {} at --cache-size {} leaves no threshold", ratio, capacity);
  r.t_over_w = double(r.threshold) / double(r.window);
  r.theorem_ratio = buzz_theorem_ratio(stride);
  r.fixed_point = double(r.threshold + 1) / r.theorem_ratio;

  BuzzConfig c;
  c.n_sink = n_sink;
  c.window = r.window;
  c.threshold = r.threshold;
  c.stride = stride;
  BuzzCache cache(c, 1);
  auto one = at::zeros({1, 1, 1}, at::kDouble);  // [1 head, 1 token, 1 dim]: counts only
  double sum = 0;
  int64_t counted = 0;
  r.sampled_min = INT64_MAX;
  for (int64_t t = 0; r.evictions < evictions; ++t) {
    if (cache.append(one, one, at::full({1}, t, at::kLong), {})) {
      ++r.evictions;
      if (r.evictions > warmup) {
        sum += double(cache.n_old());
        ++counted;
        r.sampled_min = std::min(r.sampled_min, cache.n_old());
        r.sampled_max = std::max(r.sampled_max, cache.n_old());
      }
    }
    r.peak_size = std::max(r.peak_size, cache.size());
  }
  r.sampled_mean = sum / double(counted);
  r.sampled_over_window = r.sampled_mean / double(r.window);
  return r;
}

}  // namespace kvlab
