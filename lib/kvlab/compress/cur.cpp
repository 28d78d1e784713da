// cur — keep the tokens whose keys and values carry the most leverage (CurDKV's approximate CUR).
//
// Paper: "CurDKV", Value-Guided KV Compression via approximated CUR decomposition, arXiv:2509.15038,
//   as NVIDIA kvpress 0.5.5 defines it (`CURPress`, kvpress/presses/cur_press.py), which kvlab
//   follows and is checked against (tests/generate/test_kvpress_golden.cpp).
//
// Summary. A token's leverage in the key (value) matrix is approximated by its squared row norm:
// k2_j = ‖k_j‖², v2_j = ‖v_j‖² per KV head. With the local approximation (default), each is
// normalised within consecutive windows of `window` tokens (the last window zero-padded), so a
// token competes with its neighbours only. The score is the product k2·v2 (or k2, v2, their mean:
// `leverage`), normalised to sum 1 over the region; the first `n_sink` region tokens score 1 (kept
// first). The `budget` best are kept exact (bias 0). Query-agnostic, O(n·d).
//
// Parameters: n_sink (4), leverage ("kv_product" | "key" | "value" | "kv_avg"), local (true),
// window (16): kvpress's num_sinks, leverage_type, use_local_approximation, local_window_size.
//
// Deviations:
//   - kvpress's `use_random_leverage` (a Gaussian projection drawn from torch's global generator
//     before the norms) is not built: nothing outside torch could replay its draw.
//   - Float64 scores (kvpress: the cache's float32); ties go to the lower index.
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/key_scores.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// x [Hkv, n] >= 0 -> [Hkv, n]: each run of `w` consecutive entries divided by its sum (the last
// run padded with zeros to w, as kvpress's F.pad).
at::Tensor normalise_windows(const at::Tensor& x, int64_t w) {
  const int64_t h = x.size(0), n = x.size(1), padded = (n + w - 1) / w * w;
  auto p = at::zeros({h, padded}, x.options());
  p.narrow(1, 0, n).copy_(x);
  auto r = p.reshape({h, padded / w, w});                            // [Hkv, n/w, w]
  return (r / r.sum(-1, /*keepdim=*/true)).reshape({h, padded}).narrow(1, 0, n);  // [Hkv, n]
}

}  // namespace

at::Tensor cur_scores(const at::Tensor& keys, const at::Tensor& values, int64_t n_sink, const std::string& leverage,
                      bool local, int64_t window) {
  auto k2 = keys.to(at::kCPU, at::kDouble).pow(2).sum(-1);    // [Hkv, n]
  auto v2 = values.to(at::kCPU, at::kDouble).pow(2).sum(-1);  // [Hkv, n]
  if (local) k2 = normalise_windows(k2, window), v2 = normalise_windows(v2, window);
  at::Tensor s = leverage == "key"     ? k2
                 : leverage == "value" ? v2
                 : leverage == "kv_avg" ? (k2 + v2) / 2
                                        : k2 * v2;            // [Hkv, n]
  s = s / s.sum(-1, /*keepdim=*/true);
  const int64_t sinks = std::min<int64_t>(n_sink, s.size(1));
  if (sinks > 0) s.narrow(1, 0, sinks).fill_(1.0);
  return s.contiguous();
}

namespace {

class Cur final : public Compressor {
 public:
  explicit Cur(Params p)
      : n_sink_(p.get_int("n_sink", 4)),
        leverage_(p.get_string("leverage", "kv_product", {"kv_product", "key", "value", "kv_avg"})),
        local_(p.get_bool("local", true)),
        window_(p.get_int("window", 16)),
        params_(p.effective()) {
    p.finish();
    KVLAB_CHECK(n_sink_ >= 0, "cur: parameter 'n_sink' must be >= 0, got {}", n_sink_);
    KVLAB_CHECK(window_ >= 1, "cur: parameter 'window' must be >= 1, got {}", window_);
  }
  std::string name() const override { return "cur"; }
  nlohmann::json params() const override { return params_; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override {
    return cur_scores(kv.keys, kv.values, n_sink_, leverage_, local_, window_);  // [Hkv, n]
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  int64_t n_sink_;
  std::string leverage_;
  bool local_;
  int64_t window_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_cur(const nlohmann::json& params) {
  return std::make_unique<Cur>(Params(params, "cur"));
}

// Preset "paper": kvpress CURPress's defaults (the paper's code is not public here): 4 sinks, the
// key-value product, windows of 16.
MethodPreset paper_preset_cur() {
  return {nlohmann::json::object(), 0, 0, "CurDKV (arXiv:2509.15038) as kvpress CURPress: 4 sinks, kv_product, "
          "local windows of 16", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_cur() {
  CompressorInfo m;
  m.name = "cur";
  m.description =
      "the tokens of largest key x value leverage (squared row norms, normalised in windows of 16), query-agnostic (CurDKV; kvpress CURPress)";
  m.make = make_cur;
  m.paper = paper_preset_cur;
  m.cost = {1.0, "known: row norms of keys and values O(n d) + top-k",
            "known cost: one squared norm per key and value, O(n·d), and a top-k (CurDKV, kvpress CURPress)"};
  return m;
}
}  // namespace kvlab
