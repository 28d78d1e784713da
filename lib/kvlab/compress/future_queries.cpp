// future_queries.h: the prompt's pre-RoPE queries and the average future rotation.
#include "kvlab/compress/future_queries.h"

#include "kvlab/attention/rope.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab::detail {

at::Tensor average_rope_rotation(const at::Tensor& inv_freq, int64_t t0, int64_t count) {
  auto [cos, sin] = rope_cos_sin(inv_freq.to(at::kCPU), t0, count, at::kDouble);  // [F, d] each
  const int64_t d = cos.size(1), h = d / 2;
  auto p = at::zeros({d, d}, at::kDouble);
  p.narrow(0, h, h).narrow(1, 0, h).copy_(at::eye(h, at::kDouble));
  p.narrow(0, 0, h).narrow(1, h, h).copy_(-at::eye(h, at::kDouble));
  // row i of R(t): cos_i e_i + sin_i P_i.
  return at::diag(cos.mean(0)) + sin.mean(0).unsqueeze(1) * p;  // [d, d]
}

PreRopeQueries pre_rope_queries(const LayerKV& kv, int64_t n_sink, const std::string& method) {
  require_queries(kv, method);
  KVLAB_CHECK(kv.context.has(inputs::rope_inv_freq), "{}: the region came without the model's RoPE "
              "frequencies (input rope_inv_freq), needed to undo RoPE on the queries", method);
  auto q = kv.queries.to(at::kCPU, at::kDouble);                                     // [Hq, n_obs, d]
  auto qpos = query_positions(kv).to(at::kCPU, at::kLong);                           // [n_obs]
  auto use = qpos.ge(n_sink).nonzero().squeeze(1);                                   // queries past the sinks
  KVLAB_CHECK(use.numel() > 0, "{}: no query past the first n_sink={} positions", method, n_sink);
  q = q.index_select(1, use);
  qpos = qpos.index_select(0, use);
  const int64_t h_q = q.size(0), m = q.size(1);
  auto inv = kv.context.get(inputs::rope_inv_freq).to(at::kCPU);
  auto q_pre = rotate_by(q, (-qpos).unsqueeze(0).expand({h_q, m}).contiguous(), inv);  // [Hq, m, d]
  return {q_pre, qpos, inv};
}

}  // namespace kvlab::detail
