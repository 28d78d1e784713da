// Which tokens of a sample an analysis uses: every stride-th position from `skip_first`, the
// stride the smallest that keeps at most `max_points` of them (0: all).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

// [m] int64 ascending positions in [skip_first, n_tokens); errors name --skip-first / --max-points.
// last > 0: only the sample's last `last` positions (e.g. the tokens a dump generated, --generate);
// errors name --last too.
at::Tensor strided_positions(int64_t n_tokens, int64_t skip_first, int64_t max_points, int64_t last = 0);

}  // namespace kvlab
