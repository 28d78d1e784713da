#include "kvlab/attention/attention.h"

#include <cmath>
#include <limits>

#include "kvlab/attention/blocked_attention.h"
#include "kvlab/attention/decode_attention.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// Broadcast a per-entry tensor given as [n] or [n_kv_heads, n] to [n_kv_heads, 1, n].
at::Tensor per_head_row(const at::Tensor& t, int64_t n_kv_heads) {
  if (t.dim() == 1) return t.view({1, 1, t.size(0)}).expand({n_kv_heads, 1, t.size(0)});
  return t.unsqueeze(1);
}

// Scores of grouped queries against one set: qg [Hkv, g*n_q, d] -> [Hkv, g*n_q, n], masked
// entries -inf. q_pos_g [g*n_q] is the query position of each grouped row.
at::Tensor set_scores(const at::Tensor& qg, const KVSet& set, double scale, double logit_scale,
                      const at::Tensor& q_pos_g, int64_t window) {
  const int64_t h_kv = set.keys.size(0);
  KVLAB_CHECK(qg.size(0) == h_kv, "attention: queries grouped into {} KV heads but the cache has {}",
              qg.size(0), h_kv);
  auto s = at::matmul(qg, set.keys.to(qg.scalar_type()).transpose(1, 2)) * (scale * logit_scale);
  if (set.bias.defined()) s = s + per_head_row(set.bias.to(s.scalar_type()), h_kv);
  if (q_pos_g.defined() && set.pos.defined()) {
    auto kp = per_head_row(set.pos, h_kv);                       // [Hkv, 1, n]
    auto masked = kp > q_pos_g.view({1, -1, 1});                  // [Hkv, g*n_q, n]
    if (window > 0) masked = masked | (kp <= q_pos_g.view({1, -1, 1}) - window);  // sliding window
    s = s.masked_fill(masked, -std::numeric_limits<double>::infinity());
  }
  return s;
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const KVSet& num, const KVSet* den,
                     const AttentionOptions& opt) {
  // One query position on the CPU in float32 (every decode step): plain loops, no ATen op per
  // step (decode_attention.h); everything else through key tiles.
  if (one_query_applies(q, num, den)) return attention_one_query(q, num, opt);
  return attention_blocked(q, num, den, opt);
}

at::Tensor attention_reference(const at::Tensor& q, const KVSet& num, const KVSet* den,
                               const AttentionOptions& opt) {
  KVLAB_CHECK(q.dim() == 3, "attention: q must be [n_q_heads, n_q, head_dim], got {} dims", q.dim());
  KVLAB_CHECK(num.keys.dim() == 3 && num.values.dim() == 3,
              "attention: keys/values must be [n_kv_heads, n, head_dim]");
  const int64_t h_q = q.size(0), n_q = q.size(1), d = q.size(2);
  const int64_t h_kv = num.keys.size(0);
  KVLAB_CHECK(h_kv > 0 && h_q % h_kv == 0, "attention: n_q_heads={} is not a multiple of n_kv_heads={}",
              h_q, h_kv);
  KVLAB_CHECK(num.keys.size(2) == d, "attention: head_dim of q is {} but keys have {}", d,
              num.keys.size(2));
  const int64_t g = h_q / h_kv;
  const double scale = opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d));

  // Query head h = kv * g + j: group the g query heads of each KV head into one block of rows.
  auto qg = q.reshape({h_kv, g * n_q, d});                        // [Hkv, g*n_q, d]
  at::Tensor q_pos_g;
  if (opt.query_pos.defined()) q_pos_g = opt.query_pos.repeat({g});  // [g*n_q]

  auto s_num = set_scores(qg, num, scale, opt.logit_scale, q_pos_g, opt.window);  // [Hkv, g*n_q, n]
  at::Tensor out;
  if (den == nullptr) {
    // Rows with every entry masked (cannot happen for causal caches) would give NaN; guard.
    auto m = std::get<0>(s_num.max(-1, true)).clamp_min(-1e30);    // [Hkv, g*n_q, 1]
    auto p = (s_num - m).exp();
    auto z = p.sum(-1, true);
    out = at::matmul(p, num.values.to(q.scalar_type())) / z;      // [Hkv, g*n_q, d]
  } else {
    auto s_den = set_scores(qg, *den, scale, opt.logit_scale, q_pos_g, opt.window);  // [Hkv, g*n_q, n_den]
    auto m = at::maximum(std::get<0>(s_num.max(-1, true)), std::get<0>(s_den.max(-1, true)))
                 .clamp_min(-1e30);
    auto numer = at::matmul((s_num - m).exp(), num.values.to(q.scalar_type()));
    auto denom = (s_den - m).exp().sum(-1, true);
    out = numer / denom;
  }
  return out.reshape({h_q, n_q, out.size(-1)});
}

at::Tensor tail_positions(int64_t n, int64_t n_q, const at::Tensor& like) {
  return at::arange(n - n_q, n, like.options().dtype(at::kLong));
}

at::Tensor exact_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           bool causal) {
  const int64_t n = k.size(1), n_q = q.size(1);
  KVLAB_CHECK(n_q <= n, "exact_attention: {} queries but only {} keys", n_q, n);
  // On CPU the causal case is the prefill's attention with the queries at the last n_q positions:
  // its (KV head, query block) items run in parallel (exact_cache.h).
  // Bad shapes go the general way, whose checks name them.
  const bool shapes_ok = q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) > 0 &&
                         q.size(0) % k.size(0) == 0 && k.size(2) == q.size(2) && v.size(1) == n && n > 0;
  if (causal && q.is_cpu() && shapes_ok) return causal_gqa_attention(q, k, v, /*pos0=*/n - n_q);
  KVSet set{k, v, {}, causal ? at::arange(n, k.options().dtype(at::kLong)) : at::Tensor()};
  AttentionOptions opt;
  if (causal) opt.query_pos = tail_positions(n, n_q, k);
  return attention(q, set, nullptr, opt);
}

at::Tensor exact_attention_probs(const at::Tensor& q, const at::Tensor& k, bool causal) {
  const int64_t h_q = q.size(0), n_q = q.size(1), d = q.size(2);
  const int64_t h_kv = k.size(0), n = k.size(1), g = h_q / h_kv;
  auto qg = q.reshape({h_kv, g * n_q, d});
  auto s = at::matmul(qg, k.to(q.scalar_type()).transpose(1, 2)) / std::sqrt(static_cast<double>(d));
  if (causal) {
    auto kp = at::arange(n, k.options().dtype(at::kLong)).view({1, 1, n});
    auto qp = tail_positions(n, n_q, k).repeat({g}).view({1, -1, 1});
    s = s.masked_fill(kp > qp, -std::numeric_limits<double>::infinity());
  }
  return at::softmax(s, -1).reshape({h_q, n_q, n});
}

}  // namespace kvlab
