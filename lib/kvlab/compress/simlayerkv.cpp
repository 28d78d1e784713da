// simlayerkv — a layer whose last query looks only at the first and the most recent tokens is
// "lazy" and keeps only those; every other layer keeps its whole cache.
//
// Paper: Xuan Zhang, Cunxiao Du, Chao Du, Tianyu Pang, Wei Gao, Min Lin, "SimLayerKV: A Simple
//   Framework for Layer-Level KV Cache Reduction", arXiv:2410.13846 (ICLR 2025); official code
//   sail-sg/SimLayerKV. Definition as NVIDIA kvpress 0.5.5 `SimLayerKVPress`
//   (kvpress/presses/simlayerkv_press.py), checked against it (tests/generate/test_kvpress_golden.cpp).
//
// Summary. The last `n_last` prompt queries are softmaxed over every key they see (kvpress's
// SnapKV window attention, causal inside the window); their probabilities on the keys before the
// window, averaged over every query head and window query, are summed over the first `n_initial`
// positions and the last `n_recent` positions before the window:
//     s = Σ_{j < n_initial} p_j + Σ_{P − n_recent ≤ j < P} p_j,   P = the first window query's position.
// The layer is lazy when s > lazy_threshold; a lazy layer keeps the positions < n_initial and the
// last n_recent − n_last positions of the prompt (kvpress's keys[:n_initial] + keys[-n_recent+n_last:]),
// every KV head the same, exact; any other layer keeps everything. Nothing is compressed when
// lazy_threshold = 1 or the prompt holds at most n_initial + n_recent + n_last tokens.
//
// Memory: the threshold decides it, not the run's budget (CompressorInfo::own_memory): a run gives
// this method one branch, labelled without a budget, whose rows report the entries it held.
//
// Parameters: lazy_threshold [0.9] (in [0, 1]; kvpress's default 1.0 compresses nothing; its docstring
// recommends Llama-3 0.9, Llama-2 0.65, Mistral 0.8, Qwen 0.85), n_last [1] (>= 1), n_recent [1024]
// (> n_last), n_initial [4] (>= 0).
//
// Deviations and notes:
//   - Positions are the prompt's (prefix, region and suffix together): a lazy layer's kept
//     positions that lie outside the region (behind --keep-first / --keep-last) are kept by the
//     harness anyway, and the score counts the probability on them as kvpress's would.
//   - The score is summed in double from float32 probabilities (kvpress: float32 throughout); a
//     layer whose score is within ~1e-6 of the threshold may be decided the other way.
#include <ATen/ATen.h>

#include <algorithm>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class SimLayerKV final : public Compressor {
 public:
  explicit SimLayerKV(Params p) {
    threshold_ = p.get_double("lazy_threshold", 0.9);
    n_last_ = p.get_int("n_last", 1);
    n_recent_ = p.get_int("n_recent", 1024);
    n_initial_ = p.get_int("n_initial", 4);
    KVLAB_CHECK(threshold_ >= 0.0 && threshold_ <= 1.0, "simlayerkv: parameter 'lazy_threshold' must be in [0, 1], got {}",
                threshold_);
    KVLAB_CHECK(n_last_ >= 1, "simlayerkv: parameter 'n_last' must be >= 1, got {}", n_last_);
    KVLAB_CHECK(n_recent_ > n_last_, "simlayerkv: parameter 'n_recent' must be > n_last ({}), got {}", n_last_, n_recent_);
    KVLAB_CHECK(n_initial_ >= 0, "simlayerkv: parameter 'n_initial' must be >= 0, got {}", n_initial_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "simlayerkv"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return n_last_; }

  // The lazy score s of the layer (above), or -1 when the layer is not scored (too short, threshold 1).
  double lazy_score(const LayerKV& kv) const {
    if (threshold_ >= 1.0 || kv.n_prompt() <= n_initial_ + n_recent_ + n_last_) return -1.0;
    detail::require_queries(kv, "simlayerkv");
    KVLAB_CHECK(kv.n_prefix() == kv.pos0, "simlayerkv: scores over the whole prompt, but the {} positions before the region "
                "came without their keys", kv.pos0);
    // Every key of the prompt as one region from position 0, scored by the last n_last queries.
    LayerKV all = detail::last_queries(kv, n_last_);
    all.keys = visible_keys(kv);  // [Hkv, n_prompt, d]
    all.values = all.keys;         // unread
    all.prefix_keys = all.suffix_keys = at::Tensor();
    all.pos0 = 0;
    const int64_t first = all.query_pos.min().item<int64_t>();  // P: the window's first position
    at::Tensor p = group_attention_probs(all, "mean").to(at::kCPU, at::kDouble).mean(std::vector<int64_t>{0, 1});  // [n_prompt]
    const int64_t ni = std::min(n_initial_, first), r0 = std::max<int64_t>(0, first - n_recent_);
    return p.narrow(0, 0, ni).sum().item<double>() + p.narrow(0, r0, first - r0).sum().item<double>();
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions&) const override {
    const double s = lazy_score(kv);
    if (s <= threshold_) return keep_all(kv);  // also s = -1: not scored
    const int64_t recent_from = kv.n_prompt() - (n_recent_ - n_last_);
    std::vector<int64_t> idx;  // region indices kept, ascending
    for (int64_t i = 0; i < kv.n_tokens(); ++i) {
      const int64_t pos = kv.pos0 + i;
      if (pos < n_initial_ || pos >= recent_from) idx.push_back(i);
    }
    auto t = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(kv.keys.device());  // [m]
    return gather_kept(kv, t.unsqueeze(0).expand({kv.n_kv_heads(), t.size(0)}).contiguous());  // [Hkv, m]
  }

 private:
  double threshold_ = 0.9;
  int64_t n_last_ = 1, n_recent_ = 1024, n_initial_ = 4;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_simlayerkv(const nlohmann::json& params) {
  return std::make_unique<SimLayerKV>(Params(params, "simlayerkv"));
}

// Preset "paper": 4 initial and 1,024 recent tokens judged by the last query (SimLayerKV-decode,
// kvpress's n_last = 1), threshold 0.9 (the value kvpress's docstring gives for Llama-3).
MethodPreset paper_preset_simlayerkv() {
  return {{{"lazy_threshold", 0.9}, {"n_last", 1}, {"n_recent", 1024}, {"n_initial", 4}},
          0,
          0,
          "SimLayerKV (Zhang et al. 2024) as kvpress SimLayerKVPress: 4 initial + 1024 recent tokens, last query, "
          "threshold 0.9 (Llama-3; Qwen 0.85, Mistral 0.8, Llama-2 0.65)",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_simlayerkv() {
  CompressorInfo m;
  m.name = "simlayerkv";
  m.description =
      "lazy layers (last query on the first + recent tokens above a threshold) keep only those; others keep all "
      "(SimLayerKV; memory set by the threshold)";
  m.make = make_simlayerkv;
  m.paper = paper_preset_simlayerkv;
  m.cost = {1.0, "derived: O(n d) per layer", "derived: the last query's attention over n keys (kvpress SimLayerKVPress)"};
  m.own_memory = true;
  return m;
}

}  // namespace kvlab
