// h2o — Heavy-Hitter Oracle: keep the recent window and the keys with the most accumulated
// attention.
//
// Paper: Zhenyu Zhang, Ying Sheng, Tianyi Zhou, Tianlong Chen, Lianmin Zheng, Ruisi Cai, Zhao Song,
//   Yuandong Tian, Christopher Ré, Clark Barrett, Zhangyang Wang, Beidi Chen,
//   "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models",
//   arXiv:2306.14048 (NeurIPS 2023); official code FMInference/H2O (h2o_hf/utils_real_drop).
//
// Summary. A few "heavy hitter" tokens collect most of the attention mass. H2O scores every key
// by its accumulated attention — the sum over queries of post-softmax attention — and keeps a
// recent window plus the top-scoring keys (the paper splits the budget half/half). During
// generation it evicts one token per decode step; an evicted key never returns. The per-head
// state is `H2OCache` (h2o.h), the one implementation behind both modes below:
//   mode=prefill (default; the official code's prompt phase and docs/methods.md §3's replay rule):
//     score_i = Σ_q reduce_{group}(softmax_q)_i over the selected queries, causal (a query sees
//     keys at positions <= its own); append every token with its score, evict once.
//   mode=stream: replays the region token by token as generation would: append token t; every
//     query sitting at t attends over the held tokens (itself included), its attention is added
//     to their scores; evict back to the budget.
// Which queries: `h2o_queries=all` uses every query the region came with (kv.queries at
// kv.query_pos); in replay these may be only the last 256 prompt positions, in which case the
// scores are those 256 queries' attention — the prompt's earlier queries were not captured.
// `h2o_queries=window` uses only the last `query_window` of them. `h2o_normalize` divides each
// key's score by the number of those queries that could attend to it (kvpress's fix for the
// bias toward early tokens, which are seen by more queries).
//
// Cost (issue 13; replay, n = 4096, d = 64, 256 queries: ~29 ms per (layer, KV head), ~50x uniform).
// The scores are post-softmax probabilities of every query over every key, summed: the queries'
// whole attention matrix, O(n_q·g·n·d) FLOPs plus a softmax over n_q·g·n entries (0.4 GFLOP and
// 3M exponentials per KV head here), computed in float64 for the sums. Uniform draws O(n) indices.
// Any method that scores keys with the paper's accumulated attention pays this; the append/evict
// that follows is O(n log n) and negligible. Not within 3x of uniform for that reason.
//
// Parameters:
//   recent_ratio [0.5]   fraction of the budget kept as the recent window (paper: 50/50)
//   recent [-1]          absolute recent window; overrides recent_ratio when >= 0 (capped at budget)
//   h2o_queries [all]    all | window
//   query_window [32]    queries used when h2o_queries=window
//   h2o_normalize [false]
//   gqa_reduce [mean]    mean | max | sum over a KV group's query heads (per query, then summed)
//   mode [prefill]       prefill | stream
//
// Deviations:
//   - A query's softmax runs over every key it sees, as in the model: the harness-kept sinks
//     (LayerKV::prefix_keys), the region and the exact tail up to its position (suffix_keys); the
//     scores are those probabilities restricted to the region. In mode=stream the held tokens
//     and the sinks form the denominator (a region query sees no tail key).
//   - GQA: the official code is MHA; kvlab scores per KV head with the group reduced by
//     gqa_reduce (per query, before summing over queries).
//   - mode=stream with queries only at the end of the prompt: tokens before the first query have
//     score 0 and are evicted oldest first, i.e. the cache is a sliding window until queries start;
//     queries after the region's last token (e.g. behind --keep-last) never trigger an eviction.
//   - recent window = floor(budget · recent_ratio); the heavy hitters get the rest.
#include "kvlab/compress/preset.h"
#include "kvlab/compress/h2o.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/held_set.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

// ---- H2OCache ----------------------------------------------------------------

H2OCache::H2OCache(int64_t budget, int64_t recent, bool normalize)
    : budget_(budget), recent_(recent), normalize_(normalize) {
  TORCH_INTERNAL_ASSERT(budget >= 1 && recent >= 0 && recent <= budget, "H2OCache: budget ", budget,
                        " recent ", recent);
}

void H2OCache::append(int64_t token, double score, double n_queries) {
  tokens_.push_back(token);
  scores_.push_back(score);
  counts_.push_back(n_queries);
}

void H2OCache::accumulate(const double* probs) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    scores_[i] += probs[i];
    counts_[i] += 1.0;
  }
}

void H2OCache::set_budget(int64_t budget, int64_t recent) {
  TORCH_INTERNAL_ASSERT(budget >= 1 && recent >= 0 && recent <= budget, "H2OCache: budget ", budget,
                        " recent ", recent);
  budget_ = budget;
  recent_ = recent;
}

double H2OCache::rank_key(size_t i) const {
  if (!normalize_) return scores_[i];
  return counts_[i] > 0 ? scores_[i] / counts_[i] : 0.0;
}

void H2OCache::evict() {
  const int64_t excess = size() - budget_;
  if (excess <= 0) return;
  const size_t n_cand = tokens_.size() - static_cast<size_t>(recent_);  // all but the recent ones
  std::vector<char> drop(tokens_.size(), 0);
  if (excess == 1) {  // the decode step: one linear scan
    size_t worst = 0;
    for (size_t i = 1; i < n_cand; ++i)
      if (rank_key(i) < rank_key(worst)) worst = i;  // strict: ties keep the oldest as worst
    drop[worst] = 1;
  } else {
    std::vector<size_t> order(n_cand);
    std::iota(order.begin(), order.end(), size_t{0});
    auto lower = [this](size_t a, size_t b) {
      double ka = rank_key(a), kb = rank_key(b);
      return ka < kb || (ka == kb && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (excess - 1), order.end(), lower);
    for (int64_t j = 0; j < excess; ++j) drop[order[j]] = 1;
  }
  size_t w = 0;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (drop[i]) continue;
    tokens_[w] = tokens_[i], scores_[w] = scores_[i], counts_[w] = counts_[i];
    ++w;
  }
  tokens_.resize(w), scores_.resize(w), counts_.resize(w);
}

// ---- the stream and the compressor ---------------------------------------------------------

namespace {

struct H2OConfig {
  double recent_ratio = 0.5;
  int64_t recent = -1;
  bool normalize = false;
  std::string reduce = "mean";

  // The recent window of a budget of b entries.
  int64_t recent_for(int64_t b) const {
    return recent >= 0 ? std::min(recent, b) : static_cast<int64_t>(std::floor(static_cast<double>(b) * recent_ratio));
  }
};

// One layer's H2O cache: an H2OCache per KV head (the ranking and eviction rule) and the held
// entries, in the same arrival order (stream.h). Every head holds the same count.
class H2OStream final : public LayerStream {
 public:
  // The region's tokens arrive with their scores and query counts ([Hkv, n] and [n] float64;
  // undefined = 0) and are evicted once to the budget.
  H2OStream(const H2OConfig& cfg, const Budget& budget, const LayerKV& kv, const at::Tensor& scores,
            const at::Tensor& counts)
      : cfg_(cfg), budget_(budget), n_seen_(kv.n_tokens()) {
    const int64_t h = kv.n_kv_heads(), n = kv.n_tokens();
    held_ = HeldSet(region_entries(kv));
    auto sc = scores.defined() ? scores.to(at::kCPU, at::kDouble).contiguous() : at::zeros({h, n}, at::kDouble);
    auto cnt = counts.defined() ? counts.to(at::kCPU, at::kDouble).contiguous() : at::zeros({n}, at::kDouble);
    for (int64_t i = 0; i < h; ++i) {
      heads_.emplace_back(1, 0, cfg.normalize);
      for (int64_t j = 0; j < n; ++j)
        heads_.back().append(kv.pos0 + j, sc.data_ptr<double>()[i * n + j], cnt.data_ptr<double>()[j]);
    }
    evict();
  }

  void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) override {
    held_.append(k, v, pos0);
    for (auto& c : heads_)
      for (int64_t j = 0; j < k.size(1); ++j) c.append(pos0 + j);
    last_pos_ = at::arange(pos0, pos0 + k.size(1), held_.set().pos.options());  // [T]
    n_seen_ += k.size(1);
  }

  // Every query adds its attention to the held tokens (one H2OCache::accumulate each), then the
  // heads evict back to the budget: one token per decode step.
  void settle(const at::Tensor& q, const at::Tensor& prefix_keys) override {
    const int64_t t = q.size(1);
    if (t > 0) {
      KVLAB_CHECK(last_pos_.defined() && last_pos_.numel() == t, "h2o: settle got {} queries for {} pushed tokens", t,
                  last_pos_.defined() ? last_pos_.numel() : 0);
      auto probs = stream_attention_probs(q, last_pos_, prefix_keys, held_.set(), 1.0, cfg_.reduce)
                       .to(at::kCPU).contiguous();  // [Hkv, T, m]
      const int64_t m = probs.size(2);
      const double* p = probs.data_ptr<double>();
      for (size_t h = 0; h < heads_.size(); ++h)
        for (int64_t j = 0; j < t; ++j) heads_[h].accumulate(p + (int64_t(h) * t + j) * m);
    }
    evict();
  }

  const KVSet& held() const override { return held_.set(); }
  bool rotate_held(const at::Tensor& delta, const at::Tensor& inv_freq) override {
    held_.rotate_keys(delta, inv_freq);
    return true;
  }
  double live_entries() const override { return double(held_.size()); }  // every entry exact
  int64_t n_seen() const override { return n_seen_; }

 private:
  // Evicts every head to the budget on the tokens seen and drops the evicted entries.
  void evict() {
    const int64_t b = budget_.entries_for(n_seen_), m = held_.size();
    if (m <= b) return;
    auto pos = held_.set().pos.to(at::kCPU).contiguous();  // [Hkv, m]
    std::vector<int64_t> keep;
    for (size_t h = 0; h < heads_.size(); ++h) {
      heads_[h].set_budget(b, cfg_.recent_for(b));
      heads_[h].evict();
      // The survivors are a subsequence of the held order: walk both.
      const int64_t* row = pos.data_ptr<int64_t>() + int64_t(h) * m;
      const auto& kept = heads_[h].tokens();
      size_t r = 0;
      for (int64_t i = 0; i < m && r < kept.size(); ++i)
        if (row[i] == kept[r]) keep.push_back(i), ++r;
      TORCH_INTERNAL_ASSERT(r == kept.size(), "h2o: a held token was not found in the stream");
    }
    held_.keep_rows(keep);  // [Hkv, b], each row ascending
  }

  H2OConfig cfg_;
  Budget budget_;
  std::vector<H2OCache> heads_;
  HeldSet held_;  // keys, values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m]
  at::Tensor last_pos_;
  int64_t n_seen_ = 0;
};

class H2O final : public Compressor {
 public:
  explicit H2O(Params p) {
    cfg_.recent_ratio = p.get_double("recent_ratio", 0.5);
    cfg_.recent = p.get_int("recent", -1);
    queries_ = p.get_string("h2o_queries", "all", {"all", "window"});
    query_window_ = p.get_int("query_window", 32);
    cfg_.normalize = p.get_bool("h2o_normalize", false);
    cfg_.reduce = p.get_string("gqa_reduce", "mean", {"mean", "max", "sum"});
    mode_ = p.get_string("mode", "prefill", {"prefill", "stream"});
    KVLAB_CHECK(cfg_.recent_ratio >= 0 && cfg_.recent_ratio <= 1,
                "h2o: parameter 'recent_ratio' must be in [0, 1], got {}", cfg_.recent_ratio);
    KVLAB_CHECK(cfg_.recent >= -1, "h2o: parameter 'recent' must be >= 0 (or -1 = use recent_ratio), got {}",
                cfg_.recent);
    KVLAB_CHECK(query_window_ >= 1, "h2o: parameter 'query_window' must be >= 1, got {}",
                query_window_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "h2o"; }
  nlohmann::json params() const override { return params_; }
  // h2o_queries=all: every prompt query, in generation and the tasks too (issue 21).
  int64_t observation_queries() const override { return queries_ == "window" ? query_window_ : -1; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    detail::require_queries(kv, "h2o");
    LayerKV sub = detail::last_queries(kv, queries_ == "window" ? query_window_ : -1);
    CompressOptions fixed = opt;
    fixed.budget = Budget::of_entries(b);
    auto s = mode_ == "prefill" ? prefill_stream(sub, fixed) : replay_stream(sub, fixed);
    auto idx = s->held().pos - kv.pos0;  // [Hkv, b] region indices, arrival order
    return gather_kept(kv, idx.to(kv.keys.device()));
  }

  // Generation: the prefill's scores (mode=prefill's rule on the given queries), then one eviction
  // per decoded token.
  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    if (kv.n_tokens() == 0 || !kv.queries.defined() || kv.queries.size(1) == 0)
      return std::make_unique<H2OStream>(cfg_, opt.budget, kv, at::Tensor(), at::Tensor());
    return prefill_stream(detail::last_queries(kv, queries_ == "window" ? query_window_ : -1), opt);
  }

 private:
  // score_i = Σ_q reduce_group(softmax_q)_i over sub's queries, causal; every token appended with
  // its score, one eviction.
  std::unique_ptr<H2OStream> prefill_stream(const LayerKV& sub, const CompressOptions& opt) const {
    detail::require_queries(sub, "h2o");
    return std::make_unique<H2OStream>(cfg_, opt.budget, sub, detail::accumulated_attention(sub, cfg_.reduce),
                                       detail::queries_seeing(sub));
  }

  // mode=stream: the region token by token, as generation would (see the file comment).
  std::unique_ptr<H2OStream> replay_stream(const LayerKV& sub, const CompressOptions& opt) const {
    const int64_t n = sub.n_tokens(), n_obs = sub.queries.size(1);
    KVLAB_CHECK(sub.query_pos.defined(), "h2o: mode=stream needs the positions of the queries (kv.query_pos)");
    LayerKV empty = sub;
    empty.keys = sub.keys.narrow(1, 0, 0);
    empty.values = sub.values.narrow(1, 0, 0);
    auto s = std::make_unique<H2OStream>(cfg_, opt.budget, empty, at::Tensor(), at::Tensor());
    auto qpos = sub.query_pos.to(at::kCPU, at::kLong).contiguous();  // [n_obs]
    std::vector<std::vector<int64_t>> queries_at(static_cast<size_t>(n));
    for (int64_t j = 0; j < n_obs; ++j) {
      const int64_t t = qpos.data_ptr<int64_t>()[j] - sub.pos0;
      if (t >= 0 && t < n) queries_at[t].push_back(j);
    }
    for (int64_t t = 0; t < n; ++t) {
      s->push(sub.keys.narrow(1, t, 1), sub.values.narrow(1, t, 1), sub.pos0 + t);
      // One settle per query sitting at t (a capture has at most one per position).
      if (queries_at[t].empty()) s->settle(sub.queries.narrow(1, 0, 0), sub.prefix_keys);
      for (int64_t j : queries_at[t]) s->settle(sub.queries.narrow(1, j, 1), sub.prefix_keys);
    }
    return s;
  }

  H2OConfig cfg_;
  int64_t query_window_ = 32;
  std::string queries_, mode_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_h2o(const nlohmann::json& params) {
  return std::make_unique<H2O>(Params(params, "h2o"));
}

// Preset "paper": heavy hitters / recent 50/50 (H2O §5 "we keep 50% heavy hitters and 50% recent
// tokens"; FMInference/H2O h2o_hf heavy_ratio = recent_ratio), scores from every prompt query
// (the official code accumulates the attention of the whole prompt), group mean.
MethodPreset paper_preset_h2o() {
  return {{{"recent_ratio", 0.5}, {"h2o_queries", "all"}, {"h2o_normalize", false}},
          0, 0, "H2O §5 and FMInference/H2O: heavy/recent 50/50, scores from every prompt query", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_h2o() {
  CompressorInfo m;
  m.name = "h2o";
  m.description =
      "recent window + heavy hitters by accumulated attention (H2O)";
  m.make = make_h2o;
  m.paper = paper_preset_h2o;
  m.cost = {1.0, "known: O(n_obs n d) scores + top-k",
            "known cost: accumulated attention of n_obs queries over n keys O(n_obs·n·d), then top-k O(n log n) (H2O, Zhang et al.)"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
