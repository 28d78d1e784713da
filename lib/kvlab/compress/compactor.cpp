// compactor — keep the keys that are geometric outliers (approximate leverage) or draw chunked,
// non-causal attention.
//
// Paper: Vivek Chari, Benjamin Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache
//   Compression with Approximate Leverage Scores", arXiv:2507.08143 (2025). Checked against NVIDIA
//   kvpress 0.5.5 `CompactorPress` (kvpress/presses/compactor_press.py, leverage_press.py,
//   non_causal_attention_press.py), written by the paper's first author: the reference.
//
// Summary. Per layer, with the region's first `sink_start` and last `sink_end` positions always
// kept (+inf), the positions between them get two scores, each z-normalised over every KV head
// and position of the layer together (mean, unbiased std clamped at 1e-6):
//   leverage   the statistical leverage of each pre-RoPE key among the layer's keys: with X the
//              sequence-centred keys times a right sketch Φ [d, k] (Gaussian / √k),
//              diag(X (XᵀX + 1e-2·I)⁻¹ Xᵀ), clamped at 0. Outlying keys have high leverage.
//   attention  non-causal attention inside chunks of `chunk_size` positions: each query of a chunk
//              attends (softmax of the unscaled logits q·k) to every key of its chunk, the
//              probabilities are summed over the chunk's queries, averaged over the query heads of a
//              KV head, times ‖v‖, then smoothed by a mean filter of width 3 (zero padding, /3).
// The blend is `blending`·leverage + attention, `blending` defaulting to the fraction removed
// (kvpress: compression_ratio). The `budget` highest are kept exact (bias 0).
//
//   keys, values  [Hkv, n, d]      region; pre-RoPE keys by un-rotating with the context's rope_inv_freq
//   queries       [Hq, n_obs, d]   post-RoPE at query_pos; those inside the region score their chunk
//   Φ             [Hkv, d, k]      float64 normal from a CPU generator seeded with opt.seed, / √k
//   scores        [Hkv, n] float64 (+inf at the sinks)
//
// Parameters: sink_start [8], sink_end [4], chunk_size [256], sketch_dimension [48] (0 = no sketch:
//   Φ = I/√d, exact leverage with the same ridge; what the kvpress differential test uses, since
//   kvpress draws Φ from torch's global generator), blending [-1 = the fraction removed: 1 − ratio
//   for --ratio, 1 − b/n for an entry budget], attention [true] (false: the leverage score alone,
//   no queries: with sink_start=0 sink_end=0 it is kvpress's LeverageScorePress, checked against it;
//   sink_start=0 sink_end=0 blending=0 is its NonCausalAttnPress, the attention half).
//
// Deviations and notes:
//   - The last chunk is padded as kvpress pads it: to chunk_size with zero queries and zero keys,
//     a padded key entering each real query's softmax with logit 0 and each padded query adding
//     ≈ 1/chunk_size to every key of that chunk. kvlab follows it so that its scores equal kvpress's.
//   - kvpress recomputes pre-RoPE keys from the hidden states; kvlab un-rotates the post-RoPE keys
//     (exact up to rounding). Computed in float64 (kvpress: float32 with a jittered Cholesky that
//     raises the ridge on failure; in float64 the first try, 1e-2, succeeds).
//   - The attention part uses the queries the method is given: every prompt query in generation and
//     the task commands (observation_queries −1), as kvpress; in replay only the observation window,
//     so chunks without a query there get the padding's share only (no method sees the queries it is
//     judged on).
//   - Ties go to the lower index (torch.topk leaves them unspecified). Prefill-only, as kvpress.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

struct CompactorOptions {
  int64_t sink_start = 8, sink_end = 4, chunk_size = 256, sketch = 48;
  double blending = -1;
  bool attention = true;  // false: the leverage score alone (kvpress's LeverageScorePress)
};

// (x − mean) / max(std, 1e-6) over every element; std unbiased (torch's default).
at::Tensor z_normalise(const at::Tensor& x) {
  if (x.numel() < 2) return x - x.mean();
  return (x - x.mean()) / x.std().clamp_min(1e-6);
}

// keys [Hkv, m, d] pre-RoPE -> [Hkv, m] leverage scores of the sketched, centred keys.
at::Tensor leverage_scores(const at::Tensor& keys, int64_t sketch, uint64_t seed) {
  const int64_t h = keys.size(0), d = keys.size(2), k = sketch > 0 ? sketch : d;
  at::Tensor phi;  // [Hkv, d, k]
  if (sketch > 0) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    phi = at::normal(0.0, 1.0, {h, d, k}, gen, at::TensorOptions().dtype(at::kDouble)) / std::sqrt(double(k));
  } else {
    phi = at::eye(d, at::kDouble).expand({h, d, d}) / std::sqrt(double(d));
  }
  auto x = at::matmul(keys - keys.mean(1, /*keepdim=*/true), phi);                   // [Hkv, m, k]
  auto xt = x.transpose(1, 2);                                                       // [Hkv, k, m]
  auto gram = at::matmul(xt, x);                                                     // [Hkv, k, k]
  gram = 0.5 * (gram + gram.transpose(1, 2)) + 1e-2 * at::eye(k, at::kDouble);
  auto l = at::linalg_cholesky(gram);                                                // [Hkv, k, k] lower
  auto y = at::cholesky_solve(xt, l, /*upper=*/false);                               // (XᵀX)⁻¹Xᵀ [Hkv, k, m]
  return (x * y.transpose(1, 2)).sum(-1).clamp_min(0);                               // [Hkv, m]
}

// Chunked non-causal attention of the region positions [lo, hi): per KV head, the probability mass
// each key receives from the queries of its own chunk, averaged over the group, times ‖v‖, mean
// filtered. -> [Hkv, hi − lo]
at::Tensor chunk_attention_scores(const LayerKV& kv, int64_t lo, int64_t hi, int64_t cs) {
  const int64_t m = hi - lo, h_kv = kv.n_kv_heads(), h_q = kv.n_q_heads(), g = h_q / h_kv;
  auto keys = kv.keys.to(at::kCPU, at::kDouble).narrow(1, lo, m).repeat_interleave(g, 0);  // [Hq, m, d]
  auto sums = at::zeros({h_q, m}, at::kDouble);                                             // [Hq, m]
  at::Tensor q, qidx;  // queries inside [lo, hi) and their index there
  if (kv.queries.defined() && kv.queries.size(1) > 0) {
    auto rel = detail::query_positions(kv).to(at::kCPU, at::kLong) - (kv.pos0 + lo);       // [n_obs]
    auto in = (rel.ge(0) & rel.lt(m)).nonzero().squeeze(1);
    q = kv.queries.to(at::kCPU, at::kDouble).index_select(1, in);                          // [Hq, m_q, d]
    qidx = rel.index_select(0, in);                                                        // [m_q]
  }
  for (int64_t c0 = 0; c0 < m; c0 += cs) {
    const int64_t len = std::min(cs, m - c0);
    auto kc = keys.narrow(1, c0, len);                                                      // [Hq, len, d]
    if (q.defined()) {
      auto sel = (qidx.ge(c0) & qidx.lt(c0 + len)).nonzero().squeeze(1);
      if (sel.numel() > 0) {
        auto logits = at::matmul(q.index_select(1, sel), kc.transpose(1, 2));              // [Hq, r, len]
        if (len < cs)  // padded keys: logit 0
          logits = at::cat({logits, at::zeros({h_q, logits.size(1), cs - len}, at::kDouble)}, 2);
        sums.narrow(1, c0, len) += logits.softmax(-1).narrow(2, 0, len).sum(1);
      }
    }
    if (len < cs) sums.narrow(1, c0, len) += double(cs - len) / double(cs);  // padded queries: uniform rows
  }
  auto a = sums.view({h_kv, g, m}).mean(1);                                                 // [Hkv, m]
  a = a * kv.values.to(at::kCPU, at::kDouble).narrow(1, lo, m).norm(2, -1);
  // Mean filter of width 3 with zero padding, divided by 3 (avg_pool1d, count_include_pad).
  auto padded = at::constant_pad_nd(a, {1, 1}, 0.0);                                        // [Hkv, m + 2]
  return (padded.narrow(1, 0, m) + padded.narrow(1, 1, m) + padded.narrow(1, 2, m)) / 3.0;
}

class Compactor final : public Compressor {
 public:
  explicit Compactor(Params p) {
    o_.sink_start = p.get_int("sink_start", 8);
    o_.sink_end = p.get_int("sink_end", 4);
    o_.chunk_size = p.get_int("chunk_size", 256);
    o_.sketch = p.get_int("sketch_dimension", 48);
    o_.blending = p.get_double("blending", -1);
    o_.attention = p.get_bool("attention", true);
    KVLAB_CHECK(o_.sink_start >= 0 && o_.sink_end >= 0,
                "compactor: parameters 'sink_start' and 'sink_end' must be >= 0, got {} and {}", o_.sink_start, o_.sink_end);
    KVLAB_CHECK(o_.chunk_size >= 1, "compactor: parameter 'chunk_size' must be >= 1, got {}", o_.chunk_size);
    KVLAB_CHECK(o_.sketch >= 0, "compactor: parameter 'sketch_dimension' must be >= 0 (0 = no sketch), got {}", o_.sketch);
    KVLAB_CHECK(o_.blending == -1 || o_.blending >= 0,
                "compactor: parameter 'blending' must be >= 0, or -1 for the fraction removed; got {}", o_.blending);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "compactor"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return o_.attention ? -1 : 0; }

  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& opt) const override {
    KVLAB_CHECK(kv.context.has(inputs::rope_inv_freq), "compactor: the region came without the model's RoPE "
                "frequencies (input rope_inv_freq), needed for the pre-RoPE keys of its leverage scores");
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t lo = std::min(o_.sink_start, n), hi = n - std::min(o_.sink_end, n - lo);
    auto scores = at::full({h_kv, n}, std::numeric_limits<double>::infinity(), at::kDouble);  // [Hkv, n]
    if (hi <= lo) return scores;
    const int64_t m = hi - lo;
    auto pos = at::arange(kv.pos0 + lo, kv.pos0 + hi, at::kLong).unsqueeze(0).expand({h_kv, m});
    auto pre = rotate_by(kv.keys.to(at::kCPU, at::kDouble).narrow(1, lo, m), -pos, kv.context.get(inputs::rope_inv_freq).to(at::kCPU));
    auto lev = z_normalise(leverage_scores(pre, o_.sketch, opt.seed));                       // [Hkv, m]
    if (!o_.attention) {  // LeverageScorePress: the leverage half alone
      scores.narrow(1, lo, m).copy_(lev);
      return scores;
    }
    auto att = z_normalise(chunk_attention_scores(kv, lo, hi, o_.chunk_size));               // [Hkv, m]
    double blend = o_.blending;
    if (blend < 0)
      blend = 1.0 - resolve_kept_fraction(opt, n);
    scores.narrow(1, lo, m).copy_(blend * lev + att);
    return scores;
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  CompactorOptions o_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_compactor(const nlohmann::json& params) {
  return std::make_unique<Compactor>(Params(params, "compactor"));
}

// Preset "paper": kvpress CompactorPress's defaults (8 + 4 sinks, chunks of 256, a 48-dimensional
// sketch, blending = the fraction removed), the authors' implementation.
MethodPreset paper_preset_compactor() {
  return {{{"sink_start", 8}, {"sink_end", 4}, {"chunk_size", 256}, {"sketch_dimension", 48}, {"blending", -1}},
          0,
          0,
          "Chari & Van Durme 2025 (Compactor) / kvpress CompactorPress defaults: 8+4 sinks, chunk 256, sketch 48, "
          "blending = fraction removed",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_compactor() {
  CompressorInfo m;
  m.name = "compactor";
  m.description =
      "approximate leverage of the pre-RoPE keys blended with chunked non-causal attention times |v|, query-agnostic (Compactor; kvpress CompactorPress)";
  m.make = make_compactor;
  m.paper = paper_preset_compactor;
  m.cost = {1.0, "known: sketch + Cholesky O(n d k + k^3), chunked attention O(n c d)",
            "known cost: the sketched Gram matrix O(n·d·k) and its Cholesky O(k³), attention within chunks of c positions O(n·c·d), and a top-k (Compactor, Chari & Van Durme 2025)"};
  m.inputs = {inputs::rope_inv_freq};
  return m;
}
}  // namespace kvlab
