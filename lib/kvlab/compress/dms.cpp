// dms — a per-head scorer's scores against a fixed threshold: every prompt position that scores
// below it and lies outside the recent window is evicted, per KV head.
//
// Source: NVIDIA kvpress 0.5.5 `DMSPress` (kvpress/presses/dms_press.py), the inference rule of
//   Dynamic Memory Sparsification (Łańcucki et al., "Inference-Time Hyper-Scaling with KV Cache
//   Compression", arXiv:2506.05345) with any ScorerPress in place of the paper's trained evictors
//   and a dense prefill (kvpress says the same). Checked against kvpress
//   (tests/generate/test_kvpress_golden.cpp).
//
// Summary. With the scorer's scores s [Hkv, n] (higher = keep; +inf = always kept) on the prompt,
// the last `sliding_window_size` positions of the prompt are kept, and of the others each KV head
// keeps those with s ≥ threshold (kvpress evicts s < threshold). Heads keep different counts
// (padding); nothing is evicted from a prompt of at most sliding_window_size tokens.
//
// Memory: the threshold decides it, not the run's budget (CompressorInfo::own_memory): a run gives
// the method one branch, labelled without a budget, whose rows report the entries it held. The
// threshold's scale is the scorer's (knorm: minus the key's L2 norm; snapkv: the window's mean
// attention probability).
//
// Parameters: scorer [knorm] (a method with per-position scores: knorm, keydiff, lagkv, snapkv,
// expected_attention, compactor, capkv, cur, ...), threshold [-1e30: evicts nothing; kvpress has no
// default], sliding_window_size [128] (>= 0); every other parameter is the scorer's.
//
// Deviations and notes:
//   - Prefill only: kvpress's `decoding=True` (scoring and evicting decoded tokens as they leave the
//     window) is not in kvlab; decoded tokens are appended exactly.
//   - kvpress keeps the evicted entries in the cache, masked (attention weight 0); kvlab drops them,
//     which is the same attention and what the memory would be.
//   - Scores are compared in double from the scorer's (kvpress: the scorer's dtype, float32): a
//     position within ~1e-7 (relative) of the threshold may be decided the other way.
#include <ATen/ATen.h>

#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Dms final : public detail::ScorerWrapper {
 public:
  explicit Dms(const nlohmann::json& given) : ScorerWrapper("dms") {
    Params p = own_params(given, {"scorer", "threshold", "sliding_window_size"});
    const std::string scorer = p.get_string("scorer", "knorm");
    threshold_ = p.get_double("threshold", -1e30);
    window_ = p.get_int("sliding_window_size", 128);
    KVLAB_CHECK(window_ >= 0, "dms: parameter 'sliding_window_size' must be >= 0, got {}", window_);
    const CompressorInfo& info = compressor_info(scorer);
    KVLAB_CHECK(!info.streaming && !info.wrapper && !info.own_memory && info.name != "exact",
                "dms: parameter 'scorer' must name a method with per-position scores that compresses once after the "
                "prefill (e.g. knorm, keydiff, snapkv, expected_attention); got '{}'", scorer);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t total = kv.n_prompt();
    if (total <= window_ || n == 0) return keep_all(kv);
    const at::Tensor s = scorer_scores(kv, opt).to(at::kCPU, at::kDouble).contiguous();  // [Hkv, n]
    const double* sc = s.data_ptr<double>();
    const int64_t window_from = total - window_;  // prompt positions >= this are kept
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(h_kv));
    for (int64_t h = 0; h < h_kv; ++h)
      for (int64_t i = 0; i < n; ++i)
        if (kv.pos0 + i >= window_from || sc[h * n + i] >= threshold_) kept[h].push_back(i);
    return gather_kept(kv, detail::pad_index_rows(kept).to(kv.keys.device()));  // [Hkv, max kept], -1 = padding
  }

 private:
  double threshold_ = -1e30;
  int64_t window_ = 128;
};

}  // namespace

std::unique_ptr<Compressor> make_dms(const nlohmann::json& params) { return std::make_unique<Dms>(params); }

// Preset "paper": no threshold of a paper applies (DMS trains its evictors); kvpress's window of 128
// around knorm, evicting nothing until a threshold is given.
MethodPreset paper_preset_dms() {
  return {{{"scorer", "knorm"}, {"threshold", -1e30}, {"sliding_window_size", 128}},
          0,
          0,
          "kvpress DMSPress (DMS's inference rule, arXiv:2506.05345, without its trained evictors): a window of 128 "
          "around knorm; give dms.threshold",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_dms() {
  CompressorInfo m;
  m.name = "dms";
  m.description =
      "a scorer's positions below a threshold evicted per KV head, the last 128 kept (kvpress DMSPress; memory "
      "set by the threshold)";
  m.make = make_dms;
  m.paper = paper_preset_dms;
  m.cost = {1.0, "known: the scorer's", "known cost: the wrapped scorer's scores and one pass over them (kvpress DMSPress)"};
  m.wrapper = true;
  m.own_memory = true;
  return m;
}

}  // namespace kvlab
