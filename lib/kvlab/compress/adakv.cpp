// adakv — a scorer's budget shared across the KV heads of a layer, not split evenly.
//
// Paper: Yuan Feng, Junlin Lv, Yukun Cao, Xike Xie, S. Kevin Zhou, "Ada-KV: Optimizing KV Cache
//   Eviction by Adaptive Budget Allocation for Efficient LLM Inference", arXiv:2407.11550
//   (2024). Checked against NVIDIA kvpress 0.5.5 `AdaKVPress`
//   (kvpress/presses/adakv_press.py), which wraps any ScorerPress.
//
// Summary. A per-head top-k scorer (`scorer`: knorm, keydiff, lagkv, snapkv, expected_attention or compactor, the methods with
// Compressor::keep_scores) scores every region position of every KV head. With a budget of b
// entries per head, the layer keeps H·b entries in all: first each head's n_safe = ⌊α·b⌋ best
// (at least 1; the safeguard, α = `alpha_safeguard`), then the best of the rest ranked across
// all heads of the layer together. A head whose scores are concentrated gives entries to a head
// whose scores are spread, so heads hold different counts (mean b per head).
//
//   scores  [Hkv, n] float64 from the scorer (+inf = always kept)
//   kept    per head an ascending list of region indices, lengths differing, total H·b
//
// Parameters: scorer [snapkv], alpha_safeguard [0.2]; every other parameter is the scorer's own
//   (e.g. `--param adakv.window=32`), checked by the scorer.
//
// Deviations and notes:
//   - Memory. kvpress keeps the whole cache and masks the pruned keys with a "fake key" while
//     decoding ("does not reduce peak memory", its docs say); kvlab drops them. compress() returns
//     the heads padded to the longest (bias −inf, as every CompressedKV), and the generation cache
//     stores each head's entries on their own (CompressedLayer::split_heads), so the bytes held
//     are those of H·b entries.
//   - Ties go to the lower (head, position) (torch.topk leaves them unspecified).
//   - Prefill-only (as kvpress): decoded tokens are appended exactly to every head.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class AdaKV final : public detail::ScorerWrapper {
 public:
  explicit AdaKV(const nlohmann::json& given) : ScorerWrapper("adakv") {
    Params p = own_params(given, {"scorer", "alpha_safeguard"});
    const std::string scorer = p.get_string("scorer", "snapkv", detail::top_score_methods());
    alpha_ = p.get_double("alpha_safeguard", 0.2);
    KVLAB_CHECK(alpha_ >= 0 && alpha_ <= 1, "adakv: parameter 'alpha_safeguard' must be in [0, 1], got {}", alpha_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    at::Tensor scores = scorer_scores(kv, opt);  // [Hkv, n]
    const std::vector<char> kept = detail::adakv_selection(scores.data_ptr<double>(), h_kv, n, b, alpha_);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    for (int64_t h = 0; h < h_kv; ++h)
      for (int64_t i = 0; i < n; ++i)
        if (kept[h * n + i]) rows[h].push_back(i);
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, max_h count_h]
  }

 private:
  double alpha_ = 0.2;
};

}  // namespace

namespace detail {

int64_t adakv_safeguard(int64_t b, double alpha) {
  return alpha > 0 && b > 0 ? std::max<int64_t>(1, static_cast<int64_t>(alpha * double(b))) : 0;
}

std::vector<char> adakv_selection(const double* sc, int64_t h_kv, int64_t n, int64_t b, double alpha) {
  // Safeguard: each head's n_safe best, then the rest of the layer's H·b by score across heads.
  const int64_t n_safe = adakv_safeguard(b, alpha);
  std::vector<char> kept(static_cast<size_t>(h_kv * n), 0);
  for (int64_t h = 0; h < h_kv; ++h)
    for (int64_t i : top_k_indices(sc + h * n, n, n_safe)) kept[h * n + i] = 1;
  std::vector<int64_t> rest;  // flat (head, position) indices not safeguarded
  for (int64_t f = 0; f < h_kv * n; ++f)
    if (!kept[f]) rest.push_back(f);
  const int64_t more = h_kv * b - h_kv * n_safe;
  auto better = [sc](int64_t a, int64_t c) { return sc[a] > sc[c] || (sc[a] == sc[c] && a < c); };
  std::nth_element(rest.begin(), rest.begin() + more, rest.end(), better);
  for (int64_t j = 0; j < more; ++j) kept[rest[j]] = 1;
  return kept;
}

}  // namespace detail

std::unique_ptr<Compressor> make_adakv(const nlohmann::json& params) { return std::make_unique<AdaKV>(params); }

// Preset "paper": Ada-KV's own experiments wrap SnapKV (Ada-SnapKV, window 32, max-pool kernel 7,
// as SnapKV's LongBench config) with α = 0.2 (the released code's floor_alpha; kvpress's default).
MethodPreset paper_preset_adakv() {
  return {{{"scorer", "snapkv"}, {"alpha_safeguard", 0.2}, {"window", 32}, {"kernel", 7}, {"pooling", "max"}},
          0,
          0,
          "Feng et al. (Ada-KV): Ada-SnapKV, window 32, kernel 7 max-pool, safeguard alpha 0.2",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_adakv() {
  CompressorInfo m;
  m.name = "adakv";
  m.description =
      "a scorer's budget shared across a layer's KV heads, each head at least alpha of it (Ada-KV; kvpress AdaKVPress)";
  m.make = make_adakv;
  m.paper = paper_preset_adakv;
  m.cost = {1.0, "known: the scorer's cost + a top-k over H n",
            "known cost: the wrapped scorer's, then a per-head top-k and one over the layer's H·n scores (Ada-KV, Feng et al.)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
