// kvcompose — the context's attention to itself when fed again, with one cut over every layer deciding
// how many tokens each layer keeps.
//
// Paper: Dmitry Akulov, Mohamed Sana, Antonio De Domenico, Tareq Si Salem, Nicola Piovesan, Fadhel
//   Ayed, "KVCompose: Efficient Structured KV Cache Compression with Composite Tokens", 2025,
//   arXiv:2509.05165. kvlab follows NVIDIA kvpress 0.5.5 `KVComposePress`
//   (kvpress/presses/kvcompose_press.py), which the golden test replays
//   (data_scripts/make_kvcompose_golden.py, tests/generate/test_kvpress_golden.cpp).
//
// Summary. After the prefill, the context is fed to the model once more, right after itself
// (generate/reconstruction.h, ReconstructionRequest::repeat_context: one forward over the exact cache).
// Per layer, each context entry's score on KV head h is the mean over h's query heads of the most
// attention any query of the repeat gives it (a[l][h][i]); add_mean_across_heads adds the mean over
// the layer's KV heads, s[l][h] = a[l][h] + mean_h' a[l][h']. A layer's "composite tokens" are the
// positions of its heads aligned by rank: c[l][j] = mean over h of the j-th largest of s[l][h]; the
// first compressed layer's row is raised to the maximum over layers. One cut over every layer's
// composites keeps L·b of them for a budget of b per head; a layer keeps as many tokens as it won
// (at least max(1, keep_token_lower_bound)), every KV head of it the same count, each its own best by
// s (structured). structured=false cuts the heads' sorted scores themselves instead (one count per
// head, no floor: a head may keep nothing).
//
//   scores   the context's reconstruction_scores [L, Hkv, n] float32 (a; NaN rows: layers not compressed)
//   kept     per head an ascending list of region indices; layers hold different counts
//
// Parameters: structured [true], add_mean_across_heads [true], keep_token_lower_bound [0].
//
// Deviations and notes:
//   - kvpress's other aggregations (agg_task, agg_group, agg_head: max / mean / mean by default) and
//     add_v_norm (every layer's value norms, which one layer's call does not see) are not offered.
//   - Memory. Structured, kvpress shrinks each layer's cache to its count, as kvlab; unstructured, it
//     masks the pruned keys (no memory saved) where kvlab drops them (CompressedLayer::split_heads).
//   - The budget is per head on average over layers: the cut keeps L·b composites, b =
//     resolve_budget (kvpress: int(L·n·(1 - compression_ratio)), the same where L·n·ratio is whole);
//     the floor of one token per layer may add a few.
//   - With --keep-first/--keep-last the cut is over the compressed regions (the same positions in every
//     layer); the exact parts are outside it, as for kvzip.
//   - Sliding window layers (gemma3) are held exactly and left out of the cut.
//   - Ties go to the lower (layer, position) at the cut and to the lower position within a head
//     (torch.topk and argsort leave them unspecified).
//   - Prefill-only (as kvpress): decoded tokens are appended exactly to every head.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class KVCompose final : public Compressor {
 public:
  explicit KVCompose(Params p) {
    structured_ = p.get_bool("structured", true);
    add_mean_ = p.get_bool("add_mean_across_heads", true);
    lower_bound_ = p.get_int("keep_token_lower_bound", 0);
    KVLAB_CHECK(lower_bound_ >= 0, "kvcompose: parameter 'keep_token_lower_bound' must be >= 0, got {}", lower_bound_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "kvcompose"; }
  nlohmann::json params() const override { return params_; }
  ReconstructionRequest reconstruction() const override {
    ReconstructionRequest rq;
    rq.repeat_context = true;
    return rq;
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const at::Tensor s = enhanced_scores(kv);  // [L, Hkv, n] float32, NaN rows: layers not compressed
    std::vector<int64_t> layers;               // the compressed layers
    for (int64_t l = 0; l < s.size(0); ++l)
      if (!std::isnan(s[l][0][0].item<float>())) layers.push_back(l);
    const int64_t me = std::find(layers.begin(), layers.end(), int64_t(kv.layer)) - layers.begin();
    KVLAB_CHECK(me < int64_t(layers.size()), "kvcompose: layer {} has no scores (a layer held exactly)", kv.layer);
    const at::Tensor ls = at::tensor(layers, at::kLong);
    // Composite tokens: each head's scores sorted descending, [Lc, Hkv, n].
    const at::Tensor sorted = std::get<0>(s.index_select(0, ls).sort(-1, /*descending=*/true));
    at::Tensor composite;  // [Lc, n] (structured) or [Lc, Hkv, n]
    if (structured_) {
      composite = sorted.mean(1);
      raise_first(composite);
      composite.select(0, 0).copy_(std::get<0>(composite.max(0)));  // the first compressed layer keeps the most
    } else {
      composite = sorted.clone();
      raise_first(composite);
    }
    // One cut over every compressed layer (and head): L·b per head on average.
    const at::Tensor c64 = composite.to(at::kDouble).contiguous();
    const int64_t rows = c64.numel() / n, total = rows * b;
    const std::vector<int64_t> top = detail::top_k_indices(c64.data_ptr<double>(), c64.numel(), total);
    std::vector<int64_t> won(static_cast<size_t>(rows), 0);  // composites won per row (layer or layer x head)
    for (int64_t f : top) ++won[static_cast<size_t>(f / n)];
    // This layer's heads: each keeps its count of its best scores.
    const at::Tensor mine = s[kv.layer].to(at::kDouble).contiguous();  // [Hkv, n]
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(h_kv));
    for (int64_t h = 0; h < h_kv; ++h) {
      const int64_t count = structured_ ? std::max<int64_t>(won[me], std::max<int64_t>(1, lower_bound_))
                                        : won[me * h_kv + h];
      kept[h] = detail::top_k_indices(mine.data_ptr<double>() + h * n, n, std::min(count, n));
    }
    return gather_kept(kv, detail::pad_index_rows(kept).to(kv.keys.device()));  // [Hkv, max_h count_h]
  }

 private:
  // s = a (+ the mean over the layer's KV heads): [L, Hkv, n] float32 on CPU, as kvpress's
  // enhance_scores leaves KVComposePress.scores.
  at::Tensor enhanced_scores(const LayerKV& kv) const {
    KVLAB_CHECK(kv.context.has(inputs::reconstruction_scores),
                "kvcompose: needs the scores of a second forward of the context (generation, ppl and the task "
                "commands make them; replay has no model)");
    const at::Tensor& r = kv.context.get(inputs::reconstruction_scores);
    KVLAB_CHECK(r.dim() == 3 && r.size(1) == kv.n_kv_heads() && r.size(2) == kv.n_tokens() && kv.layer < r.size(0),
                "kvcompose: second-forward scores must be [n_layers > {}, {}, {}]", kv.layer, kv.n_kv_heads(),
                kv.n_tokens());
    at::Tensor a = r.to(at::kCPU, at::kFloat).contiguous();  // [L, Hkv, n]
    return add_mean_ ? a + a.mean(1, /*keepdim=*/true) : a;
  }
  // keep_token_lower_bound: the first composites of every row raised by 1e9 (kvpress), so each
  // layer (head) wins at least that many.
  void raise_first(at::Tensor& composite) const {
    const int64_t m = std::min<int64_t>(lower_bound_, composite.size(-1));
    if (m > 0) composite.narrow(-1, 0, m).add_(1e9);
  }

  bool structured_ = true, add_mean_ = true;
  int64_t lower_bound_ = 0;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_kvcompose(const nlohmann::json& params) {
  return std::make_unique<KVCompose>(Params(params, "kvcompose"));
}

// Preset "paper": kvpress KVComposePress's defaults (the paper's structured variant): per query head
// the max over the repeat's queries, the mean over the group, the mean over KV heads added, composites
// averaged over heads.
MethodPreset paper_preset_kvcompose() {
  return {{{"structured", true}, {"add_mean_across_heads", true}, {"keep_token_lower_bound", 0}},
          0,
          0,
          "Akulov et al. 2025 (KVCompose) / kvpress KVComposePress defaults: structured, max over queries, mean over "
          "the group, mean over heads added",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_kvcompose() {
  CompressorInfo m;
  m.name = "kvcompose";
  m.description =
      "attention each entry gets when the context is fed again after itself, one cut over all layers' composite "
      "tokens sets each layer's count, every head of a layer the same (KVCompose; kvpress KVComposePress)";
  m.make = make_kvcompose;
  m.paper = paper_preset_kvcompose;
  m.cost = {2.0, "known: a second prefill over the cache, O(n^2 d) per layer",
            "known cost: the context fed again attending over the n cached entries, O(n^2 d) per layer plus the "
            "dense layers of one more prefill, then sorts and a top-k over L·n composite scores (KVCompose, "
            "Akulov et al. 2025; kvpress warns of a cache of ~2x the context during prefill)"};
  m.inputs = {inputs::reconstruction_scores};
  return m;
}
}  // namespace kvlab
