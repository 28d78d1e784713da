// merging — a scorer's top-b kept, each evicted entry's value folded into the kept entry whose key
// is most like its own (merge on evict).
//
// Source: NVIDIA kvpress 0.5.5 `MergingPress` (kvpress/presses/merging_press.py, a wrapper around
//   any ScorerPress, "inspired by" Token Merging, Bolya et al. ICLR 2023, and D2O, Wan et al. 2024;
//   no paper of its own). Followed as kvpress defines it and checked against it
//   (tests/generate/test_kvpress_golden.cpp: kept positions and the greedy ids, which read the
//   merged values).
//
// Summary. Per KV head, the scorer's b best positions are kept (keys unchanged). Each evicted entry
// e finds the kept entry t of largest cosine similarity between keys (keys divided by max(‖k‖,
// 1e-6)), sim_e. It merges when sim_e ≥ `similarity_threshold` [0] and, with `merge_fraction` [1]
// below 1, when sim_e is at least the (1 − merge_fraction) quantile of the head's sims (those under
// the threshold counted as −inf; torch.quantile's linear rule). Its weight is
//     w_e = max(sim_e, 0) · ‖v_e‖ / (‖v_e‖ + ‖v_t‖ + 1e-6),
// and every kept entry that received any weight takes v_t ← (v_t + Σ w_e v_e) / (1 + Σ w_e).
//
//   scores  [Hkv, n] from the scorer; kept [Hkv, b], evicted [Hkv, n − b] (ascending)
//   sim     [Hkv, n − b, b] cosines of evicted to kept keys -> (sim_e, t_e) per evicted entry
//   values  [Hkv, b, d] the kept values after the weighted merge; bias 0 (no mass correction)
//
// Parameters: scorer [snapkv] (any method with per-position scores), similarity_threshold [0]
// (in [0, 1]), merge_fraction [1] (in (0, 1]); every other parameter is the scorer's.
//
// Deviations and notes:
//   - kvpress merges in float32; kvlab in the cache's dtype (float32 in generation, float64 in
//     replay). kept_idx is defined (keys kept one to one) though the values are not the originals,
//     as for cam. Ties in the top-b go to the lower position. Prefill-only, as kvpress.
#include <ATen/ATen.h>

#include <limits>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

constexpr double kEps = 1e-6;  // kvpress's _EPS

class Merging final : public detail::ScorerWrapper {
 public:
  explicit Merging(const nlohmann::json& given) : ScorerWrapper("merging") {
    Params p = own_params(given, {"scorer", "similarity_threshold", "merge_fraction"});
    const std::string scorer = p.get_string("scorer", "snapkv", detail::top_score_methods());
    threshold_ = p.get_double("similarity_threshold", 0.0);
    fraction_ = p.get_double("merge_fraction", 1.0);
    KVLAB_CHECK(threshold_ >= 0.0 && threshold_ <= 1.0,
                "merging: parameter 'similarity_threshold' must be in [0, 1], got {}", threshold_);
    KVLAB_CHECK(fraction_ > 0.0 && fraction_ <= 1.0, "merging: parameter 'merge_fraction' must be in (0, 1], got {}",
                fraction_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), d = kv.keys.size(2);
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const at::Tensor scores = scorer_scores(kv, opt).contiguous();  // [Hkv, n]
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(h_kv)), evicted(static_cast<size_t>(h_kv));
    for (int64_t h = 0; h < h_kv; ++h) {
      kept[h] = detail::top_k_indices(scores.data_ptr<double>() + h * n, n, b);
      for (int64_t i = 0, j = 0; i < n; ++i) {
        if (j < b && kept[h][j] == i) ++j;
        else evicted[h].push_back(i);
      }
    }
    CompressedKV out = gather_kept(kv, detail::pad_index_rows(kept).to(kv.keys.device()));  // [Hkv, b]
    if (b == 0) return out;
    const at::Tensor ev = detail::pad_index_rows(evicted).to(kv.keys.device());  // [Hkv, e]
    const int64_t e = ev.size(1);
    auto unit = [](const at::Tensor& k) { return k / k.norm(2, -1, true).clamp_min(kEps); };
    const at::Tensor ke = kv.keys.gather(1, ev.unsqueeze(-1).expand({h_kv, e, d}));                        // [Hkv, e, d]
    const at::Tensor ve = kv.values.gather(1, ev.unsqueeze(-1).expand({h_kv, e, kv.values.size(2)}));      // [Hkv, e, dv]
    const auto [sim, target] = at::matmul(unit(ke), unit(out.keys).transpose(1, 2)).max(-1);               // [Hkv, e]
    at::Tensor ok = sim >= threshold_;                                                                     // [Hkv, e]
    if (fraction_ < 1.0 && ok.any().item<bool>()) {
      const at::Tensor cut = at::quantile(sim.masked_fill(ok.logical_not(), -std::numeric_limits<double>::infinity()),
                                          1.0 - fraction_, -1, true);  // [Hkv, 1]
      ok = ok.logical_and(sim >= cut);
    }
    const at::Tensor en = ve.norm(2, -1), tn = out.values.norm(2, -1).gather(1, target);  // [Hkv, e]
    const at::Tensor w = sim.clamp_min(0) * ok.to(sim.scalar_type()) * en / (en + tn + kEps);  // [Hkv, e]
    const at::Tensor acc = at::zeros_like(out.values).scatter_add(
        1, target.unsqueeze(-1).expand({h_kv, e, out.values.size(2)}), w.unsqueeze(-1) * ve);  // [Hkv, b, dv]
    const at::Tensor wsum = at::zeros({h_kv, b}, w.options()).scatter_add(1, target, w);       // [Hkv, b]
    out.values = at::where((wsum > 0).unsqueeze(-1), (out.values + acc) / (1.0 + wsum).unsqueeze(-1), out.values);
    return out;
  }

 private:
  double threshold_ = 0.0, fraction_ = 1.0;
};

}  // namespace

std::unique_ptr<Compressor> make_merging(const nlohmann::json& params) { return std::make_unique<Merging>(params); }

// Preset "paper": no paper; kvpress MergingPress's defaults (threshold 0, every evicted entry merged)
// around SnapKV's LongBench setting, as chunkkv (kvlab's choice of scorer).
MethodPreset paper_preset_merging() {
  return {{{"scorer", "snapkv"}, {"similarity_threshold", 0.0}, {"merge_fraction", 1.0}, {"window", 32}, {"kernel", 7},
           {"pooling", "max"}},
          0,
          0,
          "kvpress MergingPress defaults (similarity_threshold 0, merge_fraction 1) around SnapKV (window 32, kernel 7 "
          "max-pool; kvlab's choice of scorer)",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_merging() {
  CompressorInfo m;
  m.name = "merging";
  m.description =
      "a scorer's top entries kept, each evicted value folded into the kept entry of most similar key, weighted by similarity and value norms (kvpress MergingPress)";
  m.make = make_merging;
  m.paper = paper_preset_merging;
  m.cost = {2.0, "known: the scorer's cost + (n − b)·b key cosines",
            "known cost: the wrapped scorer's, then every evicted key against every kept key (kvpress MergingPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
