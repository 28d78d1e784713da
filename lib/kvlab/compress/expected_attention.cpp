// expected_attention — keep the keys future queries are expected to attend to, weighted by ‖v‖.
//
// Source: NVIDIA kvpress, "Expected Attention: KV Cache Compression by Estimating Attention from
//   Future Queries Distribution" (Devoto, Jeblick, Jégou, arXiv:2510.00636, 2025); checked against
//   kvpress 0.5.5 `ExpectedAttentionPress` (kvpress/presses/expected_attention_press.py), the
//   reference implementation.
//
// Summary. The queries still to come are modelled as a Gaussian: the mean μ and covariance Σ of
// the prompt's queries before RoPE (the first n_sink positions left out), per query head, moved
// to the next n_future_positions by the average RoPE rotation R̄ = mean_t R(t) over positions
// t = q_len .. q_len + n_future − 1 (μ ← R̄μ, Σ ← R̄ΣR̄ᵀ). Under that model E[exp(q·k/√d)] =
// exp(k·μ/√d + kᵀΣk / 2d), so each key's expected attention is the softmax of those logits over
// the cache's keys past the sinks; it is averaged over the query heads of a KV head, multiplied by
// (· + ε)·‖v‖, and the `budget` best are kept exact (bias 0). Positions below n_sink are kept.
//
//   queries   [Hq, n_obs, d] post-RoPE at query_pos; un-rotated with the context's rope_inv_freq
//   mu        [Hq, d], cov [Hq, d, d]    after R̄
//   scores    [Hkv, n] float64 (+inf at positions < n_sink)
//
// Parameters: n_future_positions [512], n_sink [4], use_covariance [true], use_vnorm [true],
//   epsilon [0] (kvpress's defaults, its leaderboard's setting).
//
// Deviations and notes:
//   - kvpress recomputes the pre-RoPE queries from the hidden states; kvlab un-rotates the post-RoPE
//     queries it holds (RoPE is a rotation: exact up to float rounding). Models whose RoPE scales
//     the attention (llama3/yarn attention_factor) are not covered: kvlab's RoPE has none yet.
//   - The statistics use the queries the method is given: in generation and the task commands
//     every prompt query (observation_queries −1), as kvpress; in replay the observation window
//     only (no method sees the queries it is judged on), and the future positions then start at
//     the first judged query.
//   - The softmax runs over every key past n_sink the cache holds (prefix, region and suffix), as
//     kvpress's over the whole layer; the region's columns are kept.
//   - Computed in float64 (kvpress: the model's dtype). Ties go to the lower index.
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

struct EAOptions {
  int64_t n_future = 512, n_sink = 4;
  bool use_covariance = true, use_vnorm = true;
  double epsilon = 0.0;
};

at::Tensor expected_attention_scores(const LayerKV& kv, const EAOptions& o) {
  const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), h_q = kv.n_q_heads(), g = h_q / h_kv;
  auto [q_pre, qpos, inv] = detail::pre_rope_queries(kv, o.n_sink, "expected_attention");  // [Hq, m, d], [m]
  const int64_t m = q_pre.size(1), d = q_pre.size(2);
  auto mu = q_pre.mean(1);                                                            // [Hq, d]
  auto r = detail::average_rope_rotation(inv, qpos.max().item<int64_t>() + 1, o.n_future);    // [d, d]
  auto mu_r = at::matmul(mu, r.t());                                                  // [Hq, d]

  // Every key the cache holds, past the sinks; the region is [pos0, pos0 + n).
  std::vector<at::Tensor> parts;
  if (kv.prefix_keys.defined() && kv.prefix_keys.size(1) > 0) parts.push_back(kv.prefix_keys);
  parts.push_back(kv.keys);
  if (kv.suffix_keys.defined() && kv.suffix_keys.size(1) > 0) parts.push_back(kv.suffix_keys);
  auto all = at::cat(parts, 1).to(at::kCPU, at::kDouble);                           // [Hkv, N, d] at 0..N-1
  const int64_t first = std::min<int64_t>(o.n_sink, all.size(1));
  auto keys = all.narrow(1, first, all.size(1) - first).repeat_interleave(g, 0);     // [Hq, N', d]
  auto logits = at::matmul(keys, mu_r.unsqueeze(2)).squeeze(2) / std::sqrt(double(d));  // [Hq, N']
  if (o.use_covariance) {
    auto centered = q_pre - mu.unsqueeze(1);                                          // [Hq, m, d]
    auto cov = at::matmul(centered.transpose(1, 2), centered) / double(m);            // [Hq, d, d]
    cov = at::matmul(r, at::matmul(cov, r.t()));                                      // R̄ Σ R̄ᵀ
    logits += (at::matmul(keys, cov) * keys).sum(-1) / double(d) / 2.0;              // kᵀΣk / 2d
  }
  auto probs = logits.softmax(-1).view({h_kv, g, -1}).mean(1);                        // [Hkv, N']
  // Region columns: region index i sits at position pos0 + i, column pos0 + i − first.
  auto scores = at::full({h_kv, n}, std::numeric_limits<double>::infinity(), at::kDouble);  // [Hkv, n]
  const int64_t lo = std::max<int64_t>(0, first - kv.pos0);                          // region index of the first non-sink
  if (lo < n) {
    auto s = probs.narrow(1, kv.pos0 + lo - first, n - lo);                           // [Hkv, n - lo]
    if (o.use_vnorm)
      s = (s + o.epsilon) * kv.values.to(at::kCPU, at::kDouble).narrow(1, lo, n - lo).norm(2, -1);
    scores.narrow(1, lo, n - lo).copy_(s);
  }
  return scores;
}

class ExpectedAttention final : public Compressor {
 public:
  explicit ExpectedAttention(Params p) {
    o_.n_future = p.get_int("n_future_positions", 512);
    o_.n_sink = p.get_int("n_sink", 4);
    o_.use_covariance = p.get_bool("use_covariance", true);
    o_.use_vnorm = p.get_bool("use_vnorm", true);
    o_.epsilon = p.get_double("epsilon", 0.0);
    KVLAB_CHECK(o_.n_future >= 1, "expected_attention: parameter 'n_future_positions' must be >= 1, got {}",
                o_.n_future);
    KVLAB_CHECK(o_.n_sink >= 0, "expected_attention: parameter 'n_sink' must be >= 0, got {}", o_.n_sink);
    KVLAB_CHECK(o_.epsilon >= 0, "expected_attention: parameter 'epsilon' must be >= 0, got {}", o_.epsilon);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "expected_attention"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return -1; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override { return expected_attention_scores(kv, o_); }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  EAOptions o_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_expected_attention(const nlohmann::json& params) {
  return std::make_unique<ExpectedAttention>(Params(params, "expected_attention"));
}

// Preset "paper": kvpress's defaults, with which its leaderboard runs ExpectedAttentionPress
// (n_future_positions 512, n_sink 4, covariance and ‖v‖ on, ε 0).
MethodPreset paper_preset_expected_attention() {
  return {{{"n_future_positions", 512}, {"n_sink", 4}, {"use_covariance", true}, {"use_vnorm", true}, {"epsilon", 0.0}},
          0,
          0,
          "kvpress ExpectedAttentionPress defaults (its leaderboard): 512 future positions, 4 sinks, covariance, |v|",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_expected_attention() {
  CompressorInfo m;
  m.name = "expected_attention";
  m.description =
      "attention expected from a Gaussian of the prompt's pre-RoPE queries moved to future positions, times |v| (kvpress ExpectedAttentionPress)";
  m.make = make_expected_attention;
  m.paper = paper_preset_expected_attention;
  m.cost = {1.0, "known: query statistics O(m d^2) + O(n d^2) scores",
            "known cost: the mean and covariance of m queries O(m·d²) per head, then k·mu and k^T Sigma k for n keys, O(n·d²), and a top-k (Devoto et al. 2025)"};
  m.inputs = {inputs::rope_inv_freq};
  return m;
}
}  // namespace kvlab
