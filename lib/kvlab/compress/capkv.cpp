// capkv — keep the entries with the largest query-weighted leverage of their values (CAPKV).
//
// Source: "CAPKV" (arXiv:2604.25975), as NVIDIA kvpress 0.5.5 defines it: `CapPress`
//   (kvpress/presses/cap_press.py), the reference this file is checked against
//   (tests/generate/test_kvpress_golden.cpp).
//
// Summary. A historical-query anchor μ_q — the mean of the prompt's pre-RoPE queries past the
// sinks, moved to the next n_future_positions by the average RoPE rotation (expected_attention's
// step, future_queries.h) — weights each key by its alignment with it, w_i = exp(τ·cos(k_i, μ_q) −
// max_j τ·cos(k_j, μ_q)). The values are the output directions: with the capacity matrix
// A = I + Σ_j (w_j + ε) v_j v_jᵀ, entry i scores s_i = w_i · v_iᵀ A⁻¹ v_i (a weighted ridge leverage),
// per query head, averaged over the query heads of a KV head; the `budget` best are kept exact
// (bias 0). Positions below n_sink are always kept.
//
//   q_pre  [Hq, m, d] pre-RoPE queries at positions >= n_sink
//   anchor [Hq, d]    R̄ · mean(q_pre), unit length
//   w, s   [Hq, n']   over the region's entries past the sinks; A [Hq, d, d]
//   scores [Hkv, n]   float64 (+inf at positions < n_sink)
//
// Parameters: tau [5.0], n_future_positions [512], n_sink [4], epsilon [1e-6] (kvpress's defaults).
//
// Deviations and notes:
//   - Keys and anchor unit-normalised, and the per-head max shift, as kvpress (its notes 1–2; the
//     paper uses raw dot products).
//   - The queries: kvpress recomputes pre-RoPE queries from the hidden states; kvlab un-rotates the
//     post-RoPE queries it holds (exact up to rounding). In replay only the observation window's
//     queries, as expected_attention.
//   - The capacity matrix and the max shift run over the region's entries past the sinks: in
//     generation and the task commands the region is the whole prompt, as kvpress's layer.
//   - float64 throughout (kvpress: the model's dtype, the solve in float32). Ties to the lower index.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/future_queries.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

struct CapOptions {
  double tau = 5.0, epsilon = 1e-6;
  int64_t n_future = 512, n_sink = 4;
};

at::Tensor capkv_scores(const LayerKV& kv, const CapOptions& o) {
  const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), h_q = kv.n_q_heads(), g = h_q / h_kv;
  auto scores = at::full({h_kv, n}, std::numeric_limits<double>::infinity(), at::kDouble);  // [Hkv, n]
  const int64_t lo = std::max<int64_t>(0, o.n_sink - kv.pos0);  // region index of the first non-sink
  if (lo >= n) return scores;
  auto [q_pre, qpos, inv] = detail::pre_rope_queries(kv, o.n_sink, "capkv");     // [Hq, m, d], [m]
  const int64_t d = q_pre.size(2), n1 = n - lo;
  auto r = detail::average_rope_rotation(inv, qpos.max().item<int64_t>() + 1, o.n_future);  // [d, d]
  auto anchor = at::matmul(q_pre.mean(1), r.t());                                  // [Hq, d]
  anchor = anchor / anchor.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12);
  auto k = kv.keys.to(at::kCPU, at::kDouble).narrow(1, lo, n1);                    // [Hkv, n', d]
  auto v = kv.values.to(at::kCPU, at::kDouble).narrow(1, lo, n1).repeat_interleave(g, 0);  // [Hq, n', d]
  auto k_unit = (k / k.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12)).repeat_interleave(g, 0);  // [Hq, n', d]
  auto logits = o.tau * at::matmul(k_unit, anchor.unsqueeze(2)).squeeze(2).clamp(-1.0, 1.0);  // [Hq, n']
  auto w = (logits - std::get<0>(logits.max(-1, /*keepdim=*/true))).exp();       // [Hq, n']
  auto scaled = v * (w + o.epsilon).sqrt().unsqueeze(-1);                         // [Hq, n', d]
  auto a = at::eye(d, at::kDouble).unsqueeze(0) + at::matmul(scaled.transpose(1, 2), scaled);  // [Hq, d, d]
  auto vt = v.transpose(1, 2).contiguous();                                       // [Hq, d, n']
  auto leverage = (vt * at::linalg_solve(a, vt)).sum(1);                          // [Hq, n'] v_iᵀ A⁻¹ v_i
  scores.narrow(1, lo, n1).copy_((w * leverage).view({h_kv, g, n1}).mean(1));     // [Hkv, n']
  return scores;
}

class CapKV final : public Compressor {
 public:
  explicit CapKV(Params p) {
    o_.tau = p.get_double("tau", 5.0);
    o_.n_future = p.get_int("n_future_positions", 512);
    o_.n_sink = p.get_int("n_sink", 4);
    o_.epsilon = p.get_double("epsilon", 1e-6);
    KVLAB_CHECK(std::isfinite(o_.tau) && o_.tau >= 0, "capkv: parameter 'tau' must be finite and >= 0, got {}", o_.tau);
    KVLAB_CHECK(o_.n_future >= 1, "capkv: parameter 'n_future_positions' must be >= 1, got {}", o_.n_future);
    KVLAB_CHECK(o_.n_sink >= 0, "capkv: parameter 'n_sink' must be >= 0, got {}", o_.n_sink);
    KVLAB_CHECK(std::isfinite(o_.epsilon) && o_.epsilon >= 0, "capkv: parameter 'epsilon' must be finite and >= 0, got {}",
                o_.epsilon);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "capkv"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return -1; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override { return capkv_scores(kv, o_); }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  CapOptions o_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_capkv(const nlohmann::json& params) {
  return std::make_unique<CapKV>(Params(params, "capkv"));
}

// Preset "paper": kvpress CapPress's defaults (τ 5, 512 future positions, 4 sinks, ε 1e-6).
MethodPreset paper_preset_capkv() {
  return {{{"tau", 5.0}, {"n_future_positions", 512}, {"n_sink", 4}, {"epsilon", 1e-6}},
          0,
          0,
          "kvpress CapPress defaults (CAPKV, arXiv:2604.25975): tau 5, 512 future positions, 4 sinks, epsilon 1e-6",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_capkv() {
  CompressorInfo m;
  m.name = "capkv";
  m.description =
      "query-weighted ridge leverage of the values: w_i v_i^T (I + sum w v v^T)^-1 v_i with w from the keys' "
      "alignment to the future-rotated mean query (CAPKV; kvpress CapPress)";
  m.make = make_capkv;
  m.paper = paper_preset_capkv;
  m.cost = {1.0, "known: O(n d^2) capacity matrix + O(d^3) solve per head + top-k",
            "known cost: the anchor O(m·d), n weights O(n·d), the capacity matrix O(n·d²), one d×d solve for n "
            "right-hand sides O(d³ + n·d²) per query head, and a top-k (kvpress CapPress)"};
  m.inputs = {inputs::rope_inv_freq};
  return m;
}
}  // namespace kvlab
