// cam — Cache Merging: StreamingLLM eviction, with the values of evicted tokens merged into the
// tokens that follow them instead of dropped.
//
// Paper: Yuxin Zhang, Yuxuan Du, Gen Luo, Yunshan Zhong, Zhenyu Zhang, Shiwei Liu, Rongrong Ji,
//   "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024 (PMLR 235), no arXiv
//   version; official code zyxxmu/cam (cam_hf/utils_hh/modify_llama_cam.py, local_cam_mask).
//
// Summary. Evicting a token removes its contribution to every later attention output. CaM keeps
// StreamingLLM's layout (n_sink sinks + recent window) but, when token e leaves the window, with
// probability p = clamp(A_e / mean(A over the recent window), 0, 1) adds V[e]/m to the values of
// the next m = merge_budget tokens (keys untouched): a token that drew much attention compared to
// its neighbours is likely to be merged, so its value survives in the tokens that are kept. The
// per-head state is `CaMCache` (cam.h), the one implementation that replay drives over the region
// token by token here and that generation drives per decode step. Entries carry bias 0.
//
// Attention scores A: METHODS.md §3 says "accumulated attention". In replay the queries the
// region came with (kv.queries at kv.query_pos, possibly only the last 256 prompt positions) give
// each key its score once, as in h2o's prefill: `cam_queries=all` sums their causal post-softmax
// attention (group-reduced by gqa_reduce); `cam_queries=last` uses only the last query — the
// official decoding code's choice (the attention of the current step's query).
//
// Parameters:
//   n_sink [4]          sinks kept exactly (StreamingLLM)
//   merge_budget [32]   m: an evicted value is spread as V[e]/m over the next m tokens
//   cam_queries [all]   all | last
//   gqa_reduce [mean]   mean | max | sum over a KV group's query heads
//
// Deviations:
//   - Scores are fixed per key from the available queries (computed once), not re-read from the
//     attention of the step at which the key leaves, since replay has no per-step queries for the
//     region; the mean runs over the window after e including the newest token, as in the
//     official code.
//   - The next m tokens are the m oldest tokens left in the window (the official slice may run
//     past the cache into future positions when m >= the window).
//   - The official code divides by 0 → NaN → no merge; here p = 1 when the window's mean is 0 and
//     A_e > 0, else 0.
//   - kept_idx is defined (keys are kept one to one) though the values are merged: mass_recall is
//     meaningful for CaM's keys; the values at kept_idx are not the original ones.
//   - A query's softmax runs over every key it sees (sinks + region + tail up to its position,
//     as in h2o); the official code is MHA, kvlab handles GQA by group reduction.
//   - Randomness: std::mt19937_64 seeded with opt.seed, one stream over KV heads in order, one
//     draw per eviction.
#include "kvlab/compress/cam.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

// ---- CaMCache ----------------------------------------------------------------

CaMCache::CaMCache(int64_t n_sink, int64_t window, int64_t merge_budget, int64_t head_dim)
    : n_sink_(n_sink), window_(window), m_(merge_budget), d_(head_dim) {
  TORCH_INTERNAL_ASSERT(n_sink >= 0 && window >= 0 && merge_budget >= 1 && head_dim >= 1);
  win_tok_.resize(static_cast<size_t>(window_ + 1));
  win_scores_.resize(static_cast<size_t>(window_ + 1));
  win_vals_.resize(static_cast<size_t>((window_ + 1) * d_));
}

void CaMCache::append(int64_t token, const double* value, double score, std::mt19937_64& gen) {
  if (static_cast<int64_t>(sinks_.size()) < n_sink_) {
    sinks_.push_back(token);
    sink_scores_.push_back(score);
    sink_vals_.insert(sink_vals_.end(), value, value + d_);
    return;
  }
  const int64_t s = slot(count_);
  win_tok_[s] = token;
  win_scores_[s] = score;
  std::copy(value, value + d_, win_vals_.begin() + s * d_);
  ++count_;
  if (count_ <= window_) return;
  // The oldest window token e leaves.
  const int64_t e = slot(0), others = count_ - 1;
  double mean = 0;
  for (int64_t k = 1; k <= others; ++k) mean += win_scores_[slot(k)];
  mean = others > 0 ? mean / static_cast<double>(others) : 0.0;
  const double a = win_scores_[e];
  const double p = mean > 0 ? std::clamp(a / mean, 0.0, 1.0) : (a > 0 ? 1.0 : 0.0);
  const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;
  if (u < p && others > 0) {
    ++merges_;
    const double* ve = win_vals_.data() + e * d_;
    for (int64_t k = 1; k <= std::min(m_, others); ++k) {
      double* vk = win_vals_.data() + slot(k) * d_;
      for (int64_t c = 0; c < d_; ++c) vk[c] += ve[c] / static_cast<double>(m_);
    }
  }
  head_ = slot(1);
  --count_;
}

void CaMCache::accumulate(const double* probs) {
  for (size_t i = 0; i < sinks_.size(); ++i) sink_scores_[i] += probs[i];
  for (int64_t k = 0; k < count_; ++k) win_scores_[slot(k)] += probs[sinks_.size() + k];
}

std::vector<int64_t> CaMCache::tokens() const {
  std::vector<int64_t> out = sinks_;
  for (int64_t k = 0; k < count_; ++k) out.push_back(win_tok_[slot(k)]);
  return out;
}

std::vector<double> CaMCache::values() const {
  std::vector<double> out = sink_vals_;
  for (int64_t k = 0; k < count_; ++k)
    out.insert(out.end(), win_vals_.begin() + slot(k) * d_, win_vals_.begin() + (slot(k) + 1) * d_);
  return out;
}

// ---- the compressor ----------------------------------------------------------------

namespace {

class CaM final : public Compressor {
 public:
  explicit CaM(Params p) {
    n_sink_ = p.get_int("n_sink", 4);
    merge_budget_ = p.get_int("merge_budget", 32);
    queries_ = p.get_string("cam_queries", "all", {"all", "last"});
    reduce_ = p.get_string("gqa_reduce", "mean", {"mean", "max", "sum"});
    KVLAB_CHECK(n_sink_ >= 0, "cam: parameter 'n_sink' must be >= 0, got {}", n_sink_);
    KVLAB_CHECK(merge_budget_ >= 1, "cam: parameter 'merge_budget' must be >= 1, got {}",
                merge_budget_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "cam"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), d = kv.values.size(2);
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    detail::require_queries(kv, "cam");
    const int64_t sinks = std::min(n_sink_, b), window = b - sinks;
    LayerKV sub = detail::last_queries(kv, queries_ == "last" ? 1 : -1);
    auto scores = detail::accumulated_attention(sub, reduce_).cpu().contiguous();  // [Hkv, n] f64
    auto vals = kv.values.to(at::kCPU, at::kDouble).contiguous();               // [Hkv, n, d]
    const double* sc = scores.data_ptr<double>();
    const double* V = vals.data_ptr<double>();
    std::mt19937_64 gen(opt.seed);
    auto idx = at::empty({h_kv, b}, at::TensorOptions().dtype(at::kLong));      // [Hkv, b]
    auto merged = at::empty({h_kv, b, d}, at::TensorOptions().dtype(at::kDouble));  // [Hkv, b, d]
    for (int64_t h = 0; h < h_kv; ++h) {
      CaMCache cache(sinks, window, merge_budget_, d);
      for (int64_t t = 0; t < n; ++t) cache.append(t, V + (h * n + t) * d, sc[h * n + t], gen);
      auto toks = cache.tokens();
      auto v = cache.values();
      TORCH_INTERNAL_ASSERT(static_cast<int64_t>(toks.size()) == b);
      std::copy(toks.begin(), toks.end(), idx[h].data_ptr<int64_t>());
      std::copy(v.begin(), v.end(), merged[h].data_ptr<double>());
    }
    CompressedKV out = gather_kept(kv, idx.to(kv.keys.device()));
    out.values = merged.to(kv.values.options());                               // [Hkv, b, d]
    return out;
  }

 private:
  int64_t n_sink_ = 4, merge_budget_ = 32;
  std::string queries_, reduce_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_cam(const nlohmann::json& params) {
  return std::make_unique<CaM>(Params(params, "cam"));
}

}  // namespace kvlab
