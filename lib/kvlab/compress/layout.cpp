#include "kvlab/compress/layout.h"

namespace kvlab {

namespace {
at::Tensor positions(int64_t begin, int64_t end, const at::Tensor& like) {
  return at::arange(begin, end, like.options().dtype(at::kLong));
}
}  // namespace

LayerKV region_of(const at::Tensor& k, const at::Tensor& v, int64_t begin, int64_t end, const at::Tensor& q_obs,
                  const at::Tensor& obs_pos, int layer, int n_layers) {
  const int64_t n = k.size(1);
  const bool has_q = q_obs.defined() && q_obs.size(1) > 0;
  LayerKV region;
  region.keys = k.narrow(1, begin, end - begin);     // [Hkv, r, d]
  region.values = v.narrow(1, begin, end - begin);   // [Hkv, r, d]
  region.queries = has_q ? q_obs : at::Tensor();     // [Hq, n_obs, d]
  region.query_pos = has_q ? obs_pos : at::Tensor();  // [n_obs]
  region.pos0 = begin;
  region.prefix_keys = k.narrow(1, 0, begin);        // [Hkv, begin, d]
  region.suffix_keys = k.narrow(1, end, n - end);    // [Hkv, n - end, d]
  region.layer = layer;
  region.n_layers = n_layers;
  return region;
}

KVSet assemble(const at::Tensor& k, const at::Tensor& v, int64_t begin, int64_t end, const at::Tensor& ck,
               const at::Tensor& cv, const at::Tensor& cbias) {
  const int64_t h = k.size(0), n = k.size(1);
  auto hk = k.narrow(1, 0, begin), hv = v.narrow(1, 0, begin);
  auto tk = k.narrow(1, end, n - end), tv = v.narrow(1, end, n - end);
  const int64_t m = ck.size(1);
  auto zeros = [&](int64_t len) { return at::zeros({h, len}, k.options()); };
  KVSet s;
  s.keys = at::cat({hk, ck.to(k.scalar_type()), tk}, 1);
  s.values = cv.defined() ? at::cat({hv, cv.to(v.scalar_type()), tv}, 1) : at::Tensor();
  s.bias = at::cat({zeros(begin), cbias.defined() ? cbias.to(k.scalar_type()) : zeros(m), zeros(n - end)}, 1);
  auto pos = at::cat({positions(0, begin, k), at::full({m}, -1, k.options().dtype(at::kLong)), positions(end, n, k)});
  s.pos = pos.unsqueeze(0).expand({h, pos.size(0)}).contiguous();
  return s;
}

}  // namespace kvlab
