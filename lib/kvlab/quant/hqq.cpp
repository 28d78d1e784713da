#include "kvlab/quant/hqq.h"

#include <limits>

#include "kvlab/core/check.h"

namespace kvlab {

HqqQuantized hqq_quantize(const at::Tensor& x, int bits, int64_t group, HqqGroups groups) {
  KVLAB_CHECK(bits == 2 || bits == 4 || bits == 8, "hqq: bits must be 2, 4 or 8, got {}", bits);
  KVLAB_CHECK(group >= 1 && x.numel() % group == 0, "hqq: {} elements are not whole groups of {}", x.numel(), group);
  const bool rows = groups == HqqGroups::rows;
  const int64_t dim = rows ? 1 : 0;
  const at::Tensor W = rows ? x.to(at::kFloat).reshape({-1, group}) : x.to(at::kFloat).reshape({group, -1});
  const double max_v = double((1 << bits) - 1);
  const at::Tensor mn = std::get<0>(W.min(dim, /*keepdim=*/true)), mx = std::get<0>(W.max(dim, /*keepdim=*/true));
  const at::Tensor denom = mx - mn;
  at::Tensor s = max_v / denom;
  s = at::where(denom.abs() <= 1e-4, at::ones_like(s), s).clamp_max(2e4);
  at::Tensor z = -mn * s;
  // optimize_weights_proximal_legacy (optimize.py), lp_norm 0.7, beta 10, 20 steps.
  const double beta = 10.0, p = 0.7;
  float best = std::numeric_limits<float>::infinity();
  HqqQuantized out;
  for (int i = 0; i < 20; ++i) {
    const at::Tensor q = at::round(W * s + z).clamp_(0, max_v);
    const at::Tensor r = (q - z) / s;
    const at::Tensor e = W - r;
    at::Tensor shrunk = e.abs();
    shrunk.sub_((1.0 / beta) * shrunk.pow(p - 1)).clamp_min_(0.0);
    shrunk.mul_(at::sign(e));
    z = at::mean(q - (W - shrunk) * s, dim, /*keepdim=*/true);
    ++out.steps;
    const float err = (W - r).abs().mean().item<float>();
    if (err < best) best = err;
    else break;
  }
  out.codes = at::round(W * s + z).clamp_(0, max_v).to(at::kByte).reshape(x.sizes());
  out.scale = (1.0 / s).reshape({-1}).contiguous();
  out.zero = z.reshape({-1}).contiguous();
  out.bits = bits, out.group = group, out.groups = groups;
  return out;
}

at::Tensor hqq_dequantize(const HqqQuantized& q) {
  const bool rows = q.groups == HqqGroups::rows;
  const at::Tensor c = rows ? q.codes.reshape({-1, q.group}) : q.codes.reshape({q.group, -1});
  const at::Tensor zero = rows ? q.zero.unsqueeze(1) : q.zero.unsqueeze(0);
  const at::Tensor scale = rows ? q.scale.unsqueeze(1) : q.scale.unsqueeze(0);
  return ((c.to(at::kFloat) - zero) * scale).reshape(q.codes.sizes());
}

int64_t hqq_bytes(const HqqQuantized& q, int64_t param_bytes) {
  return (q.codes.numel() * q.bits + 7) / 8 + 2 * param_bytes * q.scale.numel();
}

}  // namespace kvlab
