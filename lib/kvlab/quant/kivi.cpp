#include "kvlab/quant/kivi.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// One operation's result in the block's dtype.
float in_dtype(float v, bool half) { return half ? static_cast<float>(static_cast<at::Half>(v)) : v; }

// The parameter index of element (h, t, d): keys [h, d, t / G], values [h, t, d / G].
struct KiviIndex {
  bool keys;
  int64_t n, d, g;
  int64_t operator()(int64_t h, int64_t t, int64_t c) const {
    return keys ? (h * d + c) * (n / g) + t / g : (h * n + t) * (d / g) + c / g;
  }
};

}  // namespace

KiviBlock kivi_quantize(const at::Tensor& x, bool keys, int bits, int64_t group, bool half) {
  KVLAB_CHECK(bits == 2 || bits == 4 || bits == 8, "kivi: bits must be 2, 4 or 8, got {}", bits);
  KVLAB_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "kivi: [H, n, D] float32 expected");
  const int64_t H = x.size(0), n = x.size(1), D = x.size(2);
  KVLAB_CHECK(group >= 1 && (keys ? n : D) % group == 0, "kivi: {} {} are not whole groups of {}",
              keys ? n : D, keys ? "tokens" : "channels", group);
  const at::Tensor src = x.contiguous().cpu();
  const float* p = src.data_ptr<float>();
  KiviBlock q;
  q.keys = keys, q.bits = bits, q.group = group, q.half = half;
  const std::vector<int64_t> pshape = keys ? std::vector<int64_t>{H, D, n / group} : std::vector<int64_t>{H, n, D / group};
  const at::Tensor lo = at::full(pshape, std::numeric_limits<float>::infinity(), at::kFloat);
  const at::Tensor hi = at::full(pshape, -std::numeric_limits<float>::infinity(), at::kFloat);
  float* l = lo.data_ptr<float>();
  float* u = hi.data_ptr<float>();
  const KiviIndex idx{keys, n, D, group};
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < D; ++c) {
        const float v = p[(h * n + t) * D + c];
        const int64_t i = idx(h, t, c);
        l[i] = std::min(l[i], v), u[i] = std::max(u[i], v);
      }
  const float levels = static_cast<float>((1 << bits) - 1);
  q.mn = lo;
  q.scale = at::empty(pshape, at::kFloat);
  float* s = q.scale.data_ptr<float>();
  for (int64_t i = 0; i < q.scale.numel(); ++i) s[i] = in_dtype(in_dtype(u[i] - l[i], half) / levels, half);
  q.codes = at::empty({H, n, D}, at::TensorOptions().dtype(at::kByte));
  uint8_t* code = q.codes.data_ptr<uint8_t>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < D; ++c) {
        const int64_t f = (h * n + t) * D + c, i = idx(h, t, c);
        if (s[i] == 0.0f) {
          code[f] = 0;
          continue;
        }
        const float ratio = in_dtype(in_dtype(p[f] - l[i], half) / s[i], half);
        code[f] = static_cast<uint8_t>(std::nearbyint(std::clamp(ratio, 0.0f, levels)));
      }
  return q;
}

at::Tensor kivi_dequantize(const KiviBlock& q) {
  const int64_t H = q.codes.size(0), n = q.codes.size(1), D = q.codes.size(2);
  const KiviIndex idx{q.keys, n, D, q.group};
  at::Tensor out = at::empty({H, n, D}, at::kFloat);
  const uint8_t* code = q.codes.data_ptr<uint8_t>();
  const float* s = q.scale.data_ptr<float>();
  const float* m = q.mn.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < D; ++c) {
        const int64_t f = (h * n + t) * D + c, i = idx(h, t, c);
        const float scaled = in_dtype(static_cast<float>(code[f]) * s[i], q.half);
        o[f] = in_dtype(scaled + m[i], q.half);
      }
  return out;
}

int64_t kivi_bytes(const KiviBlock& q) {
  return (q.codes.numel() * q.bits + 7) / 8 + 2 * (q.half ? 2 : 4) * q.scale.numel();
}

int64_t kivi_quantized_tokens(int64_t T, int64_t residual, bool keys) {
  KVLAB_CHECK(T >= 0 && residual >= 1, "kivi: T must be >= 0 and the residual length >= 1");
  return keys ? T - T % residual : T - std::min(T, residual);
}

}  // namespace kvlab
