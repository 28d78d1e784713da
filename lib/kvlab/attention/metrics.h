// Single-layer error metrics of docs/methods.md §2, accumulated in double.
// All per-query quantities use causal attention: query j (absolute position p_j) sees keys ≤ p_j.
#pragma once

#include <ATen/ATen.h>

namespace kvlab {

// What the metrics need from exact attention, for queries at the last n_q positions of n.
struct ExactReference {
  at::Tensor out;      // [n_q_heads, n_q, head_dim]  exact output o_j (double)
  at::Tensor prob_l2;  // [n_q_heads, n_q]            ‖softmax(K q_j/√d)‖₂ over keys ≤ p_j
  at::Tensor v_frob;   // [n_kv_heads, n_q]           ‖V_{≤p_j}‖_F
  at::Tensor v_op;     // [n_kv_heads, n_q]           ‖V_{≤p_j}‖_op (largest singular value)
};

// q [n_q_heads, n_q, head_dim], k, v [n_kv_heads, n, head_dim] (any float dtype).
ExactReference exact_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

struct ErrorMetrics {
  // rel_err = mean_{h,j} ‖z_hj − o_hj‖₂ / ‖o_hj‖₂                       (BalanceKV §4.1)
  double rel_err = 0;
  // bound_ratio_F = mean_{h,j} ‖z_hj − o_hj‖₂ / (‖softmax_hj‖₂ ‖V_{≤j}‖_F)   (BalanceKV Eq. 2)
  double bound_ratio_F = 0;
  // bound_ratio_op = same with ‖V_{≤j}‖_op                                  (SubGen Eq. 3)
  double bound_ratio_op = 0;
  // cosine = mean_{h,j} ⟨z_hj, o_hj⟩ / (‖z_hj‖₂ ‖o_hj‖₂)
  double cosine = 0;
  // rel_err_clamped: the BalanceKV notebook's variant, ‖z − o‖ / ‖clamp(o, min=1e-8)‖ (drops
  // negative entries of o from the norm); offered for comparison with the release only.
  double rel_err_clamped = 0;
};

// z [n_q_heads, n_q, head_dim]: the approximation to compare against `ref`.
ErrorMetrics compare_to_exact(const at::Tensor& z, const ExactReference& ref);

// mass_recall = mean_{h,j} Σ_{i kept by h's KV head} p_hj(i): the exact attention mass that lands on
// kept tokens (selection methods only).
// probs [n_q_heads, n_q, n] exact probabilities; kept [n_kv_heads, n] bool.
double mass_recall(const at::Tensor& probs, const at::Tensor& kept);

}  // namespace kvlab
