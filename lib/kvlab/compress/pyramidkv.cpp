// pyramidkv — SnapKV's selection with budgets that shrink from the bottom layer to the top.
//
// Paper: Zefan Cai, Yichi Zhang, Bofei Gao, Yuliang Liu, Tianyu Liu, Keming Lu, Wayne Xiong,
//   Yue Dong, Baobao Chang, Junjie Hu, Wen Xiao, "PyramidKV: Dynamic KV Cache Compression based
//   on Pyramidal Information Funneling", arXiv:2406.02069; official code Zefan-Cai/KVCache-Factory
//   (PyramidKVCluster).
//
// Summary. Attention is broad in the lower layers and concentrates on few tokens higher up
// ("pyramidal information funneling"), so lower layers get more cache. With the average budget
// per layer `budget` and the observation window w: B = budget − w, min = B/beta, max = 2B − min,
// layer ℓ (0 = bottom) keeps max − ℓ·(max − min)/(L − 1) + w entries, chosen per KV head by
// SnapKV's rule (snapkv.cpp). The arithmetic sequence averages to B + w = budget.
//
// Cost (issue 13): SnapKV's (about 4 ms per (layer, KV head) at n = 4096, ~7x uniform): the
// observation window's attention over every key, O(w·g·n·d), against uniform's O(n) draw.
//
// Parameters:
//   window [32], kernel [7], pooling [max], gqa_reduce [mean]   as snapkv
//   beta [20]               min = B / beta
//   pyramid_floor [false]   true: KVCache-Factory's integer arithmetic (min = B // beta,
//                           step = (max − min) // (L − 1)), whose layer budgets overshoot L·budget
//                           by up to ~5%; false: exact budgets summing to L·budget
//                           (pyramidkv_layer_budgets in snapkv.h)
//
// Deviations:
//   - Default rounding: the exact rational budgets get largest-remainder rounding (floor, then +1
//     to the layers with the largest fractional parts), so the total is exactly L·budget, each
//     layer is within one of its exact value and budgets never increase with the layer
//     (docs/methods.md §3); `pyramid_floor=true` reproduces the official rounding.
//   - A single layer's budget differs from the asked `budget` by design (only the average over
//     layers matches); with n_layers = 1, or budget <= window, every layer gets `budget`.
//   - As KVCache-Factory: when max would exceed n − w it is capped there and min = 2B − max.
//   - The SnapKV deviations apply (window keys are region keys at the window's positions, etc.).
#include <ATen/ATen.h>

#include <algorithm>

#include "kvlab/compress/preset.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/snapkv.h"
#include "kvlab/core/check.h"

namespace kvlab {

std::vector<int64_t> pyramidkv_layer_budgets(int64_t budget, int64_t window, int64_t n,
                                             int n_layers, int64_t beta, bool floor_mode) {
  TORCH_INTERNAL_ASSERT(n_layers >= 1 && beta >= 1 && budget >= 0 && n >= budget);
  const int64_t L = n_layers, B = budget - window;
  if (L == 1 || B <= 0) return std::vector<int64_t>(static_cast<size_t>(L), budget);
  std::vector<int64_t> out(static_cast<size_t>(L));
  if (floor_mode) {
    int64_t mn = B / beta, mx = 2 * B - mn;
    if (mx >= n - window) mx = n - window, mn = 2 * B - mx;
    const int64_t step = (mx - mn) / (L - 1);
    for (int64_t l = 0; l < L; ++l) out[l] = mx - l * step + window;
    return out;
  }
  // Exact: max and min as fractions over beta; x_ℓ = (mx·(L−1) − ℓ·(mx − mn)) / (beta·(L−1)).
  int64_t mx = 2 * B * beta - B, mn = B;  // ×beta
  if (mx >= (n - window) * beta) mx = (n - window) * beta, mn = 2 * B * beta - mx;
  // Largest-remainder rounding: floor every x_ℓ, then +1 to the `remainder` layers with the
  // largest fractional parts (ties: the lower layer). Non-increasing in ℓ survives (equal floors
  // have non-increasing fractions), and no layer exceeds ceil(x_ℓ) <= n − w.
  const int64_t den = beta * (L - 1);
  std::vector<int64_t> frac(static_cast<size_t>(L));
  int64_t total = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t num = mx * (L - 1) - l * (mx - mn);  // >= 0
    out[l] = num / den, frac[l] = num % den;
    total += out[l];
  }
  const int64_t remainder = L * B - total;  // in [0, L): Σ x_ℓ = L·B exactly
  TORCH_INTERNAL_ASSERT(remainder >= 0 && remainder < L, "pyramidkv remainder ", remainder);
  std::vector<int64_t> order(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) order[l] = l;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return frac[a] > frac[b]; });
  for (int64_t j = 0; j < remainder; ++j) out[order[j]] += 1;
  for (auto& b : out) b += window;
  return out;
}

namespace {

class PyramidKV final : public Compressor {
 public:
  explicit PyramidKV(Params p) {
    opt_ = read_snapkv_options(p, "pyramidkv");
    beta_ = p.get_int("beta", 20);
    floor_ = p.get_bool("pyramid_floor", false);
    KVLAB_CHECK(beta_ >= 1, "pyramidkv: parameter 'beta' must be >= 1, got {}", beta_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "pyramidkv"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return opt_.window; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens();
    const int64_t b = resolve_budget(opt, n);
    KVLAB_CHECK(kv.n_layers >= 1 && kv.layer >= 0 && kv.layer < kv.n_layers,
                "pyramidkv: layer {} is outside [0, n_layers={})", kv.layer, kv.n_layers);
    const int64_t layer_b =
        pyramidkv_layer_budgets(b, opt_.window, n, kv.n_layers, beta_, floor_)[kv.layer];
    if (layer_b >= n) return keep_all(kv);
    return gather_kept(kv, snapkv_select(kv, layer_b, opt_).to(kv.keys.device()));  // [Hkv, b_ℓ]
  }

 private:
  SnapKVOptions opt_;
  int64_t beta_ = 20;
  bool floor_ = false;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_pyramidkv(const nlohmann::json& params) {
  return std::make_unique<PyramidKV>(Params(params, "pyramidkv"));
}

// Preset "paper": KVCache-Factory's run_longbench.py (the PyramidKV authors' release): window_sizes 8,
// kernel_sizes 7, pooling maxpool, beta 20 (pyramidkv_utils.py); the layer budgets sum exactly to
// L·budget (kvlab's rounding; `pyramid_floor` gives the release's flooring).
MethodPreset paper_preset_pyramidkv() {
  return {{{"window", 8}, {"kernel", 7}, {"pooling", "max"}, {"beta", 20}},
          0, 0, "KVCache-Factory run_longbench.py: window 8, kernel 7, max-pool, beta 20", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_pyramidkv() {
  CompressorInfo m;
  m.name = "pyramidkv";
  m.description =
      "SnapKV with budgets shrinking from bottom to top layer (PyramidKV)";
  m.make = make_pyramidkv;
  m.paper = paper_preset_pyramidkv;
  m.cost = {1.0, "known: as SnapKV, O(w n d)",
            "known cost: SnapKV's selection with a per-layer budget, O(w·n·d) (PyramidKV, Cai et al.)"};
  return m;
}
}  // namespace kvlab
