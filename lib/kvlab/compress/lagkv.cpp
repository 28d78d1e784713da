// lagkv — keep the tokens whose keys and values stand out against the next partition's range.
//
// Paper: Manlai Liang, Jiaming Zhang, Xiong Li, Jinlong Li, "LagKV: Lag-Relative Information of
//   the KV Cache Tells Which Tokens Are Important", arXiv:2504.04704 (v2, 2025). Official code:
//   AI-Lab-China-Merchants-Bank/LagKV (lag_kv.py) and the authors' transformers cache
//   CMB-AI-LAB/lagkv_cache (defaults lag_ratio 0.5, lag_size 128, lag_sink_size 16). Checked
//   against NVIDIA kvpress 0.5.5 `LagKVPress` (kvpress/presses/lagkv_press.py), the one-shot form.
//
// Summary. After `n_sink` sink tokens the region is cut into partitions of `lag_size` tokens; the
// last full partition and the remainder (the tail) have no reference and are kept. Each earlier
// partition p is judged against the next one, p + 1: per channel, its keys are normalised by the
// min and max of partition p + 1's keys, (k − min) / (max − min); a token's key score is the
// standard deviation (unbiased, over the head dimension) of its normalised key, softmaxed over
// the lag_size tokens of its partition; the value score likewise; the token's score is their mean.
// As kvpress, the scores are then replaced by their rank within the partition divided by
// lag_size (in [0, 1)), sinks and tail score 1, and the `budget` best are kept exact (bias 0): the
// rank makes every partition give up about the same number of tokens, as the official code's
// per-partition top-(ratio · lag_size) does.
//
//   scores  [Hkv, n]: 1 for the sinks and the tail, rank / lag_size in between
//   kv      keys, values [Hkv, n, d]
//
// When the region is shorter than n_sink + 2 · lag_size, nothing is scored against a reference:
// the sinks score 1 and the rest (j − n_sink) / (n − n_sink), so the most recent are kept (kvpress).
//
// Parameters: n_sink [4] (kvpress's default; the paper preset sets the authors' 16), lag_size
//   [128].
//
// Deviations:
//   - One shot over the prefill's region, as kvpress; the official cache compresses again each time
//     lag_size new tokens arrive (decoding included), keeping ratio · lag_size per partition. kvlab
//     runs it once after the prefill (decode rule prefill), like every prefill-only method.
//   - Computed in float64 (kvpress: the model's dtype). Ties go to the lower index (torch.topk
//     leaves them unspecified); the ranks tie across partitions by construction, so at the budget's
//     cut the earlier partitions keep their token.
//   - A channel whose reference range is 0 (max = min) gives NaN in kvpress and the official code;
//     kvlab treats the range as 1e-12 there (the test data have none).
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/key_scores.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// x [Hkv, P, lag, d] (P >= 2 partitions) -> [Hkv, P-1, lag]: for partitions 0..P-2, each token's
// std over channels after min-max normalising by the next partition, softmaxed within the partition.
at::Tensor lag_relative_scores(const at::Tensor& x) {
  const int64_t p = x.size(1);
  auto ref = x.narrow(1, 1, p - 1);                             // [Hkv, P-1, lag, d]
  auto cur = x.narrow(1, 0, p - 1);                             // [Hkv, P-1, lag, d]
  auto lo = std::get<0>(ref.min(2, /*keepdim=*/true));          // [Hkv, P-1, 1, d]
  auto hi = std::get<0>(ref.max(2, /*keepdim=*/true));          // [Hkv, P-1, 1, d]
  auto normed = (cur - lo) / (hi - lo).clamp_min(1e-12);        // [Hkv, P-1, lag, d]
  return normed.std(-1, /*unbiased=*/true).softmax(-1);         // [Hkv, P-1, lag]
}

}  // namespace

at::Tensor lagkv_scores(const at::Tensor& keys, const at::Tensor& values, int64_t n_sink, int64_t lag_size) {
  auto k = keys.to(at::kCPU, at::kDouble), v = values.to(at::kCPU, at::kDouble);  // [Hkv, n, d]
  const int64_t h = k.size(0), n = k.size(1), d = k.size(2);
  auto scores = at::ones({h, n}, at::kDouble);                                      // [Hkv, n]
  if (n < n_sink + 2 * lag_size) {
    if (n > n_sink)
      scores.narrow(1, n_sink, n - n_sink)
          .copy_((at::arange(n - n_sink, at::kDouble) / double(n - n_sink)).expand({h, n - n_sink}));
    return scores;
  }
  const int64_t parts = (n - n_sink) / lag_size, end = n_sink + parts * lag_size;  // [n_sink, end): P full partitions
  auto part = [&](const at::Tensor& x) { return x.narrow(1, n_sink, end - n_sink).reshape({h, parts, lag_size, d}); };
  auto s = (lag_relative_scores(part(k)) + lag_relative_scores(part(v))) / 2;       // [Hkv, P-1, lag]
  auto order = std::get<1>(s.sort(-1));                                             // [Hkv, P-1, lag]
  auto rank = std::get<1>(order.sort(-1)).to(at::kDouble) / double(lag_size);       // [Hkv, P-1, lag]
  scores.narrow(1, n_sink, (parts - 1) * lag_size).copy_(rank.reshape({h, (parts - 1) * lag_size}));
  return scores.contiguous();
}

namespace {

class LagKV final : public Compressor {
 public:
  explicit LagKV(Params p)
      : n_sink_(p.get_int("n_sink", 4)), lag_size_(p.get_int("lag_size", 128)), params_(p.effective()) {
    p.finish();
    KVLAB_CHECK(n_sink_ >= 0, "lagkv: parameter 'n_sink' must be >= 0, got {}", n_sink_);
    KVLAB_CHECK(lag_size_ >= 2, "lagkv: parameter 'lag_size' must be >= 2 (a std over one token is undefined), got {}",
                lag_size_);
  }
  std::string name() const override { return "lagkv"; }
  nlohmann::json params() const override { return params_; }
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override {
    return lagkv_scores(kv.keys, kv.values, n_sink_, lag_size_);  // [Hkv, n]
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  int64_t n_sink_, lag_size_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_lagkv(const nlohmann::json& params) {
  return std::make_unique<LagKV>(Params(params, "lagkv"));
}

// Preset "paper": the authors' released cache (CMB-AI-LAB/lagkv_cache: lag_size 128,
// lag_sink_size 16; the GitHub lag_kv.py has sink 16 and lag 1024 as constructor defaults, the
// released cache and kvpress use 128). The sinks are LagKV's own (scored 1), not harness
// keep_first, so that they sit where the partitions start.
MethodPreset paper_preset_lagkv() {
  return {{{"n_sink", 16}, {"lag_size", 128}}, 0, 0,
          "Liang et al. 2025 (LagKV), the authors' lagkv_cache: sink 16, lag 128", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_lagkv() {
  CompressorInfo m;
  m.name = "lagkv";
  m.description =
      "keys and values scored against the next partition's range, rank per partition (LagKV; kvpress LagKVPress); its paper also compresses while decoding, kvlab after the prefill only";
  m.make = make_lagkv;
  m.paper = paper_preset_lagkv;
  m.cost = {1.0, "known: one pass over keys and values O(n d) + top-k",
            "known cost: per partition a min/max, a normalised std and a softmax over keys and values, O(n·d), and a top-k (LagKV, Liang et al. 2025)"};
  return m;
}
}  // namespace kvlab
