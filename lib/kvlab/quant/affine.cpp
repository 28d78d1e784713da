#include "kvlab/quant/affine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// The group of flat element f (see affine.h).
struct GroupIndex {
  AffineGroups groups;
  int64_t group, d, a;  // group size, last dimension, row blocks (channel)
  int64_t operator()(int64_t f) const {
    if (groups == AffineGroups::flat) return f / group;
    return (f % d) * a + (f / d) / group;
  }
};

GroupIndex group_index(const at::Tensor& x, int64_t group, AffineGroups groups, int64_t* n_groups) {
  const int64_t n = x.numel(), d = x.size(-1);
  if (groups == AffineGroups::flat) {
    KVLAB_CHECK(n % group == 0, "affine_quantize: {} elements are not whole groups of {}", n, group);
    *n_groups = n / group;
    return {groups, group, d, 0};
  }
  const int64_t rows = n / d;
  KVLAB_CHECK(rows % group == 0, "affine_quantize: {} rows of {} channels are not whole groups of {}", rows, d, group);
  *n_groups = d * (rows / group);
  return {groups, group, d, rows / group};
}

}  // namespace

AffineQuantized affine_quantize(const at::Tensor& x, int bits, int64_t group, AffineGroups groups) {
  KVLAB_CHECK(bits == 2 || bits == 4 || bits == 8, "affine_quantize: bits must be 2, 4 or 8, got {}", bits);
  KVLAB_CHECK(group >= 1, "affine_quantize: group must be >= 1, got {}", group);
  KVLAB_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1 && x.numel() > 0,
              "affine_quantize: a non-empty float32 tensor expected");
  const at::Tensor src = x.contiguous().cpu();
  int64_t n_groups = 0;
  const GroupIndex gi = group_index(src, group, groups, &n_groups);
  const float* p = src.data_ptr<float>();
  const int64_t n = src.numel();
  std::vector<float> lo(static_cast<size_t>(n_groups), std::numeric_limits<float>::infinity());
  std::vector<float> hi(static_cast<size_t>(n_groups), -std::numeric_limits<float>::infinity());
  for (int64_t f = 0; f < n; ++f) {
    const auto g = static_cast<size_t>(gi(f));
    lo[g] = std::min(lo[g], p[f]);
    hi[g] = std::max(hi[g], p[f]);
  }
  AffineQuantized q;
  q.bits = bits, q.group = group, q.groups = groups;
  q.scale = at::empty({n_groups}, at::kFloat);
  q.shift = at::empty({n_groups}, at::kFloat);
  float* scale = q.scale.data_ptr<float>();
  float* shift = q.shift.data_ptr<float>();
  const float levels = static_cast<float>((1 << bits) - 1);
  for (int64_t g = 0; g < n_groups; ++g) {
    const float range = hi[static_cast<size_t>(g)] - lo[static_cast<size_t>(g)];
    scale[g] = range / levels;
    shift[g] = -lo[static_cast<size_t>(g)];
  }
  q.codes = at::empty(src.sizes(), at::TensorOptions().dtype(at::kByte));
  uint8_t* c = q.codes.data_ptr<uint8_t>();
  for (int64_t f = 0; f < n; ++f) {
    const int64_t g = gi(f);
    if (scale[g] == 0.0f) {  // zero range: quanto's 0/0 cast to uint8 (0 on x86); x_hat = min exactly
      c[f] = 0;
      continue;
    }
    const float t = std::nearbyint((p[f] + shift[g]) / scale[g]);  // float32, ties to even
    c[f] = static_cast<uint8_t>(std::clamp(t, 0.0f, levels));
  }
  return q;
}

at::Tensor affine_dequantize(const AffineQuantized& q) {
  int64_t n_groups = 0;
  const GroupIndex gi = group_index(q.codes, q.group, q.groups, &n_groups);
  KVLAB_CHECK(q.scale.numel() == n_groups && q.shift.numel() == n_groups,
              "affine_dequantize: {} groups expected, got {} scales and {} shifts", n_groups, q.scale.numel(),
              q.shift.numel());
  at::Tensor out = at::empty(q.codes.sizes(), at::kFloat);
  const uint8_t* c = q.codes.data_ptr<uint8_t>();
  const float* scale = q.scale.data_ptr<float>();
  const float* shift = q.shift.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t f = 0; f < q.codes.numel(); ++f) {
    const int64_t g = gi(f);
    const float scaled = scale[g] * static_cast<float>(c[f]);
    o[f] = scaled - shift[g];
  }
  return out;
}

int64_t affine_bytes(const AffineQuantized& q, int64_t param_bytes) {
  KVLAB_CHECK(param_bytes == 2 || param_bytes == 4, "affine_bytes: parameters of 2 or 4 bytes, got {}", param_bytes);
  const int64_t code_bits = q.codes.numel() * q.bits;
  return (code_bits + 7) / 8 + 2 * param_bytes * q.scale.numel();
}

}  // namespace kvlab
