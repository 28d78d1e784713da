// duo_attention — retrieval heads keep the whole cache, streaming heads only sinks and a recent window.
//
// Paper: Guangxuan Xiao, Jiaming Tang, Jingwei Zuo, Junxian Guo, Shang Yang, Haotian Tang, Yao Fu,
//   Song Han, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming
//   Heads", ICLR 2025, arXiv:2410.10819; official code mit-han-lab/duo-attention. Checked against
//   NVIDIA kvpress 0.5.5 `DuoAttentionPress(on_the_fly_scoring=True)`
//   (kvpress/presses/duo_attention_press.py), which the golden test replays
//   (data_scripts/make_duo_golden.py, tests/generate/test_kvpress_golden.cpp).
//
// Summary. Every (layer, KV head) has a score (duo_attention.h: kvpress's on-the-fly score from
// the mean query and key of calibration text; the paper's trained gates cannot be fetched here).
// The lowest-scoring heads become streaming heads: they keep the first `sink` and the last
// `recent` positions; the others keep every position. kvpress takes the fraction of streaming heads
// (head_compression_ratio); kvlab takes a budget b per head and makes as many heads stream as the
// budget needs, ranked over every compressed layer (layerwise=false, as kvpress):
//   m = ceil(N·(n − b) / (n − sink − recent)) of the N compressed heads, capped at N,
// so that (N − m)·n + m·(sink + recent) <= N·b (the memory is the budget's or a little under it).
// When b < sink + recent, every head streams, with sink and recent scaled to b
// (sink' = ⌊b·sink/(sink + recent)⌋, recent' = b − sink'). With fill=true (kvlab's default: every
// method at equal memory) what the streaming heads leave of the budget, N·b − (N − m)·n −
// m·(sink + recent), widens their recent windows evenly; fill=false is kvpress's fixed window (the
// memory then a little under the budget, or far under it when few heads are ranked together:
// with 3 KV heads per layer and layerwise=true, at b = 0.2·n of 5k tokens all three stream 384).
//
//   scores   `heads` file [L, Hkv] float64 (kvlab calibrate duo), NaN rows = layers not compressed
//   kept     per head an ascending index list: all n, or [0, sink) ∪ [n − recent, n)
//
// Parameters: heads [""] (a `kvlab calibrate duo` file; required), sink [128], recent [256]
//   (kvpress's on-the-fly values), fill [true] (above), layerwise [false] (rank each layer's heads on their own, m per
//   layer: replay's single-layer studies hold each layer at its budget).
//
// Deviations and notes:
//   - Calibration text: kvpress draws 50 BookSum chapters (Hugging Face, not reachable here);
//     `kvlab calibrate duo` draws 50 windows of 2,048 tokens from a local text (the preset:
//     WikiText-2's test split, as Chelsea calibrates). The golden test feeds kvpress kvlab's windows.
//   - Memory. kvpress masks the streaming heads' middle keys in its attention patch (its cache
//     holds them); kvlab drops them (CompressedLayer::split_heads), so the bytes are the budget's.
//   - The sinks are absolute positions < sink (with --keep-first, fewer in the region, and the
//     count of streaming heads and the fill use what the region holds); the recent window is the
//     region's last `recent` positions.
//   - Ties go to the lower (layer, head) (kvpress's np.argsort leaves them unspecified).
//   - Sliding window layers (gemma3) are held exactly and left out of the ranking (kvpress refuses gemma3).
//   - Prefill-only (as kvpress): decoded tokens are appended exactly to every head.
#include "kvlab/compress/duo_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

namespace kvlab {

at::Tensor duo_head_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& inv_freq, int64_t q_len) {
  KVLAB_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(1) == k.size(1) && q.size(2) == k.size(2) && q.size(1) > 0,
              "duo_head_scores: q [Hq, T, d] and k [Hkv, T, d] expected");
  KVLAB_CHECK(q_len >= 2, "duo_head_scores: q_len must be >= 2 (over one position every head scores 1), got {}",
              q_len);
  const int64_t hq = q.size(0), hkv = k.size(0), t = q.size(1), d = q.size(2), g = hq / hkv;
  KVLAB_CHECK(hkv > 0 && hq % hkv == 0, "duo_head_scores: {} query heads are not a multiple of {} KV heads", hq, hkv);
  const at::Tensor freq = inv_freq.to(at::kCPU, at::kFloat);
  const at::Tensor back = -at::arange(t, at::kLong);  // [T]: rotate position i back to 0
  // [H, d] float64: the mean pre-RoPE query and key of each head over the window.
  auto mean_pre = [&](const at::Tensor& x) {
    const at::Tensor xd = x.to(at::kCPU, at::kDouble);
    return rotate_by(xd, back.unsqueeze(0).expand({x.size(0), t}), freq).mean(1);
  };
  const at::Tensor qm = mean_pre(q), km = mean_pre(k);
  // Rotated to positions 0 .. q_len-1: the last query [Hq, d], the keys [Hkv, q_len, d].
  const auto [cos, sin] = rope_cos_sin(freq, 0, q_len, at::kDouble);  // [q_len, d]
  const at::Tensor q_last = apply_rope(qm.unsqueeze(1), cos.narrow(0, q_len - 1, 1), sin.narrow(0, q_len - 1, 1))
                                .squeeze(1);                                                   // [Hq, d]
  const at::Tensor keys = apply_rope(km.unsqueeze(1).expand({hkv, q_len, d}).contiguous(), cos, sin);  // [Hkv, q_len, d]
  const at::Tensor kq = keys.repeat_interleave(g, 0);                                         // [Hq, q_len, d]
  const at::Tensor logits = at::bmm(kq, q_last.unsqueeze(2)).squeeze(2) / std::sqrt(double(d));  // [Hq, q_len]
  const at::Tensor area = at::softmax(logits, -1).cumsum(1).mean(1);                          // [Hq]
  return area.view({hkv, g}).mean(1);                                                         // [Hkv]
}

at::Tensor read_duo_head_scores(const std::string& path, const std::string& param) {
  KVLAB_CHECK(!path.empty(),
              "duo_attention: parameter '{}' is empty: it names the head scores `kvlab calibrate duo` writes "
              "(e.g. --param duo_attention.heads=calibration/duo_heads_<model>.json, or --preset paper)",
              param);
  const nlohmann::json j = read_json_file(path);
  KVLAB_CHECK(j.is_object() && j.value("kind", "") == "duo_head_scores" && j.contains("scores") &&
                  j["scores"].is_array() && !j["scores"].empty(),
              "duo_attention: parameter '{}' ({}) is not a 'kvlab calibrate duo' file (kind \"duo_head_scores\" "
              "with a \"scores\" array)",
              param, path);
  const auto& rows = j["scores"];
  int64_t h = 0;
  for (const auto& r : rows)
    if (r.is_array()) h = std::max<int64_t>(h, static_cast<int64_t>(r.size()));
  KVLAB_CHECK(h > 0, "duo_attention: parameter '{}' ({}): no layer holds scores", param, path);
  at::Tensor t = at::full({static_cast<int64_t>(rows.size()), h}, std::numeric_limits<double>::quiet_NaN(), at::kDouble);
  for (size_t l = 0; l < rows.size(); ++l) {
    if (rows[l].is_null()) continue;  // a layer left out (sliding window)
    KVLAB_CHECK(rows[l].is_array() && static_cast<int64_t>(rows[l].size()) == h,
                "duo_attention: parameter '{}' ({}): scores row {} must hold {} numbers or be null", param, path, l, h);
    for (int64_t i = 0; i < h; ++i) {
      const auto& v = rows[l][static_cast<size_t>(i)];
      // A score is the mean cumulative attention of a head's last query: in [0, 1].
      KVLAB_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 && v.get<double>() <= 1 + 1e-9,
                  "duo_attention: parameter '{}' ({}): scores[{}][{}] is {}, not a score in [0, 1]", param, path, l,
                  i, v.dump());
      t[static_cast<int64_t>(l)][i] = v.get<double>();
    }
  }
  return t;
}

namespace {

class DuoAttention final : public Compressor {
 public:
  explicit DuoAttention(Params p) {
    heads_path_ = p.get_string("heads", "");
    sink_ = p.get_int("sink", 128);
    recent_ = p.get_int("recent", 256);
    layerwise_ = p.get_bool("layerwise", false);
    fill_ = p.get_bool("fill", true);
    KVLAB_CHECK(sink_ >= 0, "duo_attention: parameter 'sink' must be >= 0, got {}", sink_);
    KVLAB_CHECK(recent_ >= 0, "duo_attention: parameter 'recent' must be >= 0, got {}", recent_);
    KVLAB_CHECK(sink_ + recent_ >= 1, "duo_attention: parameters 'sink' + 'recent' must be >= 1, got 0");
    if (!heads_path_.empty()) scores_ = read_duo_head_scores(heads_path_, "heads");
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "duo_attention"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    if (!scores_.defined()) read_duo_head_scores(heads_path_, "heads");  // the error
    KVLAB_CHECK(scores_.size(0) == kv.n_layers && scores_.size(1) == h_kv,
                "duo_attention: parameter 'heads' ({}) holds scores of {} layers x {} KV heads, but this model has "
                "{} x {}", heads_path_, scores_.size(0), scores_.size(1), kv.n_layers, h_kv);
    KVLAB_CHECK(!std::isnan(scores_[kv.layer][0].item<double>()),
                "duo_attention: parameter 'heads' ({}) leaves layer {} out (a sliding window layer), but it is "
                "compressed", heads_path_, kv.layer);
    // The window of a streaming head: sink + recent, scaled down to b when the budget is below it.
    int64_t sink = sink_, recent = recent_;
    if (b < sink + recent) sink = b * sink_ / (sink_ + recent_), recent = b - sink;
    // The ranked heads (layer, head) as flat indices l·H + h: this layer's, or every compressed layer's.
    const double* sc = scores_.data_ptr<double>();
    std::vector<int64_t> heads;
    for (int64_t l = 0; l < kv.n_layers; ++l)
      if ((!layerwise_ || l == kv.layer) && !std::isnan(sc[l * h_kv]))
        for (int64_t i = 0; i < h_kv; ++i) heads.push_back(l * h_kv + i);
    // In the region: the sinks past any exact prefix (absolute positions < sink), the recent tail.
    const int64_t sinks = std::clamp<int64_t>(sink - kv.pos0, 0, n);
    recent = std::min(recent, n - sinks);
    const int64_t total = static_cast<int64_t>(heads.size()), window = sinks + recent;
    const int64_t m = window >= n ? total
                                  : std::min(total, (total * (n - b) + (n - window) - 1) / (n - window));  // ceil
    // fill: what the m streaming heads leave of the budget widens their recent windows evenly.
    if (fill_ && m > 0) {
      const int64_t left = total * b - (total - m) * n - m * window;
      recent = std::min(recent + std::max<int64_t>(0, left) / m, n - sinks);
    }
    auto lower = [sc](int64_t a, int64_t c) { return sc[a] < sc[c] || (sc[a] == sc[c] && a < c); };
    std::sort(heads.begin(), heads.end(), lower);
    std::vector<bool> streaming(static_cast<size_t>(h_kv), false);
    for (int64_t r = 0; r < m; ++r)
      if (heads[r] / h_kv == kv.layer) streaming[heads[r] % h_kv] = true;
    const int64_t tail = recent;
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    for (int64_t i = 0; i < h_kv; ++i) {
      auto& row = rows[static_cast<size_t>(i)];
      if (!streaming[i]) {
        row.resize(static_cast<size_t>(n));
        std::iota(row.begin(), row.end(), int64_t(0));
        continue;
      }
      for (int64_t j = 0; j < sinks; ++j) row.push_back(j);
      for (int64_t j = n - tail; j < n; ++j) row.push_back(j);
    }
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, max_h count_h]
  }

 private:
  std::string heads_path_;
  int64_t sink_ = 128, recent_ = 256;
  bool layerwise_ = false, fill_ = true;
  at::Tensor scores_;  // [L, Hkv] float64, NaN rows = layers left out
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_duo_attention(const nlohmann::json& params) {
  return std::make_unique<DuoAttention>(Params(params, "duo_attention"));
}

// Preset "paper": kvpress's on-the-fly DuoAttention (sink 128, recent 256, ranked over the model),
// the head scores from `kvlab calibrate duo` on WikiText-2 (kvpress: BookSum, not reachable here).
MethodPreset paper_preset_duo_attention() {
  return {{{"heads", "calibration/duo_heads_{model}.json"},
           {"sink", 128},
           {"recent", 256},
           {"fill", true},
           {"layerwise", false}},
          0,
          0,
          "Xiao et al. 2025 (DuoAttention) / kvpress DuoAttentionPress on-the-fly: 128 sinks + 256 recent on "
          "streaming heads (widened to fill the budget), heads ranked over the model (scores from WikiText-2, "
          "not BookSum)",
          "heads",
          "kvlab calibrate duo --model {model} --text ../shared/data/wikitext2/wiki.test.raw "
          "--out calibration/duo_heads_{model}.json"};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_duo_attention() {
  CompressorInfo m;
  m.name = "duo_attention";
  m.description =
      "retrieval heads keep every entry, streaming heads only 128 sinks + 256 recent, heads ranked by calibrated scores over the model (DuoAttention; kvpress DuoAttentionPress on-the-fly)";
  m.make = make_duo_attention;
  m.paper = paper_preset_duo_attention;
  m.cost = {1.0, "known: a sort of the L·H head scores and an index gather, O(n d)",
            "derived: the scores come from a calibration run made once per model (kvlab calibrate duo); compressing sorts L·H scores and gathers the kept rows"};
  m.calibration = true;
  return m;
}
}  // namespace kvlab
