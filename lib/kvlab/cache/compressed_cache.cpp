#include "kvlab/cache/compressed_cache.h"

#include <chrono>

#include "kvlab/compress/layout.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {
int64_t nbytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t set_bytes(const KVSet& s) { return nbytes(s.keys) + nbytes(s.values) + nbytes(s.bias) + nbytes(s.pos); }

// [a; b] along the entries (b's pos is [Hkv, m]).
KVSet concat(const KVSet& a, const KVSet& b) {
  if (a.keys.size(1) == 0) return b;
  KVSet out;
  out.keys = at::cat({a.keys, b.keys.to(a.keys.scalar_type())}, 1);
  if (b.values.defined()) out.values = at::cat({a.values, b.values.to(a.values.scalar_type())}, 1);
  out.bias = at::cat({a.bias, b.bias.to(a.bias.scalar_type())}, 1);
  out.pos = at::cat({a.pos, b.pos}, 1);
  return out;
}
}  // namespace

int64_t CompressedLayer::bytes() const {
  return set_bytes(num) + set_bytes(den) + (stream ? set_bytes(stream->held()) : 0) +
         (stream && stream->den() ? set_bytes(*stream->den()) : 0);
}

int64_t CompressedLayer::entries() const {
  return num.keys.size(1) + (stream ? stream->held().keys.size(1) : 0);
}

CompressedLayer compress_layer(const Compressor& c, const CompressOptions& opt, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& q_obs, int64_t keep_first, int64_t keep_last,
                               int layer, int n_layers, double* compress_ms, bool stream) {
  const int64_t n = k.size(1), n_obs = q_obs.defined() ? q_obs.size(1) : 0;
  const int64_t end = n - std::min(n, keep_last), begin = std::min(keep_first, end);
  LayerKV region = region_of(k, v, begin, end, q_obs,
                             n_obs ? at::arange(n - n_obs, n, k.options().dtype(at::kLong)) : at::Tensor(), layer,
                             n_layers);
  CompressedLayer out;
  out.n_positions = n;
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<LayerStream> s = stream ? c.start_stream(region, opt) : nullptr;
  if (s) {
    KVLAB_CHECK(keep_last == 0, "--keep-last {}: {} streams while decoding and keeps its own recent window; "
                "--keep-last applies to prefill-only methods (or give --prefill-only)", keep_last, c.name());
    out.num = assemble(k, v, begin, n, k.narrow(1, 0, 0), v.narrow(1, 0, 0),
                       at::zeros({k.size(0), 0}, k.options()));  // the prefix [0, begin) only
    out.stream = std::move(s);
  } else {
    CompressedKV cr = end > begin ? c.compress(region, opt) : keep_all(region);
    out.num = assemble(k, v, begin, end, cr.keys, cr.values, cr.bias);
    if (cr.has_separate_den()) out.den = assemble(k, v, begin, end, cr.den_keys, at::Tensor(), cr.den_bias);
    out.logit_scale = cr.logit_scale;
  }
  if (compress_ms) *compress_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

CompressedAttention::CompressedAttention(std::vector<CompressedLayer> layers) : layers_(std::move(layers)) {
  for (const auto& l : layers_) peak_.push_back(l.bytes());
}

at::Tensor CompressedAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                       const at::Tensor& v_new, int64_t pos0) {
  CompressedLayer& l = layers_.at(layer);
  KVLAB_CHECK(pos0 == l.n_positions, "compressed cache: layer {} is at position {} but the forward starts at {}",
              layer, l.n_positions, pos0);
  l.n_positions += k_new.size(1);
  AttentionOptions ao;
  ao.query_pos = at::arange(pos0, pos0 + q.size(1), q.options().dtype(at::kLong));  // [T]
  at::Tensor out;
  if (l.stream) {
    l.stream->push(k_new, v_new, pos0);
    ao.logit_scale = l.stream->logit_scale();
    if (const KVSet* d = l.stream->den()) {
      const KVSet den = concat(l.num, *d);  // the exact prefix is in both sets
      out = attention(q, concat(l.num, l.stream->held()), &den, ao);
    } else {
      out = attention(q, concat(l.num, l.stream->held()), nullptr, ao);
    }
    peak_[layer] = std::max(peak_[layer], l.bytes());
    l.stream->settle(q, l.num.keys.size(1) ? l.num.keys : at::Tensor());
  } else {
    append_exact(l.num, k_new, v_new, pos0);
    if (l.has_den()) append_exact(l.den, k_new, at::Tensor(), pos0);
    ao.logit_scale = l.logit_scale;
    out = attention(q, l.num, l.has_den() ? &l.den : nullptr, ao);
    peak_[layer] = std::max(peak_[layer], l.bytes());
  }
  return out;
}

void CompressedAttention::reset() {
  KVLAB_FAIL("a compressed cache is built from a prefill and cannot start a new sequence");
}

int64_t CompressedAttention::bytes() const {
  int64_t b = 0;
  for (const auto& l : layers_) b += l.bytes();
  return b;
}

int64_t CompressedAttention::peak_bytes() const {
  int64_t b = 0;
  for (int64_t p : peak_) b += p;
  return b;
}

}  // namespace kvlab
