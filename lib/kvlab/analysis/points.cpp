#include "kvlab/analysis/points.h"

#include <algorithm>

#include "kvlab/core/check.h"

namespace kvlab {

at::Tensor strided_positions(int64_t n_tokens, int64_t skip_first, int64_t max_points, int64_t last) {
  KVLAB_CHECK(skip_first >= 0 && skip_first < n_tokens, "--skip-first must be in [0, {}) (the sample's tokens), got {}",
              n_tokens, skip_first);
  KVLAB_CHECK(max_points >= 0, "--max-points must be >= 0 (0: all tokens), got {}", max_points);
  KVLAB_CHECK(last >= 0 && last <= n_tokens, "--last must be in [0, {}] (the sample's tokens; 0: all), got {}",
              n_tokens, last);
  const int64_t begin = last > 0 ? std::max(skip_first, n_tokens - last) : skip_first;
  const int64_t avail = n_tokens - begin;
  const int64_t stride = max_points == 0 ? 1 : (avail + max_points - 1) / max_points;
  return at::arange(begin, n_tokens, stride, at::kLong);  // [ceil(avail / stride)]
}

}  // namespace kvlab
