#include "kvlab/cache/compressed_cache.h"

#include <chrono>

#include "kvlab/compress/layout.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {
int64_t nbytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

// Appends T exact entries at positions pos0.. to a set (bias 0).
void append_exact(KVSet& s, const at::Tensor& k, const at::Tensor& v, int64_t pos0) {
  const int64_t h = k.size(0), t = k.size(1);
  auto pos = at::arange(pos0, pos0 + t, s.pos.options()).unsqueeze(0).expand({h, t});  // [Hkv, T]
  s.keys = at::cat({s.keys, k.to(s.keys.scalar_type())}, 1);
  if (s.values.defined()) s.values = at::cat({s.values, v.to(s.values.scalar_type())}, 1);
  s.bias = at::cat({s.bias, at::zeros({h, t}, s.bias.options())}, 1);
  s.pos = at::cat({s.pos, pos}, 1);
}
}  // namespace

int64_t CompressedLayer::bytes() const {
  return nbytes(num.keys) + nbytes(num.values) + nbytes(num.bias) + nbytes(den.keys) + nbytes(den.bias);
}

CompressedLayer compress_layer(const Compressor& c, const CompressOptions& opt, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& q_obs, int64_t keep_first, int64_t keep_last,
                               int layer, int n_layers, double* compress_ms) {
  const int64_t n = k.size(1), n_obs = q_obs.defined() ? q_obs.size(1) : 0;
  const int64_t end = n - std::min(n, keep_last), begin = std::min(keep_first, end);
  LayerKV region = region_of(k, v, begin, end, q_obs,
                             n_obs ? at::arange(n - n_obs, n, k.options().dtype(at::kLong)) : at::Tensor(), layer,
                             n_layers);
  auto t0 = std::chrono::steady_clock::now();
  CompressedKV cr = end > begin ? c.compress(region, opt) : keep_all(region);
  if (compress_ms) *compress_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CompressedLayer out;
  out.num = assemble(k, v, begin, end, cr.keys, cr.values, cr.bias);
  if (cr.has_separate_den()) out.den = assemble(k, v, begin, end, cr.den_keys, at::Tensor(), cr.den_bias);
  out.logit_scale = cr.logit_scale;
  out.n_positions = n;
  return out;
}

CompressedAttention::CompressedAttention(std::vector<CompressedLayer> layers) : layers_(std::move(layers)) {}

at::Tensor CompressedAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                       const at::Tensor& v_new, int64_t pos0) {
  CompressedLayer& l = layers_.at(layer);
  KVLAB_CHECK(pos0 == l.n_positions, "compressed cache: layer {} is at position {} but the forward starts at {}",
              layer, l.n_positions, pos0);
  append_exact(l.num, k_new, v_new, pos0);
  if (l.has_den()) append_exact(l.den, k_new, at::Tensor(), pos0);
  l.n_positions += k_new.size(1);
  AttentionOptions ao;
  ao.query_pos = at::arange(pos0, pos0 + q.size(1), q.options().dtype(at::kLong));  // [T]
  ao.logit_scale = l.logit_scale;
  return attention(q, l.num, l.has_den() ? &l.den : nullptr, ao);
}

void CompressedAttention::reset() {
  KVLAB_FAIL("a compressed cache is built from a prefill and cannot start a new sequence");
}

int64_t CompressedAttention::bytes() const {
  int64_t b = 0;
  for (const auto& l : layers_) b += l.bytes();
  return b;
}

}  // namespace kvlab
