// The exact KV cache and blocked causal GQA attention of the forward pass.
#include "kvlab/attention/exact_cache.h"

#include <c10/util/Exception.h>

#include "kvlab/core/check.h"

#include <cmath>
#include <limits>

namespace kvlab {

namespace {
bool is_reduced(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }
}  // namespace

at::Tensor causal_gqa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t pos0, int64_t query_block) {
  TORCH_INTERNAL_ASSERT(q.dim() == 3 && k.dim() == 3 && v.dim() == 3);
  const int64_t n_q_heads = q.size(0), T = q.size(1), d = q.size(2);
  const int64_t n_kv_heads = k.size(0), n = k.size(1);
  TORCH_INTERNAL_ASSERT(n_q_heads % n_kv_heads == 0 && n >= pos0 + T, "n_q_heads=", n_q_heads,
                        " n_kv_heads=", n_kv_heads, " n=", n, " pos0=", pos0, " T=", T);
  const int64_t G = n_q_heads / n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool reduced = is_reduced(q.scalar_type());
  if (query_block <= 0) query_block = T;

  at::Tensor q4 = q.view({n_kv_heads, G, T, d});        // [Hkv, G, T, d]
  at::Tensor out = at::empty({n_kv_heads, G, T, d}, q.options());
  // One score buffer for every block (sized for the largest), reused in place: fewer passes over
  // memory and no large allocation per block.
  const int64_t max_bl = std::min(query_block, T);
  at::Tensor s_buf = at::empty({n_kv_heads * G * max_bl * (pos0 + T)}, q.options());
  for (int64_t b0 = 0; b0 < T; b0 += query_block) {
    const int64_t bl = std::min(query_block, T - b0);
    const int64_t nk = pos0 + b0 + bl;  // keys visible to the last query of the block
    // Scaling q (small) instead of the scores saves a pass; exact when head_dim is a power of 4.
    at::Tensor qb = (q4.narrow(2, b0, bl) * scale).reshape({n_kv_heads, G * bl, d});  // [Hkv, G*bl, d]
    at::Tensor kb = k.narrow(1, 0, nk);                                        // [Hkv, nk, d]
    at::Tensor vb = v.narrow(1, 0, nk);                                        // [Hkv, nk, d]
    at::Tensor s = s_buf.narrow(0, 0, n_kv_heads * G * bl * nk).view({n_kv_heads, G * bl, nk});
    at::bmm_out(s, qb, kb.transpose(1, 2));  // [Hkv, G*bl, nk]  (baddbmm_out with beta=0 let
                                             // NaNs of the uninitialised buffer through in bf16)
    if (nk > pos0 + b0 + 1) {
      // query i (position pos0+b0+i) sees keys j <= pos0+b0+i.
      at::Tensor qi = at::arange(bl, q.options().dtype(at::kLong)).unsqueeze(1);   // [bl, 1]
      at::Tensor kj = at::arange(nk, q.options().dtype(at::kLong)).unsqueeze(0);   // [1, nk]
      at::Tensor mask = kj > (qi + (pos0 + b0));                                  // [bl, nk]
      s.view({n_kv_heads, G, bl, nk})
          .masked_fill_(mask, -std::numeric_limits<double>::infinity());
    }
    at::Tensor p;                                                                // [Hkv, G*bl, nk]
    if (reduced) {
      p = at::softmax(s, -1, at::kFloat).to(q.scalar_type());
    } else {
      p = at::softmax_out(s, s, -1);  // in place
    }
    at::Tensor ob = at::bmm(p, vb);                                              // [Hkv, G*bl, d]
    out.narrow(2, b0, bl).copy_(ob.view({n_kv_heads, G, bl, d}));
  }
  return out.view({n_q_heads, T, d});
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
