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
// Parameters: n_sink [4] (>= 0).
//
// Deviations:
//   - Keys keep their original RoPE positions (kvlab default); the paper's re-rotation to in-cache
//     positions is the harness's --rerotate, not done here.
//   - When the budget is smaller than n_sink, only the first `budget` sinks are kept.
//   - The selection is the same for every KV head.
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

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

 private:
  int64_t n_sink_ = 4;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_streaming_llm(const nlohmann::json& params) {
  return std::make_unique<StreamingLLM>(Params(params, "streaming_llm"));
}

}  // namespace kvlab
