// keydiff — keep the keys least like the layer's average key direction.
//
// Paper: Junyoung Park, Dalton Jones, Matthew J. Morse, Raghavv Goel, Mingu Lee, Chris Lott,
//   "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
//   Resource-Constrained Environments", arXiv:2504.15364. Checked against NVIDIA kvpress 0.5.5
//   `KeyDiffPress` (kvpress/presses/keydiff_press.py: anchor = mean_j normalize(k_j), score_j =
//   −cos(k_j, anchor); ScorerPress keeps the top-scoring ones).
//
// Summary. Keys that point away from the average key direction are the distinctive ones and draw
// attention the average ones do not: per KV head, the anchor is the mean of the unit-normalised
// region keys, each key scores −cos(k_j, anchor), and the `budget` best are kept exact (bias 0).
// Query-agnostic, O(n·d).
//
// Parameters: none.
//
// Deviations:
//   - One shot over the region, as kvpress's KeyDiffPress; the paper evicts block by block while
//     the prompt streams in (kvpress: BlockPress(KeyDiffPress)).
//   - cos with torch's eps: x·y / max(‖x‖·‖y‖, 1e-8); normalize with max(‖x‖, 1e-12).
//   - Ties go to the lower index (torch.topk leaves them unspecified).
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/key_scores.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"

namespace kvlab {

at::Tensor keydiff_scores(const at::Tensor& keys) {
  auto k = keys.to(at::kCPU, at::kDouble);                                           // [Hkv, n, d]
  auto norms = k.norm(2, -1, /*keepdim=*/true);                                      // [Hkv, n, 1]
  auto anchor = (k / norms.clamp_min(1e-12)).mean(1, /*keepdim=*/true);              // [Hkv, 1, d]
  auto cos = (k * anchor).sum(-1) / (norms.squeeze(-1) * anchor.norm(2, -1)).clamp_min(1e-8);  // [Hkv, n]
  return cos.neg().contiguous();
}

namespace {

class KeyDiff final : public Compressor {
 public:
  explicit KeyDiff(Params p) : params_(p.effective()) { p.finish(); }
  std::string name() const override { return "keydiff"; }
  nlohmann::json params() const override { return params_; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override { return keydiff_scores(kv.keys); }  // [Hkv, n]

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_keydiff(const nlohmann::json& params) {
  return std::make_unique<KeyDiff>(Params(params, "keydiff"));
}

// Preset "paper": no parameters (the scoring rule has none; the paper's block size is a streaming
// detail kvlab's one-shot prefill compression does not use).
MethodPreset paper_preset_keydiff() {
  return {nlohmann::json::object(), 0, 0, "Park et al. 2025 (KeyDiff) / kvpress KeyDiffPress: no parameters", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_keydiff() {
  CompressorInfo m;
  m.name = "keydiff";
  m.description =
      "the keys least like the average key direction, query-agnostic (KeyDiff; kvpress KeyDiffPress)";
  m.make = make_keydiff;
  m.paper = paper_preset_keydiff;
  m.cost = {1.0, "known: one pass over the keys O(n d) + top-k",
            "known cost: the mean unit key and one cosine per key, O(n·d), and a top-k (KeyDiff, Park et al. 2025)"};
  return m;
}
}  // namespace kvlab
