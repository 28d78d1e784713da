// HQQ (Badri & Shaji 2023, "Half-Quadratic Quantization"; mobiusml/hqq 0.2.8.post1,
// hqq/core/quantize.py and optimize.py), the "hqq" backend of transformers' QuantizedCache
// (docs/quantization.md §3). Per group, s an inverse scale and z a zero point in code units:
//
//   s = (2^b - 1) / (max - min)   (1 where |max - min| <= 1e-4; at most 2e4),  z = -min * s
//   up to 20 proximal steps on z only (lp norm 0.7, beta 10), stopping when the mean |x - x_hat|
//   over the whole tensor stops falling (the z of that last step is kept):
//     q = clamp(round(x s + z), 0, 2^b - 1);  x_r = (q - z) / s;  e = shrink(x - x_r)
//     z = mean over the group of (q - (x - e) s)
//   code = clamp(round(x s + z), 0, 2^b - 1);  stored scale = 1 / s, zero = z
//   x_hat = (code - zero) * scale
//
// Groups: rows (HQQ axis 1) = g consecutive elements in flat order (per token when D == g);
// columns (axis 0, transformers' default) = the tensor reshaped to [g, numel / g], one group per
// column (a strided set mixing tokens, heads and channels, re-formed as the cache grows).
// Computed with ATen's float32 ops as HQQ's on CPU; the stopping rule is global and the 20 steps
// amplify rounding, so results match HQQ's within a tolerance, not bit for bit (§3: 4e-4).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

enum class HqqGroups { rows, columns };

struct HqqQuantized {
  at::Tensor codes;  // uint8, the input's shape
  at::Tensor scale;  // [n_groups] float32 (1 / s), in group order (rows: f / g; columns: f mod n_groups)
  at::Tensor zero;   // [n_groups] float32, code units
  int bits = 4;
  int64_t group = 64;
  HqqGroups groups = HqqGroups::rows;
  int steps = 0;     // optimiser steps taken
};

// x float32, numel a multiple of `group`; bits in {2, 4, 8}.
HqqQuantized hqq_quantize(const at::Tensor& x, int bits, int64_t group, HqqGroups groups);
at::Tensor hqq_dequantize(const HqqQuantized& q);  // float32, the codes' shape
// Codes packed `bits` to a code, a scale and a zero per group of `param_bytes` each.
int64_t hqq_bytes(const HqqQuantized& q, int64_t param_bytes = 4);

}  // namespace kvlab
