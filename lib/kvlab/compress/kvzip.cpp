// kvzip — keep the entries the model needs to reconstruct its context, ranked over the whole model.
//
// Paper: Jang-Hyun Kim, Jinuk Kim, Sangwoo Kwon, Jae W. Lee, Sangdoo Yun, Hyun Oh Song, "KVzip:
//   Query-Agnostic KV Cache Compression with Context Reconstruction", NeurIPS 2025,
//   arXiv:2505.23416; official code snu-mllab/KVzip. Checked against NVIDIA kvpress 0.5.5
//   `KVzipPress` (kvpress/presses/kvzip_press.py), which the golden test replays
//   (data_scripts/make_kvzip_golden.py, tests/generate/test_kvpress_golden.cpp).
//
// Summary. After the prefill, the model is made to repeat its context (generate/reconstruction.h:
// a second forward, chunk by chunk, over the exact cache); each cached entry is scored by the most
// attention a reconstruction query of its KV group puts on it. The first n_sink positions are always
// kept. One cut over every layer's and KV head's scores together keeps L·H·b entries for a budget of
// b per head (layerwise=false, the paper's and kvpress's default): layers and heads hold different
// counts, the total is the budget's. layerwise=true cuts each layer over its heads (H·b per layer).
//
//   scores   the context's reconstruction_scores [L, Hkv, n] float32 (NaN rows: layers not compressed)
//   kept     per head an ascending list of region indices, lengths differing
//
// Parameters: n_sink [4], chunk_size [2048] (context tokens per reconstruction forward), layerwise [false].
//
// Deviations and notes:
//   - Memory. kvpress masks the pruned keys with a fake key while decoding (its AdaKV mechanism:
//     "does not reduce peak memory"); kvlab drops them and holds each head's entries on their own
//     (CompressedLayer::split_heads), so the bytes held are the budget's.
//   - The reconstruction skips the chat template's prefix, as kvpress (those positions score 0);
//     with a BOS the model's tokenizer adds, kvlab counts it in the prefix (kvpress would reconstruct it).
//   - With --keep-first/--keep-last or count-whole budgets, the cut is over the compressed regions
//     (the same positions in every layer); exact parts are outside it.
//   - Sliding window layers (gemma3) are held exactly and left out of the cut (kvpress refuses gemma3).
//   - Ties go to the lower (layer, head, position) (torch.topk leaves them unspecified).
//   - KVzip+ normalisation (kvpress's kvzip_plus_normalization) is not built.
//   - Prefill-only (as kvpress): decoded tokens are appended exactly to every head.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Kvzip final : public Compressor {
 public:
  explicit Kvzip(Params p) {
    n_sink_ = p.get_int("n_sink", 4);
    chunk_size_ = p.get_int("chunk_size", 2048);
    layerwise_ = p.get_bool("layerwise", false);
    KVLAB_CHECK(n_sink_ >= 0, "kvzip: parameter 'n_sink' must be >= 0, got {}", n_sink_);
    KVLAB_CHECK(chunk_size_ > 0, "kvzip: parameter 'chunk_size' must be > 0, got {}", chunk_size_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "kvzip"; }
  nlohmann::json params() const override { return params_; }
  ReconstructionRequest reconstruction() const override { return {chunk_size_, n_sink_}; }

  // [Hkv, n] float64: this layer's reconstruction scores, +inf on the sinks.
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override {
    return all_scores(kv).select(0, kv.layer).contiguous();
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const at::Tensor all = all_scores(kv);  // [L, Hkv, n]
    const int64_t n_layers = all.size(0), per_layer = h_kv * n;
    const double* sc = all.data_ptr<double>();
    // This layer's count: H·b, or its share of the model-wide cut over every compressed layer.
    int64_t m = h_kv * b;
    if (!layerwise_) {
      std::vector<int64_t> flat;  // (layer, head, position) indices of the compressed layers
      for (int64_t l = 0; l < n_layers; ++l)
        if (!std::isnan(sc[l * per_layer]))
          for (int64_t f = l * per_layer; f < (l + 1) * per_layer; ++f) flat.push_back(f);
      const int64_t total = h_kv * b * int64_t(flat.size() / size_t(per_layer));
      auto better = [sc](int64_t a, int64_t c) { return sc[a] > sc[c] || (sc[a] == sc[c] && a < c); };
      std::nth_element(flat.begin(), flat.begin() + total, flat.end(), better);
      m = std::count_if(flat.begin(), flat.begin() + total,
                        [&](int64_t f) { return f / per_layer == kv.layer; });
    }
    const std::vector<int64_t> top = detail::top_k_indices(sc + kv.layer * per_layer, per_layer, m);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    for (int64_t f : top) rows[f / n].push_back(f % n);  // ascending within each head
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, max_h count_h]
  }

 private:
  // [L, Hkv, n] float64 on CPU: every layer's scores, the sinks (absolute positions < n_sink) +inf.
  at::Tensor all_scores(const LayerKV& kv) const {
    KVLAB_CHECK(kv.context.has(inputs::reconstruction_scores),
                "kvzip: needs the scores of a second prefill that reconstructs the context (generation, ppl "
                "and the task commands make them; replay has no model)");
    const at::Tensor& r = kv.context.get(inputs::reconstruction_scores);
    KVLAB_CHECK(r.dim() == 3 && r.size(1) == kv.n_kv_heads() && r.size(2) == kv.n_tokens() && kv.layer < r.size(0),
                "kvzip: reconstruction scores must be [n_layers > {}, {}, {}]", kv.layer, kv.n_kv_heads(),
                kv.n_tokens());
    at::Tensor s = r.to(at::kCPU, at::kDouble).contiguous();
    const int64_t sinks = std::clamp<int64_t>(n_sink_ - kv.pos0, 0, kv.n_tokens());
    if (sinks > 0) {
      at::Tensor head = s.narrow(2, 0, sinks);
      // Rows of layers left out (NaN) stay NaN.
      head.copy_(at::where(head.isnan(), head, at::full_like(head, std::numeric_limits<double>::infinity())));
    }
    return s;
  }

  int64_t n_sink_ = 4, chunk_size_ = 2048;
  bool layerwise_ = false;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_kvzip(const nlohmann::json& params) {
  return std::make_unique<Kvzip>(Params(params, "kvzip"));
}

// Preset "paper": kvpress KVzipPress's defaults, which follow the official code: 4 sinks, chunks
// of 2,048 context tokens, one cut over every layer and head (non-uniform head budgets, §3.3).
MethodPreset paper_preset_kvzip() {
  return {{{"n_sink", 4}, {"chunk_size", 2048}, {"layerwise", false}},
          0,
          0,
          "Kim et al. 2025 (KVzip) / kvpress KVzipPress defaults: 4 sinks, chunk 2048, one cut over all layers and heads",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_kvzip() {
  CompressorInfo m;
  m.name = "kvzip";
  m.description =
      "attention each entry gets while the model repeats its context (a second prefill), one cut over all layers and heads, query-agnostic (KVzip; kvpress KVzipPress)";
  m.make = make_kvzip;
  m.paper = paper_preset_kvzip;
  m.cost = {2.0, "known: a second prefill over the cache, O(n^2 d) per layer",
            "known cost: the context fed again (repeat prompt + chunks of c tokens) attending over the n cached entries, O(n·(n + c)·d) per layer plus the dense layers of one more prefill, then a top-k over L·H·n scores (KVzip, Kim et al. 2025: '2-3 times the initial prefilling cost' in kvpress)"};
  m.inputs = {inputs::reconstruction_scores};
  return m;
}
}  // namespace kvlab
