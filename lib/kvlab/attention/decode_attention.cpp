#include "kvlab/attention/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/core/simd.h"

namespace kvlab {

namespace {
bool rows_ok(const at::Tensor& t, int64_t h, int64_t n, int64_t d) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3 && t.size(0) == h &&
         t.size(1) == n && t.size(2) == d && t.stride(2) == 1 && (n <= 1 || t.stride(1) == d);
}
}  // namespace

bool one_query_applies(const at::Tensor& q, const KVSet& num, const KVSet* den) {
  if (den != nullptr || !q.device().is_cpu() || q.scalar_type() != at::kFloat || q.dim() != 3 || q.size(1) != 1)
    return false;
  if (!num.keys.defined() || num.keys.dim() != 3) return false;
  const int64_t h = num.keys.size(0), n = num.keys.size(1), d = q.size(2);
  if (n == 0 || h == 0 || q.size(0) % h != 0) return false;
  if (!rows_ok(num.keys, h, n, d) || !rows_ok(num.values, h, n, num.values.defined() ? num.values.size(2) : 0))
    return false;
  if (num.bias.defined() && !(num.bias.device().is_cpu() && num.bias.scalar_type() == at::kFloat &&
                              num.bias.dim() == 2 && num.bias.size(0) == h && num.bias.size(1) == n &&
                              (n <= 1 || num.bias.stride(1) == 1)))
    return false;
  if (num.pos.defined() && !(num.pos.device().is_cpu() && num.pos.scalar_type() == at::kLong &&
                             (num.pos.dim() == 1 || (num.pos.dim() == 2 && num.pos.size(0) == h)) &&
                             num.pos.size(-1) == n && (n <= 1 || num.pos.stride(-1) == 1)))
    return false;
  return true;
}

namespace {

// One KV head's group of g queries over its n entries: scores (dot products in float over 16
// lanes, then in double), masks, softmax and Σ p_j v_j in double. qv [g, d], K [n, d], V [n, dv]
// row-major; Bh [n] and Ph [n] may be null; s [g * n] and acc [dv] are scratch; out [g, dv].
KVLAB_CLONES void one_group(const float* qv, int64_t g, int64_t d, const float* K, const float* V, int64_t n,
                            int64_t dv, const float* Bh, const int64_t* Ph, int64_t qp, int64_t window, double scale,
                            double* s, double* acc, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float* k = K + i * d;
    const bool masked = Ph && (Ph[i] > qp || (window > 0 && Ph[i] <= qp - window));
    for (int64_t j = 0; j < g; ++j) {
      const float dot = dot_lanes(qv + j * d, k, d);
      s[j * n + i] = masked ? -std::numeric_limits<double>::infinity() : double(dot) * scale + (Bh ? double(Bh[i]) : 0.0);
    }
  }
  for (int64_t j = 0; j < g; ++j) {
    double* sj = s + j * n;
    // attention_blocked's running max starts at -1e30, so a row with every key masked gives 0/0.
    double mx = -1e30;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, sj[i]);
    double l = 0;
    std::fill(acc, acc + dv, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double p = std::exp(sj[i] - mx);
      if (p == 0.0) continue;
      l += p;
      const float* v = V + i * dv;
      for (int64_t c = 0; c < dv; ++c) acc[c] += p * double(v[c]);
    }
    float* o = out + j * dv;
    for (int64_t c = 0; c < dv; ++c) o[c] = static_cast<float>(acc[c] / l);
  }
}

}  // namespace

at::Tensor attention_one_query(const at::Tensor& q_in, const KVSet& num, const AttentionOptions& opt) {
  KVLAB_CHECK(one_query_applies(q_in, num, nullptr), "attention_one_query: arguments it does not take");
  const at::Tensor q = q_in.contiguous();  // [Hq, 1, d]
  const int64_t h_q = q.size(0), d = q.size(2), h_kv = num.keys.size(0), n = num.keys.size(1);
  const int64_t dv = num.values.size(2), g = h_q / h_kv;
  const double scale = (opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d))) * opt.logit_scale;
  const bool causal = opt.query_pos.defined() && num.pos.defined();
  const int64_t qp = causal ? opt.query_pos.reshape({-1})[0].item<int64_t>() : 0;
  at::Tensor out = at::empty({h_q, 1, dv}, q.options());
  const float* qd = q.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float* kd = num.keys.data_ptr<float>();
  const float* vd = num.values.data_ptr<float>();
  const float* bd = num.bias.defined() ? num.bias.data_ptr<float>() : nullptr;
  const int64_t* pd = causal ? num.pos.data_ptr<int64_t>() : nullptr;
  const int64_t ks0 = num.keys.stride(0), vs0 = num.values.stride(0);
  const int64_t bs0 = bd ? num.bias.stride(0) : 0, ps0 = pd && num.pos.dim() == 2 ? num.pos.stride(0) : 0;
  std::vector<double> s(static_cast<size_t>(g * n)), acc(static_cast<size_t>(dv));
  for (int64_t h = 0; h < h_kv; ++h)
    one_group(qd + h * g * d, g, d, kd + h * ks0, vd + h * vs0, n, dv, bd ? bd + h * bs0 : nullptr,
              pd ? pd + h * ps0 : nullptr, qp, opt.window, scale, s.data(), acc.data(), od + h * g * dv);
  return out;
}

}  // namespace kvlab
