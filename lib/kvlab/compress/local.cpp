// local — a sliding window: only the most recent tokens of the region.
//
// Paper: the "Window attention" / local-attention baseline of Xiao et al., "Efficient Streaming
//   Language Models with Attention Sinks", arXiv:2309.17453 (Fig. 1b), and of H2O
//   (Zhang et al., arXiv:2306.14048, "Local" in its tables).
//
// Summary. Per KV head keep the last `budget` tokens of the region, exact (bias 0). It is
// StreamingLLM with no sinks; comparing the two isolates what the sinks are worth.
//
// In generation the window rolls by one entry per decoded token (window_stream.h).
//
// Parameters: none.
//
// Deviations: none (the harness's --keep-first would add sinks back; leave it at 0 to measure
// the pure window).
#include <ATen/ATen.h>

#include "kvlab/compress/preset.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/window_stream.h"


namespace kvlab {
namespace {

class Local final : public Compressor {
 public:
  explicit Local(Params p) : params_(p.effective()) { p.finish(); }
  std::string name() const override { return "local"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    auto idx = at::arange(n - b, n, kv.keys.options().dtype(at::kLong));  // [b]
    return gather_kept(kv, idx.unsqueeze(0).expand({h_kv, b}).contiguous());  // [Hkv, b]
  }
  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    return start_window_stream(kv, opt.budget, 0);
  }

 private:
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_local(const nlohmann::json& params) {
  return std::make_unique<Local>(Params(params, "local"));
}

// Preset "paper": the recent window only (no paper of its own: StreamingLLM's "window attention").
MethodPreset paper_preset_local() {
  return {nlohmann::json::object(), 0, 0, "StreamingLLM's window-attention baseline: no parameters", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_local() {
  CompressorInfo m;
  m.name = "local";
  m.description =
      "the most recent tokens only (sliding window)";
  m.make = make_local;
  m.paper = paper_preset_local;
  m.cost = {1.0, "known: gather window O(n)",
            "known cost: a gather of the recent window, O(budget) = O(n) at a fixed ratio"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
