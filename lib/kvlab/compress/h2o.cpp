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
//   mode=prefill (default; the official code's prompt phase and METHODS.md §3's replay rule):
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
#include "kvlab/compress/h2o.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvlab/compress/compressor.h"
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

// ---- the compressor ----------------------------------------------------------------

namespace {

class H2O final : public Compressor {
 public:
  explicit H2O(Params p) {
    recent_ratio_ = p.get_double("recent_ratio", 0.5);
    recent_ = p.get_int("recent", -1);
    queries_ = p.get_string("h2o_queries", "all", {"all", "window"});
    query_window_ = p.get_int("query_window", 32);
    normalize_ = p.get_bool("h2o_normalize", false);
    reduce_ = p.get_string("gqa_reduce", "mean", {"mean", "max", "sum"});
    mode_ = p.get_string("mode", "prefill", {"prefill", "stream"});
    KVLAB_CHECK(recent_ratio_ >= 0 && recent_ratio_ <= 1,
                "h2o: parameter 'recent_ratio' must be in [0, 1], got {}", recent_ratio_);
    KVLAB_CHECK(recent_ >= -1, "h2o: parameter 'recent' must be >= 0 (or -1 = use recent_ratio), got {}",
                recent_);
    KVLAB_CHECK(query_window_ >= 1, "h2o: parameter 'query_window' must be >= 1, got {}",
                query_window_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "h2o"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    detail::require_queries(kv, "h2o");
    const int64_t recent =
        recent_ >= 0 ? std::min(recent_, b)
                     : static_cast<int64_t>(std::floor(static_cast<double>(b) * recent_ratio_));
    LayerKV sub = detail::last_queries(kv, queries_ == "window" ? query_window_ : -1);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    if (mode_ == "prefill") {
      auto scores = detail::accumulated_attention(sub, reduce_).cpu().contiguous();  // [Hkv, n]
      auto seen = detail::queries_seeing(sub).contiguous();                          // [n]
      const double* sc = scores.data_ptr<double>();
      const double* cnt = seen.data_ptr<double>();
      for (int64_t h = 0; h < h_kv; ++h) {
        H2OCache cache(b, recent, normalize_);
        for (int64_t i = 0; i < n; ++i) cache.append(i, sc[h * n + i], cnt[i]);
        cache.evict();
        rows[h] = cache.tokens();
      }
    } else {
      rows = stream(sub, b, recent);
    }
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, b]
  }

 private:
  // mode=stream: token-by-token over the region; see the file comment.
  std::vector<std::vector<int64_t>> stream(const LayerKV& sub, int64_t b, int64_t recent) const {
    const int64_t n = sub.n_tokens(), h_kv = sub.n_kv_heads(), d = sub.keys.size(2);
    const int64_t h_q = sub.queries.size(0), n_obs = sub.queries.size(1), g = h_q / h_kv;
    KVLAB_CHECK(sub.query_pos.defined(),
                "h2o: mode=stream needs the positions of the queries (kv.query_pos)");
    auto keys = sub.keys.to(at::kCPU, at::kDouble).contiguous();          // [Hkv, n, d]
    // The exact prefix (sinks) is in every query's softmax, never in the cache H2O manages.
    const int64_t n_pre = sub.prefix_keys.defined() ? sub.prefix_keys.size(1) : 0;
    auto pre = n_pre ? sub.prefix_keys.to(at::kCPU, at::kDouble).contiguous() : at::Tensor();  // [Hkv, n_pre, d]
    auto qs = sub.queries.to(at::kCPU, at::kDouble).contiguous();         // [Hq, n_obs, d]
    auto qpos = sub.query_pos.to(at::kCPU, at::kLong).contiguous();       // [n_obs]
    const double* K = keys.data_ptr<double>();
    const double* Q = qs.data_ptr<double>();
    const int64_t* qp = qpos.data_ptr<int64_t>();
    // queries_at[t]: the queries sitting at region token t
    std::vector<std::vector<int64_t>> queries_at(static_cast<size_t>(n));
    for (int64_t j = 0; j < n_obs; ++j) {
      const int64_t t = qp[j] - sub.pos0;
      if (t >= 0 && t < n) queries_at[t].push_back(j);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    std::vector<double> logits, probs;
    const bool use_max = reduce_ == "max", use_mean = reduce_ == "mean";
    for (int64_t h = 0; h < h_kv; ++h) {
      H2OCache cache(b, recent, normalize_);
      for (int64_t t = 0; t < n; ++t) {
        cache.append(t);
        const auto& held = cache.tokens();
        const size_t m = held.size();
        for (int64_t j : queries_at[t]) {
          probs.assign(m, 0.0);
          for (int64_t r = 0; r < g; ++r) {
            const double* q = Q + ((h * g + r) * n_obs + j) * d;
            logits.resize(m + static_cast<size_t>(n_pre));  // held tokens, then the prefix
            double mx = -INFINITY;
            for (size_t i = 0; i < logits.size(); ++i) {
              const double* k = i < m ? K + (h * n + held[i]) * d
                                      : pre.data_ptr<double>() + (h * n_pre + int64_t(i - m)) * d;
              double s = 0;
              for (int64_t c = 0; c < d; ++c) s += q[c] * k[c];
              logits[i] = s * scale;
              mx = std::max(mx, logits[i]);
            }
            double z = 0;
            for (size_t i = 0; i < logits.size(); ++i) z += (logits[i] = std::exp(logits[i] - mx));
            for (size_t i = 0; i < m; ++i) {
              const double p = logits[i] / z;
              if (use_max) probs[i] = std::max(probs[i], p);
              else probs[i] += use_mean ? p / static_cast<double>(g) : p;
            }
          }
          cache.accumulate(probs.data());
        }
        cache.evict();
      }
      rows[h] = cache.tokens();
    }
    return rows;
  }

  double recent_ratio_ = 0.5;
  int64_t recent_ = -1, query_window_ = 32;
  std::string queries_, reduce_, mode_;
  bool normalize_ = false;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_h2o(const nlohmann::json& params) {
  return std::make_unique<H2O>(Params(params, "h2o"));
}

}  // namespace kvlab
