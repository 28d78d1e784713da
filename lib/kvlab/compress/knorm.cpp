// knorm — keep the keys with the smallest L2 norm.
//
// Paper: Alessio Devoto, Yu Zhao, Simone Scardapane, Pasquale Minervini, "A Simple and Effective
//   L2 Norm-Based Strategy for KV Cache Compression", EMNLP 2024, arXiv:2406.11430. Checked
//   against NVIDIA kvpress 0.5.5 `KnormPress` (kvpress/presses/knorm_press.py:
//   score = −‖k‖₂ per key and KV head; ScorerPress keeps the top-scoring ones).
//
// Summary. Keys with a low L2 norm draw high attention (the paper's observation on Llama-2 and
// Llama-3): per KV head, score each region key by −‖k‖₂ and keep the `budget` best, exact (bias 0).
// It needs no query, so it is query-agnostic and costs O(n·d).
//
// Parameters: none.
//
// Deviations:
//   - Every layer is compressed, as kvpress does (the paper's analysis leaves the first layers'
//     norms out of its correlation study; its compression experiments compress every layer).
//   - Ties go to the lower index (torch.topk leaves them unspecified).
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/key_scores.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"

namespace kvlab {

at::Tensor knorm_scores(const at::Tensor& keys) {
  return keys.to(at::kCPU, at::kDouble).norm(2, -1).neg().contiguous();  // [Hkv, n]
}

namespace {

class Knorm final : public Compressor {
 public:
  explicit Knorm(Params p) : params_(p.effective()) { p.finish(); }
  std::string name() const override { return "knorm"; }
  nlohmann::json params() const override { return params_; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override { return knorm_scores(kv.keys); }  // [Hkv, n]

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_knorm(const nlohmann::json& params) {
  return std::make_unique<Knorm>(Params(params, "knorm"));
}

// Preset "paper": no parameters (the paper's rule has none; every layer compressed, as kvpress).
MethodPreset paper_preset_knorm() {
  return {nlohmann::json::object(), 0, 0, "Devoto et al. 2024 / kvpress KnormPress: no parameters", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_knorm() {
  CompressorInfo m;
  m.name = "knorm";
  m.description =
      "the keys of smallest L2 norm, query-agnostic (Devoto et al.; kvpress KnormPress)";
  m.make = make_knorm;
  m.paper = paper_preset_knorm;
  m.cost = {1.0, "known: key norms O(n d) + top-k",
            "known cost: one norm per key, O(n·d), and a top-k (Devoto et al. 2024)"};
  return m;
}
}  // namespace kvlab
