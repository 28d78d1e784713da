// The exact KV cache and causal GQA attention of the forward pass (query blocks, key tiles).
#include "kvlab/attention/exact_cache.h"

#include "kvlab/attention/blocked_attention.h"

#include <c10/util/Exception.h>

#include "kvlab/core/check.h"

#include <cmath>
#include <limits>

namespace kvlab {

at::Tensor causal_gqa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t pos0, int64_t query_block) {
  TORCH_INTERNAL_ASSERT(q.dim() == 3 && k.dim() == 3 && v.dim() == 3);
  const int64_t n_q_heads = q.size(0), T = q.size(1), d = q.size(2);
  const int64_t n_kv_heads = k.size(0), n = k.size(1);
  TORCH_INTERNAL_ASSERT(n_q_heads % n_kv_heads == 0 && n >= pos0 + T, "n_q_heads=", n_q_heads,
                        " n_kv_heads=", n_kv_heads, " n=", n, " pos0=", pos0, " T=", T);
  if (query_block <= 0) query_block = T;
  const at::Tensor pos = at::arange(pos0 + T, q.options().dtype(at::kLong));  // [pos0+T] key positions
  at::Tensor out = at::empty({n_q_heads, T, d}, q.options());
  for (int64_t b0 = 0; b0 < T; b0 += query_block) {
    const int64_t bl = std::min(query_block, T - b0);
    const int64_t nk = pos0 + b0 + bl;  // keys visible to the last query of the block
    // Key tiles with an online softmax (blocked_attention.h): only the last tile or two of a
    // block is masked, and no [rows, nk] score matrix is ever materialised.
    KVSet set{k.narrow(1, 0, nk), v.narrow(1, 0, nk), {}, pos.narrow(0, 0, nk)};
    AttentionOptions opt;
    opt.query_pos = pos.narrow(0, pos0 + b0, bl);                     // [bl]
    out.narrow(1, b0, bl).copy_(attention_blocked(q.narrow(1, b0, bl), set, nullptr, opt));
  }
  return out;
}

ExactAttention::ExactAttention(int64_t n_layers, int64_t query_block)
    : cache_(static_cast<size_t>(n_layers)), query_block_(query_block) {}

at::Tensor ExactAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                  const at::Tensor& v_new, int64_t pos0) {
  TORCH_INTERNAL_ASSERT(layer >= 0 && layer < static_cast<int>(cache_.size()));
  LayerCache& c = cache_[layer];
  KVLAB_CHECK(pos0 == c.n, "ExactAttention: layer {} holds {} positions but the forward starts at "
              "position {} (reset() before a new sequence)", layer, c.n, pos0);
  const int64_t T = k_new.size(1);
  const int64_t need = c.n + T;
  if (!c.k.defined() || c.k.size(1) < need) {
    int64_t cap = c.k.defined() ? c.k.size(1) : 0;
    cap = std::max<int64_t>(need, std::max<int64_t>(2 * cap, 64));
    // [Hkv, cap, d]
    at::Tensor k2 = at::empty({k_new.size(0), cap, k_new.size(2)}, k_new.options());
    at::Tensor v2 = at::empty({v_new.size(0), cap, v_new.size(2)}, v_new.options());
    if (c.n > 0) {
      k2.narrow(1, 0, c.n).copy_(c.k.narrow(1, 0, c.n));
      v2.narrow(1, 0, c.n).copy_(c.v.narrow(1, 0, c.n));
    }
    c.k = k2;
    c.v = v2;
  }
  c.k.narrow(1, c.n, T).copy_(k_new);
  c.v.narrow(1, c.n, T).copy_(v_new);
  c.n = need;
  return causal_gqa_attention(q, c.k.narrow(1, 0, c.n), c.v.narrow(1, 0, c.n), pos0, query_block_);
}

void ExactAttention::reset() {
  for (auto& c : cache_) c = LayerCache{};
}

int64_t ExactAttention::n_cached(int layer) const { return cache_.at(layer).n; }
at::Tensor ExactAttention::keys(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.k.narrow(1, 0, c.n) : at::Tensor();
}
at::Tensor ExactAttention::values(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.v.narrow(1, 0, c.n) : at::Tensor();
}

}  // namespace kvlab
