// per_layer — any prefill method with a budget of its own on each layer, the layers' shares given
// as a list (kvpress's per-layer compression ratios), the average held at the run's budget.
//
// Source: NVIDIA kvpress 0.5.5 `PerLayerCompressionPress` (kvpress/presses/per_layer_compression_press.py,
//   a wrapper that sets a ScorerPress's compression ratio from a list indexed by the layer), which
//   no paper defines; PyramidKV (kvlab's pyramidkv) is one schedule of this kind. Checked against
//   kvpress (tests/generate/test_kvpress_golden.cpp).
//
// Summary. `compression_ratios` holds, per layer l, kvpress's fraction removed c_l. At the run's
// kept fraction f (--ratio, or budget / n), layer l keeps the fraction
//     f_l = f · (1 − c_l) / mean_l(1 − c_l),
// so the layers' average is the run's f whatever the list (equal memory with every other branch),
// and at f = mean_l(1 − c_l) (kvpress's compression_ratio, the list's mean) f_l = 1 − c_l, as
// kvpress; layer l then runs the scorer at max(1, ⌊n · f_l⌋) entries (kvpress's compute_n_kept),
// at most n. An empty list (the default) gives every layer f: the scorer alone.
//
//   budget  per layer an entry count, as above
//   kept    the scorer's own choice at that count
//
// Parameters: scorer [snapkv] (any method that compresses once after the prefill, reads nothing
// from the model and is not itself a wrapper), compression_ratios [] (one value in [0, 1) per
// layer: a JSON list, or "0.1,0.2,..." from --param); every other parameter is the scorer's.
//
// Deviations and notes:
//   - kvpress sets the list as given, and its compression_ratio is the list's mean; kvlab scales
//     the list to the run's budget (above), so one list serves every --ratio of a sweep. Flooring per
//     layer, the average over layers may fall short of the budget by up to one entry per head.
//   - kvpress warns that its wrapper needs flash attention (caches of unequal lengths per layer);
//     kvlab's caches are per layer anyway.
#include <ATen/ATen.h>

#include <cmath>
#include <numeric>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class PerLayer final : public detail::ScorerWrapper {
 public:
  explicit PerLayer(const nlohmann::json& given) : ScorerWrapper("per_layer") {
    Params p = own_params(given, {"scorer", "compression_ratios"});
    const std::string scorer = p.get_string("scorer", "snapkv");
    removed_ = p.get_double_list("compression_ratios", {});
    const CompressorInfo& info = compressor_info(scorer);
    KVLAB_CHECK(!info.streaming && !info.wrapper && !info.needs_model() && !info.calibration && info.name != "exact",
                "per_layer: parameter 'scorer' must name a method that compresses once after the prefill, reads "
                "nothing from the model and wraps nothing (e.g. snapkv, knorm, keydiff, expected_attention); got '{}'",
                scorer);
    for (size_t l = 0; l < removed_.size(); ++l)
      KVLAB_CHECK(removed_[l] >= 0.0 && removed_[l] < 1.0,
                  "per_layer: parameter 'compression_ratios' holds fractions removed, each in [0, 1); layer {}'s is {}",
                  l, removed_[l]);
    if (!removed_.empty()) {
      double sum = 0;
      for (double c : removed_) sum += 1.0 - c;
      mean_kept_ = sum / static_cast<double>(removed_.size());
    }
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    if (removed_.empty()) return scorer_->compress(kv, opt);
    KVLAB_CHECK(static_cast<int64_t>(removed_.size()) == kv.n_layers,
                "per_layer: parameter 'compression_ratios' has {} values, the model has {} layers (one per layer)",
                removed_.size(), kv.n_layers);
    const int64_t n = kv.n_tokens();
    double scale = resolve_kept_fraction(opt, n) / mean_kept_;
    if (std::abs(scale - 1.0) < 1e-12) scale = 1.0;  // the list's own mean: kvpress's counts exactly
    const double f = (1.0 - removed_[static_cast<size_t>(kv.layer)]) * scale;
    CompressOptions layer_opt = opt;
    layer_opt.budget = Budget::of_entries(std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(double(n) * f))));
    return scorer_->compress(kv, layer_opt);
  }

 private:
  std::vector<double> removed_;
  double mean_kept_ = 1.0;
};

}  // namespace

std::unique_ptr<Compressor> make_per_layer(const nlohmann::json& params) { return std::make_unique<PerLayer>(params); }

// Preset "paper": no paper; kvpress's wrapper has no default list, so every layer at the run's budget
// around SnapKV's paper setting.
MethodPreset paper_preset_per_layer() {
  return {{{"scorer", "snapkv"}, {"compression_ratios", nlohmann::json::array()}},
          0,
          0,
          "kvpress PerLayerCompressionPress (no paper, no default list): every layer at the run's budget unless "
          "compression_ratios is given",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_per_layer() {
  CompressorInfo m;
  m.name = "per_layer";
  m.description =
      "any prefill method at a budget of its own per layer, from a list of fractions removed scaled to the run's budget (kvpress PerLayerCompressionPress)";
  m.make = make_per_layer;
  m.paper = paper_preset_per_layer;
  m.cost = {1.0, "known: the scorer's", "known cost: the wrapped scorer's, once per layer (kvpress PerLayerCompressionPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
