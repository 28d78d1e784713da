// streaming_llm — attention sinks plus a recent window ("Sink").
//
// Paper: Guangxuan Xiao, Yuandong Tian, Beidi Chen, Song Han, Mike Lewis,
//   "Efficient Streaming Language Models with Attention Sinks", arXiv:2309.17453 (ICLR 2024);
//   official code mit-han-lab/streaming-llm.
//
// Summary. Softmax attention dumps much of its mass on the first few tokens ("attention sinks")
// whatever their content; evicting them breaks the model, keeping them plus a window of the most
// recent tokens keeps it stable. Per KV head the cache keeps the first `n_sink` tokens of the
// region and the most recent tokens that fill the rest of the budget; every entry exact (bias 0).
//
// In generation (start_stream, window_stream.h) the window rolls by one entry per decoded token once
// the budget is reached: `--budget N` holds N entries, `--ratio r` r·(tokens seen).
//
// Parameters: n_sink [4] (>= 0).
//
// Deviations:
//   - Keys keep their original RoPE positions (kvlab default); the paper's re-rotation to in-cache
//     positions is the harness's --rerotate, not done here.
//   - When the budget is smaller than n_sink, only the first `budget` sinks are kept.
//   - The selection is the same for every KV head.
#include <ATen/ATen.h>

#include "kvlab/compress/preset.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/held_set.h"
#include "kvlab/compress/window_stream.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

class WindowStream final : public LayerStream {
 public:
  WindowStream(const LayerKV& kv, const Budget& budget, int64_t n_sink)
      : budget_(budget), n_sink_(n_sink), n_seen_(kv.n_tokens()) {
    held_ = HeldSet(region_entries(kv));
    shrink();
  }
  void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) override {
    held_.append(k, v, pos0);
    n_seen_ += k.size(1);
  }
  void settle(const at::Tensor&, const at::Tensor&) override { shrink(); }
  const KVSet& held() const override { return held_.set(); }
  bool rotate_held(const at::Tensor& delta, const at::Tensor& inv_freq) override {
    held_.rotate_keys(delta, inv_freq);
    return true;
  }
  double live_entries() const override { return double(held_.size()); }  // every entry exact
  int64_t n_seen() const override { return n_seen_; }

 private:
  // Keeps the first min(n_sink, b) held entries and the last ones up to b (what compress keeps).
  void shrink() {
    const int64_t b = budget_.entries_for(n_seen_), m = held_.size();
    if (m <= b) return;
    const int64_t sinks = std::min(n_sink_, b);
    std::vector<int64_t> idx;  // [b]
    for (int64_t i = 0; i < sinks; ++i) idx.push_back(i);
    for (int64_t i = m - (b - sinks); i < m; ++i) idx.push_back(i);
    held_.keep_same(idx);
  }

  Budget budget_;
  int64_t n_sink_;
  int64_t n_seen_;
  HeldSet held_;  // keys, values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m]
};

class StreamingLLM final : public Compressor {
 public:
  explicit StreamingLLM(Params p) {
    n_sink_ = p.get_int("n_sink", 4);
    KVLAB_CHECK(n_sink_ >= 0, "streaming_llm: parameter 'n_sink' must be >= 0, got {}", n_sink_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "streaming_llm"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const int64_t sinks = std::min(n_sink_, b), recent = b - sinks;
    auto opts = kv.keys.options().dtype(at::kLong);
    auto idx = at::cat({at::arange(0, sinks, opts), at::arange(n - recent, n, opts)});  // [b]
    return gather_kept(kv, idx.unsqueeze(0).expand({h_kv, b}).contiguous());           // [Hkv, b]
  }
  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    return start_window_stream(kv, opt.budget, n_sink_);
  }

 private:
  int64_t n_sink_ = 4;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<LayerStream> start_window_stream(const LayerKV& kv, const Budget& budget, int64_t n_sink) {
  return std::make_unique<WindowStream>(kv, budget, n_sink);
}

std::unique_ptr<Compressor> make_streaming_llm(const nlohmann::json& params) {
  return std::make_unique<StreamingLLM>(Params(params, "streaming_llm"));
}

// Preset "paper": 4 attention sinks (StreamingLLM, Xiao et al., §4 "4 initial tokens as attention
// sinks"; the same in every seed paper's Sink baseline and kvpress), the recent window fills the rest.
MethodPreset paper_preset_streaming_llm() {
  return {{{"n_sink", 4}}, 0, 0, "StreamingLLM §4: 4 sink tokens + recent window", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_streaming_llm() {
  CompressorInfo m;
  m.name = "streaming_llm";
  m.description =
      "n_sink attention sinks + the most recent tokens (StreamingLLM)";
  m.make = make_streaming_llm;
  m.paper = paper_preset_streaming_llm;
  m.cost = {1.0, "known: gather sinks+window O(n)",
            "known cost: a gather of n_sink + window tokens, O(budget) = O(n) at a fixed ratio (StreamingLLM, Xiao et al.)"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
