#include "kvlab/attention/metrics.h"

#include "kvlab/attention/attention.h"
#include "kvlab/core/check.h"

namespace kvlab {

ExactReference exact_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(1), n_q = q.size(1), h_kv = k.size(0);
  auto qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  ExactReference ref;
  ref.out = exact_attention(qd, kd, vd, /*causal=*/true);                  // [Hq, n_q, d]
  auto probs = exact_attention_probs(qd, kd, /*causal=*/true);              // [Hq, n_q, n]
  ref.prob_l2 = probs.pow(2).sum(-1).sqrt();                                 // [Hq, n_q]

  // Gram matrices of the causal prefixes: G_j = V_{≤p_j}ᵀ V_{≤p_j}, built from the prefix before
  // the first query plus a cumulative sum of the tail's outer products.
  const int64_t start = n - n_q;
  auto head = vd.narrow(1, 0, start + 1);                                    // [Hkv, start+1, d]
  auto g0 = at::matmul(head.transpose(1, 2), head);                          // [Hkv, d, d]
  auto tail = vd.narrow(1, start + 1, n_q - 1);                              // [Hkv, n_q-1, d]
  auto outer = tail.unsqueeze(-1) * tail.unsqueeze(-2);                      // [Hkv, n_q-1, d, d]
  auto grams = at::cat({g0.unsqueeze(1), g0.unsqueeze(1) + outer.cumsum(1)}, 1);  // [Hkv, n_q, d, d]
  ref.v_frob = grams.diagonal(0, -2, -1).sum(-1).clamp_min(0).sqrt();       // [Hkv, n_q]
  auto eig = at::linalg_eigvalsh(grams);                                     // [Hkv, n_q, d] ascending
  ref.v_op = eig.select(-1, eig.size(-1) - 1).clamp_min(0).sqrt();          // [Hkv, n_q]
  (void)h_kv;
  return ref;
}

ErrorMetrics compare_to_exact(const at::Tensor& z, const ExactReference& ref) {
  KVLAB_CHECK(z.sizes() == ref.out.sizes(), "metrics: approximation has shape {} but exact output has {}",
              z.sizes(), ref.out.sizes());
  auto zd = z.to(at::kDouble);
  const auto& o = ref.out;
  const int64_t h_q = o.size(0), h_kv = ref.v_frob.size(0), g = h_q / h_kv;
  auto err = (zd - o).pow(2).sum(-1).sqrt();                                 // [Hq, n_q]
  auto o_norm = o.pow(2).sum(-1).sqrt();                                     // [Hq, n_q]
  auto z_norm = zd.pow(2).sum(-1).sqrt();
  // Query head h = kv * g + j uses KV head kv: expand the per-KV-head norms to query heads.
  auto v_frob = ref.v_frob.repeat_interleave(g, 0);                          // [Hq, n_q]
  auto v_op = ref.v_op.repeat_interleave(g, 0);
  ErrorMetrics m;
  m.rel_err = (err / o_norm.clamp_min(1e-300)).mean().item<double>();
  m.bound_ratio_F = (err / (ref.prob_l2 * v_frob).clamp_min(1e-300)).mean().item<double>();
  m.bound_ratio_op = (err / (ref.prob_l2 * v_op).clamp_min(1e-300)).mean().item<double>();
  m.cosine = ((zd * o).sum(-1) / (z_norm * o_norm).clamp_min(1e-300)).mean().item<double>();
  auto clamped = o.clamp_min(1e-8).pow(2).sum(-1).sqrt();
  m.rel_err_clamped = (err / clamped).mean().item<double>();
  return m;
}

double mass_recall(const at::Tensor& probs, const at::Tensor& kept) {
  const int64_t h_q = probs.size(0), h_kv = kept.size(0), g = h_q / h_kv;
  KVLAB_CHECK(kept.size(1) == probs.size(2), "mass_recall: kept mask covers {} tokens, probs {}",
              kept.size(1), probs.size(2));
  auto mask = kept.to(probs.scalar_type()).repeat_interleave(g, 0).unsqueeze(1);  // [Hq, 1, n]
  return (probs * mask).sum(-1).to(at::kDouble).mean().item<double>();
}

}  // namespace kvlab
