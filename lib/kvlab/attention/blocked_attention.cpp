#include "kvlab/attention/blocked_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// Default tile: about 2^16 scores (256 KiB in float32, within L2), at least 256 keys so the GEMMs
// stay wide; decoding (a few query rows) then takes thousands of keys per tile, few ATen calls.
int64_t default_block(int64_t h_kv, int64_t rows) {
  return std::clamp<int64_t>((int64_t{1} << 16) / std::max<int64_t>(1, h_kv * rows), 256, 16384);
}
// The running max starts here rather than at -inf so that a row whose keys are all masked so far
// gives e^(m−m') = 1, not NaN (the reference clamps its max the same way).
constexpr double kNoMax = -1e30;

bool is_reduced(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// A per-entry tensor [n] or [n_kv_heads, n], narrowed to [b0, b0+bl) and shaped to broadcast
// against scores [n_kv_heads, rows, bl].
at::Tensor block_row(const at::Tensor& t, int64_t b0, int64_t bl) {
  at::Tensor b = t.narrow(-1, b0, bl);
  return t.dim() == 1 ? b.view({1, 1, bl}) : b.unsqueeze(1);
}

struct Running {
  at::Tensor m;  // [Hkv, R, 1] running max
  at::Tensor l;  // [Hkv, R, 1] running Σ e^(s − m)
  at::Tensor o;  // [Hkv, R, dv] running Σ e^(s − m) v (undefined for a denominator set)
};

// The online-softmax recurrence of one set. qg [Hkv, R, d] already scaled; q_pos_g [R] int64 or
// undefined; q_pos_min: the smallest query position (blocks whose keys all sit at or before it
// need no mask).
Running accumulate(const at::Tensor& qg, const KVSet& set, const at::Tensor& q_pos_g,
                   int64_t q_pos_min, int64_t window, bool with_values, int64_t block,
                   at::ScalarType wt) {
  const int64_t h_kv = qg.size(0), rows = qg.size(1), n = set.keys.size(1);
  const auto opts = qg.options();
  Running r;
  r.m = at::full({h_kv, rows, 1}, kNoMax, opts);
  r.l = at::zeros({h_kv, rows, 1}, opts);
  if (with_values) r.o = at::zeros({h_kv, rows, set.values.size(2)}, opts);

  const bool masked = q_pos_g.defined() && set.pos.defined();
  std::vector<int64_t> block_max_pos;  // host copy: which blocks need a mask at all
  if (masked) {
    at::Tensor p = set.pos.to(at::kCPU, at::kLong).contiguous();
    if (p.dim() == 2) p = std::get<0>(p.max(0));  // [n]: the latest position over heads
    const int64_t* pp = p.data_ptr<int64_t>();
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      int64_t mx = std::numeric_limits<int64_t>::min();
      for (int64_t j = b0; j < std::min(n, b0 + block); ++j) mx = std::max(mx, pp[j]);
      block_max_pos.push_back(mx);
    }
  }
  at::Tensor keys = set.keys.to(wt), values = with_values ? set.values.to(wt) : at::Tensor();
  at::Tensor bias = set.bias.defined() ? set.bias.to(wt) : at::Tensor();
  // One score buffer for every tile: a fresh tensor per tile cost a page fault per 4 KiB when
  // the prefill's (KV head, query block) items ran on two threads (exact_cache.cpp).
  at::Tensor s_buf = at::empty({h_kv, rows, std::min(block, n)}, qg.options());  // [Hkv, R, block]
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t bl = std::min(block, n - b0);
    at::Tensor s = bl == s_buf.size(2) ? s_buf : at::empty({h_kv, rows, bl}, qg.options());
    at::bmm_out(s, qg, keys.narrow(1, b0, bl).transpose(1, 2));  // [Hkv, R, bl]
    if (bias.defined()) s.add_(block_row(bias, b0, bl));
    if (masked && block_max_pos[bi] > q_pos_min)
      s.masked_fill_(block_row(set.pos, b0, bl) > q_pos_g.view({1, rows, 1}),
                     -std::numeric_limits<double>::infinity());
    if (masked && window > 0)  // sliding window: keys at or before query - window
      s.masked_fill_(block_row(set.pos, b0, bl) <= q_pos_g.view({1, rows, 1}) - window,
                     -std::numeric_limits<double>::infinity());
    at::Tensor m_new = at::maximum(r.m, s.amax(-1, /*keepdim=*/true));  // [Hkv, R, 1]
    s.sub_(m_new).exp_();                                               // e^(s − m')
    at::Tensor alpha = (r.m - m_new).exp_();                            // e^(m − m')
    r.l.mul_(alpha).add_(s.sum(-1, /*keepdim=*/true));
    if (with_values) r.o.mul_(alpha).baddbmm_(s, values.narrow(1, b0, bl));
    r.m = m_new;
  }
  return r;
}

}  // namespace

at::Tensor attention_blocked(const at::Tensor& q, const KVSet& num, const KVSet* den,
                             const AttentionOptions& opt, int64_t block) {
  KVLAB_CHECK(q.dim() == 3, "attention: q must be [n_q_heads, n_q, head_dim], got {} dims", q.dim());
  KVLAB_CHECK(num.keys.dim() == 3 && num.values.dim() == 3,
              "attention: keys/values must be [n_kv_heads, n, head_dim]");
  const int64_t h_q = q.size(0), n_q = q.size(1), d = q.size(2);
  const int64_t h_kv = num.keys.size(0);
  KVLAB_CHECK(h_kv > 0 && h_q % h_kv == 0, "attention: n_q_heads={} is not a multiple of n_kv_heads={}",
              h_q, h_kv);
  KVLAB_CHECK(num.keys.size(2) == d, "attention: head_dim of q is {} but keys have {}", d,
              num.keys.size(2));
  KVLAB_CHECK(den == nullptr || den->keys.size(0) == h_kv,
              "attention: queries grouped into {} KV heads but the denominator set has {}", h_kv,
              den->keys.size(0));
  KVLAB_CHECK(num.keys.size(1) > 0 && (den == nullptr || den->keys.size(1) > 0),
              "attention: an empty cache set ({} entries; denominator {})", num.keys.size(1),
              den ? std::to_string(den->keys.size(1)) : "none");
  const int64_t g = h_q / h_kv;
  if (block <= 0) block = default_block(h_kv, g * n_q);
  const double scale = opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const at::ScalarType wt = is_reduced(q.scalar_type()) ? at::kFloat : q.scalar_type();

  // Query head h = kv * g + j: the g query heads of a KV head form one block of rows.
  at::Tensor qg = (q.to(wt) * (scale * opt.logit_scale)).reshape({h_kv, g * n_q, d});  // [Hkv, R, d]
  at::Tensor q_pos_g;
  int64_t q_pos_min = 0;
  if (opt.query_pos.defined()) {
    q_pos_g = opt.query_pos.to(at::kLong).repeat({g});  // [R]
    q_pos_min = opt.query_pos.numel() ? opt.query_pos.min().item<int64_t>() : 0;
  }
  Running nr = accumulate(qg, num, q_pos_g, q_pos_min, opt.window, /*with_values=*/true, block, wt);
  at::Tensor out;  // [Hkv, R, dv]
  if (den == nullptr) {
    out = nr.o / nr.l;
  } else {
    Running dr = accumulate(qg, *den, q_pos_g, q_pos_min, opt.window, /*with_values=*/false, block, wt);
    at::Tensor m = at::maximum(nr.m, dr.m);
    out = (nr.o * (nr.m - m).exp_()) / (dr.l * (dr.m - m).exp_());
  }
  return out.to(q.scalar_type()).reshape({h_q, n_q, out.size(-1)});
}

}  // namespace kvlab
