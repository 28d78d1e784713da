// think — key-channel pruning: after any prefill method has chosen the entries, each KV head zeroes
// the key channels its window's queries weigh least, in every key the method kept; the keys are
// stored narrower.
//
// Paper: Yuhui Xu, Zhanming Jie, Hanze Dong, Lei Wang, Xudong Lu, Aojun Zhou, Amrita Saha, Caiming
//   Xiong, Doyen Sahoo, "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025
//   (arXiv:2407.21018). Defined as NVIDIA kvpress 0.5.5 `ThinKPress` (kvpress/presses/think_press.py),
//   which the ThinK authors reviewed; composed with a token press as kvpress's
//   ComposedPress([SnapKVPress, ThinKPress]) runs them (the token press first, ThinK on what it
//   kept). Checked against kvpress (tests/generate/test_kvpress_golden.cpp).
//
// Summary. The wrapped method (`scorer` [exact: every entry kept, ThinK alone]) compresses the
// region; then per KV head h and channel c (head_dim D):
//
//   qn[h, c] = mean over h's query heads and the last `window_size` queries of q_c²
//   kn[h, c] = mean over the keys the method kept (its live entries) of k_c²
//   score    = qn · kn;   the p = ⌊D · key_channel_compression_ratio⌋ lowest channels are zeroed
//
//   queries  [Hq, w, D]    post-RoPE, the prompt's last w
//   keys     [Hkv, m, D]   what the method returned; pruned [Hkv, D] bool (CompressedKV::pruned_channels)
//
// Memory: entries as the wrapped method holds them, each of its keys D − p channels wide plus a D-bit
// mask per head (ThinK's Fig. 1: "a binary channel mask, along with the pruned keys, is stored");
// CompressedKV::key_bytes_saved counts the difference. A budget is the wrapped method's, in entries:
// think alone keeps every entry and saves p/(2D) of the bytes (kvpress: compression_ratio = λ/2).
//
// Parameters: scorer [exact] (a prefill method; `think:snapkv`), key_channel_compression_ratio [0.5,
// kvpress's README example; kvpress's default 0 prunes nothing], window_size [32]; every other
// parameter is the wrapped method's.
//
// Deviations and notes:
//   - kvpress zeroes the channels in every key of the cache and averages kn over them; kvlab prunes
//     and averages over the region's kept keys: the exact parts the harness keeps beside the region
//     (--keep-first / --keep-last) stay whole and out of kn (the same with none, as the golden runs;
//     replay's tail, which holds the evaluation queries' keys, cannot change the channels). Decoded
//     keys stay whole, as kvpress.
//   - kvpress keeps the keys at full width ("no memory gain" in its docstring); kvlab counts what
//     ThinK would store. Not yet with a quantizer, --bytes, re-rotation or --decode-rule compress,
//     and not over a method with a separate denominator set.
//   - Scores in double (kvpress: the model's dtype); channels tied at the cut go to the lower index
//     (torch.topk leaves them unspecified).
//   - A method keeping different counts per head (adakv): kn is over each head's live entries;
//     kvpress's AdaKVPress keeps the evicted keys in the cache, masked, and averages over them too.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Think final : public detail::ScorerWrapper {
 public:
  explicit Think(const nlohmann::json& given) : ScorerWrapper("think") {
    Params p = own_params(given, {"scorer", "key_channel_compression_ratio", "window_size"});
    const std::string scorer = p.get_string("scorer", "snapkv");
    ratio_ = p.get_double("key_channel_compression_ratio", 0.5);
    window_ = p.get_int("window_size", 32);
    KVLAB_CHECK(ratio_ >= 0.0 && ratio_ < 1.0, "think: parameter 'key_channel_compression_ratio' must be in [0, 1), got {}",
                ratio_);
    KVLAB_CHECK(window_ >= 1, "think: parameter 'window_size' must be >= 1, got {}", window_);
    const CompressorInfo& info = compressor_info(scorer);
    KVLAB_CHECK(!info.streaming && !info.own_memory && info.name != "think",
                "think: parameter 'scorer' must name a method that compresses once after the prefill at a budget "
                "(e.g. exact, snapkv, knorm, adakv); got '{}'", scorer);
    make_scorer(p, scorer);
  }

  int64_t observation_queries() const override {
    const int64_t inner = scorer_->observation_queries();
    return inner < 0 ? -1 : std::max(inner, window_);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    CompressedKV cr = scorer_->compress(kv, opt);  // it takes its own window of the queries, as always
    const int64_t d = kv.keys.size(2), p = static_cast<int64_t>(double(d) * ratio_);
    if (p == 0 || cr.keys.size(1) == 0) return cr;
    KVLAB_CHECK(!cr.has_separate_den(), "think: '{}' keeps a separate denominator set, whose keys ThinK would "
                "prune as well; not supported", scorer_name_);
    detail::require_queries(kv, "think");
    const at::Tensor pruned = pruned_channels(kv, cr, p);  // [Hkv, d] bool
    cr.keys = cr.keys.masked_fill(pruned.to(cr.keys.device()).unsqueeze(1), 0);
    cr.pruned_channels = pruned;
    return cr;
  }

 private:
  // The p channels of each KV head with the lowest qn · kn (above), ties to the lower channel.
  at::Tensor pruned_channels(const LayerKV& kv, const CompressedKV& cr, int64_t p) const {
    const int64_t h_kv = kv.n_kv_heads(), d = kv.keys.size(2), g = kv.n_q_heads() / h_kv;
    const LayerKV win = detail::last_queries(kv, window_);
    const at::Tensor q = win.queries.to(at::kCPU, at::kDouble);                     // [Hq, w, d]
    const at::Tensor qn = q.pow(2).mean(1).view({h_kv, g, d}).mean(1);              // [Hkv, d]
    // The kept keys' squares, padding left out.
    at::Tensor k2 = cr.keys.to(at::kCPU, at::kDouble).pow(2);                       // [Hkv, m, d]
    at::Tensor count = at::full({h_kv, 1}, double(cr.keys.size(1)), k2.options());  // [Hkv, 1]
    if (cr.bias.defined()) {
      const at::Tensor live = at::isfinite(cr.bias.to(at::kCPU)).to(at::kDouble);   // [Hkv, m]
      k2 = k2 * live.unsqueeze(2);
      count = live.sum(1, /*keepdim=*/true);
    }
    const at::Tensor score = (qn * (k2.sum(1) / count.clamp_min(1.0))).contiguous();  // [Hkv, d]
    at::Tensor pruned = at::zeros({h_kv, d}, at::TensorOptions().dtype(at::kBool));
    const double* s = score.data_ptr<double>();
    auto* out = pruned.data_ptr<bool>();
    std::vector<int64_t> order(static_cast<size_t>(d));
    for (int64_t h = 0; h < h_kv; ++h) {
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[h * d + a] < s[h * d + b]; });
      for (int64_t i = 0; i < p; ++i) out[h * d + order[size_t(i)]] = true;
    }
    return pruned;
  }

  double ratio_ = 0.5;
  int64_t window_ = 32;
};

}  // namespace

std::unique_ptr<Compressor> make_think(const nlohmann::json& params) { return std::make_unique<Think>(params); }

// Preset "paper": ThinK's LongBench tables compose it with SnapKV (observation window 32, max-pool
// kernel 7, the paper's Sec. 4 setting) at pruning ratios λ 0.4 and 0.5; kvlab's preset takes 0.5.
MethodPreset paper_preset_think() {
  return {{{"scorer", "snapkv"}, {"key_channel_compression_ratio", 0.5}, {"window_size", 32}},
          0,
          0,
          "Xu et al. (ThinK, ICLR 2025): SnapKV (window 32, kernel 7 max-pool) with half the key channels pruned",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_think() {
  CompressorInfo m;
  m.name = "think";
  m.description =
      "a method's kept keys lose the channels the window's queries weigh least, per KV head (ThinK; kvpress "
      "ThinKPress; bytes, not entries)";
  m.make = make_think;
  m.paper = paper_preset_think;
  m.cost = {1.0, "known: the method's + n D",
            "known cost: the wrapped method's, then one pass over the held keys and the window's queries (ThinK, Xu et al.)"};
  m.wrapper = true;
  return m;
}

}  // namespace kvlab
