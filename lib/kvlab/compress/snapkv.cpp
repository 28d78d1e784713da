// snapkv — keep the keys the last prompt queries (the observation window) attend to.
//
// Paper: Yuhong Li, Yingbing Huang, Bowen Yang, Bharat Venkitesh, Acyr Locatelli, Hanchen Ye,
//   Tianle Cai, Patrick Lewis, Deming Chen, "SnapKV: LLM Knows What You are Looking for Before
//   Generation", arXiv:2404.14469; official code FasterDecoding/SnapKV (snapkv_utils.py).
//
// Summary. The attention pattern of the last `window` prompt queries predicts which prefix keys
// generation will need. SnapKV softmaxes the window's queries over all keys (causal inside the
// window), sums the probabilities over the window's queries for every prefix key, smooths that
// vote with a 1-D max-pool (kernel 7, padding 3, stride 1) so neighbours of a selected key come
// along, and keeps the top-(budget − window) prefix keys plus the window's own keys, exact.
//
// Cost (issue 13; replay, n = 4096, 256 observation queries: ~3.7 ms per (layer, KV head), ~6.5x
// uniform). The vote is the observation window's attention over every key, O(w·g·n·d) FLOPs
// (g query heads per KV head), against uniform's O(n) draw; that matmul runs near the machine's
// GEMM rate, so the ratio is the ratio of the two algorithms' work, not overhead.
//
// Parameters:
//   window [32]       observation window (queries), and the keys it covers are kept
//   kernel [7]        pooling kernel (odd, >= 1; 1 = no pooling), padding kernel/2
//   pooling [max]     max | avg (avg counts the zero padding, as torch's avg_pool1d does)
//   gqa_reduce [mean] mean | max | sum over a KV group's query heads, per query before summing
//
// Deviations:
//   - "The window's keys" are the region keys at positions >= the window's first query. In replay
//     the queries may lie after the region (e.g. behind --keep-last, which keeps them exactly);
//     then no region key is in the window and the whole budget goes to the top-scoring keys.
//     If more window keys lie in the region than the budget, the most recent `budget` are kept.
//   - The softmax runs over every key a window query sees (sinks + region + tail up to its
//     position), as SnapKV's own prefill attention does; the scores are its region columns.
//   - GQA: the official code repeats K/V per query head; kvlab selects per KV head on the group's
//     reduced attention (kvpress's choice).
//   - Top-k ties go to the lower index (torch.topk leaves them unspecified).
#include "kvlab/compress/preset.h"
#include "kvlab/compress/snapkv.h"

#include <ATen/ATen.h>

#include <limits>

#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

at::Tensor snapkv_scores(const LayerKV& kv, const SnapKVOptions& opt, int64_t* n_window) {
  const int64_t n = kv.n_tokens();
  LayerKV sub = detail::last_queries(kv, opt.window);
  int64_t n_win = 0;
  if (sub.query_pos.defined()) {
    const int64_t first = sub.query_pos.min().item<int64_t>() - kv.pos0;  // region index
    n_win = std::max<int64_t>(0, std::min<int64_t>(n, n - first));
  }
  *n_window = n_win;
  const int64_t n_prefix = n - n_win;
  auto probs = group_attention_probs(sub, opt.gqa_reduce);                 // [Hkv, w, n]
  auto vote = probs.narrow(2, 0, n_prefix).to(at::kCPU, at::kDouble).sum(1);  // [Hkv, P]
  if (opt.kernel <= 1 || n_prefix == 0) return vote.contiguous();
  auto x = vote.unsqueeze(1);                                              // [Hkv, 1, P]
  at::Tensor pooled;
  if (opt.pooling == "max") pooled = at::max_pool1d(x, {opt.kernel}, {1}, {opt.kernel / 2});
  else pooled = at::avg_pool1d(x, {opt.kernel}, {1}, {opt.kernel / 2}, false, true);
  return pooled.squeeze(1).contiguous();                                   // [Hkv, P]
}

at::Tensor snapkv_select(const LayerKV& kv, int64_t budget, const SnapKVOptions& opt) {
  const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
  detail::require_queries(kv, "snapkv");
  int64_t n_win = 0;
  auto scores = snapkv_scores(kv, opt, &n_win);                            // [Hkv, P]
  const int64_t n_prefix = n - n_win;
  const int64_t keep_win = std::min(n_win, budget), keep_top = budget - keep_win;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
  const double* sc = scores.data_ptr<double>();
  for (int64_t h = 0; h < h_kv; ++h) {
    rows[h] = detail::top_k_indices(sc + h * n_prefix, n_prefix, keep_top);
    for (int64_t i = n - keep_win; i < n; ++i) rows[h].push_back(i);
  }
  return detail::pad_index_rows(rows);                                     // [Hkv, budget]
}

SnapKVOptions read_snapkv_options(Params& p, const std::string& method) {
  SnapKVOptions o;
  o.window = p.get_int("window", 32);
  o.kernel = p.get_int("kernel", 7);
  o.pooling = p.get_string("pooling", "max", {"max", "avg"});
  o.gqa_reduce = p.get_string("gqa_reduce", "mean", {"mean", "max", "sum"});
  KVLAB_CHECK(o.window >= 1, "{}: parameter 'window' must be >= 1, got {}", method, o.window);
  KVLAB_CHECK(o.kernel >= 1 && o.kernel % 2 == 1, "{}: parameter 'kernel' must be an odd number >= 1, got {}",
              method, o.kernel);
  return o;
}

namespace {

class SnapKV final : public Compressor {
 public:
  explicit SnapKV(Params p) {
    opt_ = read_snapkv_options(p, "snapkv");
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "snapkv"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return opt_.window; }
  // The pooled window scores of the prefix keys, +inf for the region keys inside the window; as the
  // window's mean attention (kvpress's scale: criticalkv adds its ε to it), where snapkv_select ranks
  // the sum (the same order).
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override {
    detail::require_queries(kv, "snapkv");
    int64_t n_win = 0;
    const int64_t w = std::min<int64_t>(opt_.window, kv.queries.size(1));                   // queries voting
    auto prefix = snapkv_scores(kv, opt_, &n_win) / double(w);                                 // [Hkv, n - n_win]
    auto win = at::full({prefix.size(0), n_win}, std::numeric_limits<double>::infinity(), at::kDouble);  // [Hkv, n_win]
    return at::cat({prefix, win}, 1).contiguous();                                             // [Hkv, n]
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t b = resolve_budget(opt, kv.n_tokens());
    if (b >= kv.n_tokens()) return keep_all(kv);
    return gather_kept(kv, snapkv_select(kv, b, opt_).to(kv.keys.device()));  // [Hkv, b]
  }

 private:
  SnapKVOptions opt_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_snapkv(const nlohmann::json& params) {
  return std::make_unique<SnapKV>(Params(params, "snapkv"));
}

// Preset "paper": SnapKV's LongBench setting (FasterDecoding/SnapKV config: window_size 32,
// kernel_size 7, pooling maxpool); its code's default avg-pool / kernel 5 is kvpress's choice.
MethodPreset paper_preset_snapkv() {
  return {{{"window", 32}, {"kernel", 7}, {"pooling", "max"}},
          0, 0, "SnapKV's LongBench config: window 32, kernel 7, max-pool", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_snapkv() {
  CompressorInfo m;
  m.name = "snapkv";
  m.description =
      "observation-window attention, max-pooled, top-k + window (SnapKV)";
  m.make = make_snapkv;
  m.paper = paper_preset_snapkv;
  m.cost = {1.0, "known: O(w n d) window scores + top-k",
            "known cost: the w-query observation window over n keys O(w·n·d), 1-D pooling O(n), top-k (SnapKV, Li et al.)"};
  return m;
}
}  // namespace kvlab
