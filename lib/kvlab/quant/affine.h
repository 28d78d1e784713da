// optimum-quanto's affine (asymmetric) group quantization, the "quanto" backend of transformers'
// QuantizedCache (docs/quantization.md §2), bit for bit in float32. Per group of elements:
//
//   scale = (max - min) / (2^b - 1),  shift = -min
//   code  = clamp(round_half_even((x + shift) / scale), 0, 2^b - 1)     (0 for a group of zero range)
//   x_hat = scale * code - shift                                         (that order, no fused multiply-add)
//
// Groups over a contiguous tensor whose last dimension is D (a cache layer [H, T, D]):
//   flat (quanto axis 0):     g consecutive elements in memory order, group f / g (D == g: per token);
//   channel (quanto axis -1): per channel d over g consecutive rows r of the [numel / D, D] view,
//                             group d * A + r / g with A = rows / g (per channel over g tokens).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

enum class AffineGroups { flat, channel };

struct AffineQuantized {
  at::Tensor codes;  // uint8, the input's shape: 0 .. 2^bits - 1
  at::Tensor scale;  // [n_groups] float32, in the group order above
  at::Tensor shift;  // [n_groups] float32 (-min)
  int bits = 4;
  int64_t group = 64;
  AffineGroups groups = AffineGroups::flat;
};

// x: float32, contiguous, at least one dimension; bits in {2, 4, 8}; its element count (flat) or row
// count (channel) a multiple of `group`, as quanto requires. Errors name what is wrong.
AffineQuantized affine_quantize(const at::Tensor& x, int bits, int64_t group, AffineGroups groups);
// float32, the codes' shape.
at::Tensor affine_dequantize(const AffineQuantized& q);

// The bytes the quantized tensor holds: its codes packed `bits` to a code (the last byte partly
// filled), and per group a scale and a shift of `param_bytes` each (4 for float32, 2 for the float16
// a half-precision cache stores; docs/quantization.md §2: b/8 + 2p/g bytes an element).
int64_t affine_bytes(const AffineQuantized& q, int64_t param_bytes = 4);

}  // namespace kvlab
