// FP8 E4M3 ("float8_e4m3fn": 1 sign bit, 4 exponent bits of bias 7, 3 mantissa bits; no infinities,
// NaN = S.1111.111, the largest value 448) written at bit level, since LibTorch 1.13 has no float8
// type. As torch 2.15's float32 cast (docs/quantization.md §4): round to nearest, ties to even,
// subnormals (multiples of 2^-9) kept; |x| >= 448 and ±inf saturate to ±448; NaN stays NaN.
// Serving engines store cast(x / scale) and read float(code) * scale; the scale is the caller's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

uint8_t fp8_e4m3_encode(float x);
float fp8_e4m3_decode(uint8_t code);

// Elementwise: x float32 (any shape) -> codes uint8 of the same shape; codes -> float32.
at::Tensor fp8_e4m3_encode(const at::Tensor& x);
at::Tensor fp8_e4m3_decode(const at::Tensor& codes);

}  // namespace kvlab
