// KIVI (Liu et al. 2024, arXiv 2402.02750; jy-yuan/KIVI @ 876b4d2; docs/quantization.md §5): keys
// quantized per channel over groups of G tokens, values per token over groups of G channels,
// asymmetric, with the most recent tokens in full precision. Per group:
//
//   scale = (max - min) / (2^b - 1),  code = round_half_even(clamp((x - min) / scale, 0, 2^b - 1))
//   x_hat = code * scale + min           (code 0 for a zero-range group: x_hat = min)
//
// in the model's dtype: float32, or float16 (each operation rounded to half, as the official PyTorch
// reference; computed in float32 and rounded, which is exact for one operation on half inputs).
// Windows (R a multiple of G): after T tokens, keys hold the first T - T mod R quantized (whole blocks
// of R) and T mod R in full precision; values the first T - min(T, R) quantized (one token at a time
// as it leaves the window) and the last min(T, R) in full precision. The state depends on T only.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

struct KiviBlock {
  at::Tensor codes;  // uint8 [H, n, D], 0 .. 2^bits - 1
  at::Tensor scale;  // float32 [H, D, n / G] (keys) or [H, n, D / G] (values); half-representable when half
  at::Tensor mn;     // same shape as scale: the group's minimum
  bool keys = true;
  int bits = 2;
  int64_t group = 32;
  bool half = false;
};

// x: [H, n, D] float32 (half-representable when `half`); keys: n a multiple of G; values: D.
KiviBlock kivi_quantize(const at::Tensor& x, bool keys, int bits, int64_t group, bool half);
at::Tensor kivi_dequantize(const KiviBlock& q);  // [H, n, D] float32

// The bytes a quantized block holds: its codes packed `bits` to a code and a scale and a minimum per
// group in the model's dtype (2 bytes for float16, 4 for float32): b/8 + 2p/G bytes an element.
int64_t kivi_bytes(const KiviBlock& q);

// How many of T tokens are quantized under KIVI's windows (above), for keys or values.
int64_t kivi_quantized_tokens(int64_t T, int64_t residual, bool keys);

}  // namespace kvlab
