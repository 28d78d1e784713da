#include "kvlab/quant/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "kvlab/core/check.h"

namespace kvlab {

uint8_t fp8_e4m3_encode(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));  // exact; every step below is exact but the rounding
  if (a >= 448.0) return sign | 0x7E;                   // saturate (±inf too)
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal: a multiple m of 2^-9, m in [0, 8]; m = 8 is the smallest normal (0x08) exactly.
    const double m = std::nearbyint(std::ldexp(a, 9));  // the default rounding: to nearest, ties to even
    return sign | static_cast<uint8_t>(m);
  }
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exponent = e - 1;                // a = (2f) * 2^exponent, 2f in [1, 2)
  double mantissa = std::nearbyint((2 * f - 1) * 8);  // 0 .. 8 eighths
  if (mantissa == 8) mantissa = 0, ++exponent;
  // a < 448 rounds at most to 1.875 * 2^8 = 480, whose pattern is NaN: saturate instead.
  if (exponent > 8 || (exponent == 8 && mantissa == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | static_cast<int>(mantissa));
}

float fp8_e4m3_decode(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);  // (1 + m/8) 2^(e-7)
  return static_cast<float>((code & 0x80) ? -v : v);
}

at::Tensor fp8_e4m3_encode(const at::Tensor& x) {
  KVLAB_CHECK(x.scalar_type() == at::kFloat, "fp8_e4m3_encode: float32 expected, got {}", at::toString(x.scalar_type()));
  const at::Tensor src = x.contiguous().cpu();
  at::Tensor out = at::empty(src.sizes(), at::TensorOptions().dtype(at::kByte));
  const float* p = src.data_ptr<float>();
  uint8_t* q = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < src.numel(); ++i) q[i] = fp8_e4m3_encode(p[i]);
  return out;
}

at::Tensor fp8_e4m3_decode(const at::Tensor& codes) {
  KVLAB_CHECK(codes.scalar_type() == at::kByte, "fp8_e4m3_decode: uint8 codes expected, got {}",
              at::toString(codes.scalar_type()));
  const at::Tensor src = codes.contiguous().cpu();
  at::Tensor out = at::empty(src.sizes(), at::TensorOptions().dtype(at::kFloat));
  const uint8_t* p = src.data_ptr<uint8_t>();
  float* q = out.data_ptr<float>();
  for (int64_t i = 0; i < src.numel(); ++i) q[i] = fp8_e4m3_decode(p[i]);
  return out;
}

}  // namespace kvlab
