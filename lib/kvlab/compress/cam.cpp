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
// Cost (issue 13; replay, n = 4096: ~37 ms per (layer, KV head), ~60x uniform). Its scores are
// h2o's accumulated attention (the queries' whole attention matrix, O(n_q·g·n·d) plus the softmax:
// see h2o.cpp), and CaMCache then walks the region token by token: each token leaving the window
// draws its merge probability and adds to the next m values, which may be merged again later — a
// chain of n dependent steps in the paper's rule, not one batch. Not within 3x of uniform.
//
// Attention scores A: docs/methods.md §3 says "accumulated attention". In replay the queries the
// region came with (kv.queries at kv.query_pos, possibly only the last 256 prompt positions) give
// each key its score once, as in h2o's prefill: `cam_queries=all` sums their causal post-softmax
// attention (group-reduced by gqa_reduce); `cam_queries=last` uses only the last query — the
// official decoding code's choice (the attention of the current step's query).
//
// Decoding (start_stream, CaMStream): after prefill the caches are compress()'s; each decoded
// token attends first, its query's attention is added to the held tokens' scores (the official
// code's per-step attention), the window grows to the budget on the tokens seen (--ratio) or stays
// (--budget), and the token joins: the oldest window token leaves and may be merged, as above.
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
#include "kvlab/compress/preset.h"
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

void CaMCache::set_window(int64_t w) {
  TORCH_INTERNAL_ASSERT(w >= window_, "CaMCache::set_window: ", w, " < ", window_);
  if (w == window_) return;
  std::vector<int64_t> tok(static_cast<size_t>(w + 1));
  std::vector<double> sc(static_cast<size_t>(w + 1)), vals(static_cast<size_t>((w + 1) * d_));
  for (int64_t k = 0; k < count_; ++k) {
    tok[k] = win_tok_[slot(k)];
    sc[k] = win_scores_[slot(k)];
    std::copy(win_vals_.begin() + slot(k) * d_, win_vals_.begin() + (slot(k) + 1) * d_, vals.begin() + k * d_);
  }
  win_tok_ = std::move(tok), win_scores_ = std::move(sc), win_vals_ = std::move(vals);
  window_ = w;
  head_ = 0;
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

// One layer of CaM while decoding (stream.h): a CaMCache per KV head and the held keys in its
// order (sinks, then the window oldest first); the values are the cache's (merged). A step pushes
// one token, which attends before it joins: its query's attention is added to the held scores, the
// window grows to the budget on the tokens seen, and CaMCache::append evicts (and may merge) the
// oldest window token.
class CaMStream final : public LayerStream {
 public:
  CaMStream(const LayerKV& kv, const Budget& budget, int64_t n_sink, int64_t merge_budget, const at::Tensor& scores,
            std::string reduce, uint64_t seed)
      : budget_(budget), reduce_(std::move(reduce)), gen_(seed), n_seen_(kv.n_tokens()),
        device_(kv.keys.device()), dtype_(kv.keys.scalar_type()) {
    const int64_t h = kv.n_kv_heads(), n = kv.n_tokens(), d = kv.values.size(2);
    const int64_t cap = budget.entries_for(n);
    sinks_ = std::min(n_sink, cap);
    auto vals = kv.values.to(at::kCPU, at::kDouble).contiguous();  // [Hkv, n, d]
    auto sc = scores.defined() ? scores.to(at::kCPU, at::kDouble).contiguous() : at::zeros({h, n}, at::kDouble);
    for (int64_t i = 0; i < h; ++i) {  // one random stream over the heads in order, as compress()
      heads_.emplace_back(sinks_, std::max<int64_t>(cap - sinks_, 0), merge_budget, d);
      for (int64_t t = 0; t < n; ++t)
        heads_.back().append(kv.pos0 + t, vals.data_ptr<double>() + (i * n + t) * d, sc.data_ptr<double>()[i * n + t],
                             gen_);
    }
    follow(kv.keys.to(at::kCPU), at::arange(kv.pos0, kv.pos0 + n, at::kLong).view({1, n}).expand({h, n}));
    rebuild();
  }

  void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) override {
    KVLAB_CHECK(k.size(1) == 1, "cam: decoding pushes one token per step, got {}", k.size(1));
    new_k_ = k, new_v_ = v, new_pos_ = pos0;
    ++n_seen_;
    rebuild();
  }

  void settle(const at::Tensor& q, const at::Tensor& prefix_keys) override {
    const int64_t h = static_cast<int64_t>(heads_.size()), m = held_.keys.size(1);  // m: held + the new token
    at::Tensor probs = q.size(1) > 0 ? stream_attention_probs(q, at::full({1}, new_pos_, at::kLong), prefix_keys,
                                                              held_, 1.0, reduce_).select(1, 0).to(at::kCPU).contiguous()
                                     : at::zeros({h, m}, at::kDouble);              // [Hkv, m]
    auto v = new_v_.to(at::kCPU, at::kDouble).contiguous();                         // [Hkv, 1, d]
    const int64_t window = std::max<int64_t>(budget_.entries_for(n_seen_) - sinks_, 0);
    for (int64_t i = 0; i < h; ++i) {
      const double* p = probs.data_ptr<double>() + i * m;
      heads_[i].accumulate(p);  // the held tokens' part (the new token's is its arrival score)
      heads_[i].set_window(std::max(window, heads_[i].window()));
      heads_[i].append(new_pos_, v.data_ptr<double>() + i * v.size(2), p[m - 1], gen_);
    }
    follow(at::cat({keys_, new_k_.to(at::kCPU, keys_.scalar_type())}, 1),
           at::cat({pos_, at::full({h, 1}, new_pos_, at::kLong)}, 1));
    new_k_ = new_v_ = at::Tensor();
    rebuild();
  }

  const KVSet& held() const override { return held_; }
  int64_t n_seen() const override { return n_seen_; }

 private:
  // The key store in the caches' order: `store` [Hkv, j, d] with positions `store_pos` [Hkv, j];
  // the caches hold a subsequence of it (keys are never merged).
  void follow(const at::Tensor& store, const at::Tensor& store_pos) {
    const int64_t h = static_cast<int64_t>(heads_.size()), j = store.size(1);
    auto sp = store_pos.contiguous();
    std::vector<at::Tensor> rows;
    std::vector<int64_t> pos;
    for (int64_t i = 0; i < h; ++i) {
      const auto toks = heads_[i].tokens();
      const int64_t* row = sp.data_ptr<int64_t>() + i * j;
      std::vector<int64_t> idx;
      for (int64_t a = 0; a < j && idx.size() < toks.size(); ++a)
        if (row[a] == toks[idx.size()]) idx.push_back(a);
      TORCH_INTERNAL_ASSERT(idx.size() == toks.size(), "cam: a held token is missing from the key store");
      rows.push_back(store[i].index_select(0, at::tensor(idx, at::kLong)));  // [m, d]
      pos.insert(pos.end(), toks.begin(), toks.end());
    }
    keys_ = at::stack(rows);                                                          // [Hkv, m, d]
    pos_ = at::tensor(pos, at::kLong).view({h, keys_.size(1)});                       // [Hkv, m]
  }

  // held_ = the caches' entries (their values merged), then the pending token if any.
  void rebuild() {
    const int64_t h = keys_.size(0), m = keys_.size(1), d = keys_.size(2);
    std::vector<double> vals;
    for (const auto& c : heads_) {
      auto cv = c.values();
      vals.insert(vals.end(), cv.begin(), cv.end());
    }
    auto opts = at::TensorOptions().dtype(dtype_).device(device_);
    held_.keys = keys_.to(opts);
    held_.values = at::tensor(vals, at::kDouble).view({h, m, d}).to(opts);
    held_.pos = pos_.to(device_);
    if (new_k_.defined()) {
      held_.keys = at::cat({held_.keys, new_k_.to(opts)}, 1);
      held_.values = at::cat({held_.values, new_v_.to(opts)}, 1);
      held_.pos = at::cat({held_.pos, at::full({h, 1}, new_pos_, held_.pos.options())}, 1);
    }
    held_.bias = at::zeros({h, held_.keys.size(1)}, opts);
  }

  Budget budget_;
  std::string reduce_;
  std::mt19937_64 gen_;
  int64_t n_seen_, sinks_ = 0, new_pos_ = 0;
  at::Device device_;
  at::ScalarType dtype_;
  std::vector<CaMCache> heads_;
  at::Tensor keys_;  // [Hkv, m, d] CPU, in the caches' order (sinks, window oldest first)
  at::Tensor pos_;   // [Hkv, m] their positions
  at::Tensor new_k_, new_v_;  // the pending token [Hkv, 1, d]
  KVSet held_;
};

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
  int64_t observation_queries() const override { return queries_ == "last" ? 1 : -1; }

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

  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    at::Tensor scores;
    if (kv.n_tokens() > 0 && kv.queries.defined() && kv.queries.size(1) > 0)
      scores = detail::accumulated_attention(detail::last_queries(kv, queries_ == "last" ? 1 : -1), reduce_);
    return std::make_unique<CaMStream>(kv, opt.budget, n_sink_, merge_budget_, scores, reduce_, opt.seed);
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

// Preset "paper": CaM on StreamingLLM eviction with 4 sinks (CaM, Zhang et al. ICML 2024, §5: "we
// apply CaM to StreamingLLM"), merge budget m = 32 (zyxxmu/cam start_size 4, merge to the next 32).
MethodPreset paper_preset_cam() {
  return {{{"n_sink", 4}, {"merge_budget", 32}}, 0, 0,
          "CaM §5 and zyxxmu/cam: StreamingLLM eviction with 4 sinks, merge budget 32", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_cam() {
  CompressorInfo m;
  m.name = "cam";
  m.description =
      "StreamingLLM eviction, evicted values merged into the next tokens (CaM)";
  m.make = make_cam;
  m.paper = paper_preset_cam;
  m.cost = {1.0, "known: eviction + merges O(n m d)",
            "known cost: StreamingLLM eviction plus merging each evicted value into m kept ones, O(n·m·d) for fixed m (CaM, Zhang et al.)"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
