// Query-side helpers shared by the score-based selection methods (h2o, snapkv, pyramidkv, cam):
// which queries a method looks at, where they sit, and the attention they put on the region.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"

namespace kvlab::detail {

// Absolute positions of kv.queries -> [n_obs] int64. When the caller gave none, the queries are
// taken to be the last n_obs positions of the region (the convention of exact_attention); when
// there are more queries than region tokens they stay undefined (no causal mask).
inline at::Tensor query_positions(const LayerKV& kv) {
  if (kv.query_pos.defined()) return kv.query_pos;
  const int64_t n_obs = kv.queries.defined() ? kv.queries.size(1) : 0, n = kv.n_tokens();
  if (n_obs > n) return {};
  return at::arange(kv.pos0 + n - n_obs, kv.pos0 + n, kv.keys.options().dtype(at::kLong));
}

// The same region seen by only the last `w` queries (all when w < 0 or w >= n_obs).
inline LayerKV last_queries(const LayerKV& kv, int64_t w) {
  LayerKV out = kv;
  out.query_pos = query_positions(kv);
  const int64_t n_obs = kv.queries.size(1);
  if (w < 0 || w >= n_obs) return out;
  out.queries = kv.queries.narrow(1, n_obs - w, w);                      // [Hq, w, d]
  out.context.drop(inputs::attention_sums);                              // it was over every query
  if (out.query_pos.defined()) out.query_pos = out.query_pos.narrow(0, n_obs - w, w);  // [w]
  return out;
}

inline void require_queries(const LayerKV& kv, const std::string& method) {
  KVLAB_CHECK(kv.queries.defined() && kv.queries.dim() == 3 && kv.queries.size(1) > 0,
              "{}: scores keys with queries, but the region came with none (capture queries, or "
              "choose a method that needs none)",
              method);
  KVLAB_CHECK(kv.queries.size(0) % kv.n_kv_heads() == 0,
              "{}: n_q_heads={} is not a multiple of n_kv_heads={}", method, kv.queries.size(0),
              kv.n_kv_heads());
}

// Post-softmax attention of every query of `kv` (causal against its positions), reduced over each
// KV group's query heads by `reduce`, summed over the queries in double:
// -> [n_kv_heads, n] float64 on the keys' device. Queries go in chunks of `chunk`, so a capture
// with queries at every position (n_obs = n) needs O(chunk·n) memory, not O(n²).
// Causal: the keys after a chunk's last query are masked for all of it, so they are left out of its
// softmax (the same probabilities, about half the work when the queries cover the whole prompt, as
// h2o_queries=all does in generation).
// chunk <= 0 (the default) sizes the chunks to ~16 MB of scores ([Hq, chunk, keys seen] float32,
// 16 to 256 queries): at 8k tokens a 256-query chunk is 75 MB, above glibc's largest mmap
// threshold (32 MB), so every chunk was a fresh mmap whose pages the kernel zeroes on first touch
// (perf on a LongBench record: ~30% of the time in page faults and clear_page).
inline at::Tensor accumulated_attention(const LayerKV& kv, const std::string& reduce,
                                        int64_t chunk = 0) {
  const int64_t n_obs = kv.queries.size(1), n = kv.n_tokens();
  const at::Tensor sums =
      kv.context.has(inputs::attention_sums) ? kv.context.get(inputs::attention_sums) : at::Tensor();  // [Hq, n]
  if (sums.defined() && (reduce == "mean" || reduce == "sum") && sums.size(0) == kv.n_q_heads() && sums.size(1) == n) {
    // The group's query heads summed (mean: averaged): Σ_q reduce_g p = reduce_g Σ_q p, both linear.
    const int64_t g = kv.n_q_heads() / kv.n_kv_heads();
    auto s = sums.to(kv.keys.device(), at::kDouble).view({kv.n_kv_heads(), g, n}).sum(1);  // [Hkv, n]
    return reduce == "mean" ? s / static_cast<double>(g) : s;
  }
  if (chunk <= 0) {
    const int64_t n_all = kv.n_prompt();
    const int64_t row_bytes = std::max<int64_t>(1, kv.n_q_heads() * n_all * int64_t(sizeof(float)));
    chunk = std::clamp<int64_t>((int64_t(16) << 20) / row_bytes, 16, 256);
  }
  at::Tensor total = at::zeros({kv.n_kv_heads(), n}, kv.keys.options().dtype(at::kDouble));  // [Hkv, n]
  for (int64_t j0 = 0; j0 < n_obs; j0 += chunk) {
    const int64_t len = std::min(chunk, n_obs - j0);
    LayerKV part = kv;
    part.queries = kv.queries.narrow(1, j0, len);                        // [Hq, len, d]
    int64_t seen = n;                                                    // region keys any query sees
    if (kv.query_pos.defined()) {
      part.query_pos = kv.query_pos.narrow(0, j0, len);                  // [len]
      const int64_t last = part.query_pos.max().item<int64_t>();
      seen = std::clamp<int64_t>(last - kv.pos0 + 1, 0, n);
      if (seen < n) {
        part.keys = kv.keys.narrow(1, 0, seen);                          // [Hkv, seen, d]
        part.values = kv.values.narrow(1, 0, seen);
        part.suffix_keys = at::Tensor();                                 // after every query
      }
    }
    if (seen == 0) continue;
    total.narrow(1, 0, seen).add_(group_attention_probs(part, reduce).sum(1, false, at::kDouble));  // [Hkv, seen]
  }
  return total;
}

// The context's attention sums (context.h inputs::attention_sums) from kv's queries: [n_q_heads, n]
// float64, each query head on its own (its KV head's keys repeated per query head, then
// accumulated_attention with groups of one).
inline at::Tensor attention_sums_per_query_head(const LayerKV& kv) {
  const int64_t g = kv.n_q_heads() / kv.n_kv_heads();
  LayerKV per_head = kv;
  per_head.context.drop(inputs::attention_sums);
  auto rep = [g](const at::Tensor& t) { return t.defined() ? t.repeat_interleave(g, 0) : t; };  // [Hq, ., d]
  per_head.keys = rep(kv.keys);
  per_head.values = rep(kv.values);
  per_head.prefix_keys = rep(kv.prefix_keys);
  per_head.suffix_keys = rep(kv.suffix_keys);
  return accumulated_attention(per_head, "sum");
}

// For each region key, how many of kv's queries may attend to it (position <= query position).
// -> [n] float64
inline at::Tensor queries_seeing(const LayerKV& kv) {
  const int64_t n = kv.n_tokens(), n_obs = kv.queries.size(1);
  if (!kv.query_pos.defined()) return at::full({n}, static_cast<double>(n_obs), at::kDouble);
  auto kp = at::arange(kv.pos0, kv.pos0 + n, at::TensorOptions().dtype(at::kLong));  // [n]
  auto qp = kv.query_pos.to(at::kCPU).to(at::kLong).view({1, n_obs});                // [1, n_obs]
  return (kp.view({n, 1}) <= qp).sum(1).to(at::kDouble);
}

// Indices of the `k` largest scores, ties to the lower index, returned ascending.
// scores: n values.
inline std::vector<int64_t> top_k_indices(const double* scores, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  k = std::max<int64_t>(0, std::min(k, n));
  auto better = [scores](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Per-head index lists (each ascending, possibly of different lengths) -> [n_kv_heads, max_len]
// int64, short rows padded with -1 (gather_kept turns those into bias -inf).
inline at::Tensor pad_index_rows(const std::vector<std::vector<int64_t>>& rows) {
  size_t m = 0;
  for (const auto& r : rows) m = std::max(m, r.size());
  auto out = at::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(m)}, -1,
                      at::TensorOptions().dtype(at::kLong));
  auto a = out.accessor<int64_t, 2>();
  for (size_t h = 0; h < rows.size(); ++h)
    for (size_t j = 0; j < rows[h].size(); ++j) a[h][j] = rows[h][j];
  return out;
}

// Ada-KV's allocation (adakv.cpp; criticaladakv shares it): of a layer's scores sc [Hkv, n]
// (row-major float64, +inf = always kept), each head's adakv_safeguard(b, alpha) best, then the
// best of the rest across heads, H·b in all; ties to the lower (head, position). A kept mask [Hkv·n].
int64_t adakv_safeguard(int64_t b, double alpha);  // max(1, ⌊alpha·b⌋), 0 when alpha or b is 0
std::vector<char> adakv_selection(const double* sc, int64_t h_kv, int64_t n, int64_t b, double alpha);

// The methods with Compressor::keep_scores, which the wrappers (adakv, criticalkv) take as scorers
// (kvzip: its own layer's scores; the wrapper then allocates within the layer).
inline const std::vector<std::string>& top_score_methods() {
  static const std::vector<std::string> names = {"snapkv", "knorm", "keydiff", "lagkv", "cur", "expected_attention", "capkv",
                                                 "compactor", "kvzip"};
  return names;
}

// A wrapper's (adakv, criticalkv) given parameters: {its own (the keys in `own_keys`), its scorer's (the rest)}.
inline std::pair<nlohmann::json, nlohmann::json> split_wrapper_params(const nlohmann::json& given,
                                                                      const std::vector<std::string>& own_keys) {
  nlohmann::json own = nlohmann::json::object(), inner = nlohmann::json::object();
  for (auto it = given.begin(); it != given.end(); ++it)
    (std::count(own_keys.begin(), own_keys.end(), it.key()) ? own : inner)[it.key()] = it.value();
  return {own, inner};
}

// A wrapper's effective parameters: its own, then its scorer's.
inline nlohmann::json wrapper_params(nlohmann::json own, const Compressor& scorer) {
  const nlohmann::json inner = scorer.params();  // a named copy: items() of a temporary dangles
  for (auto it = inner.begin(); it != inner.end(); ++it) own[it.key()] = it.value();
  return own;
}

// The whole compress() of every top-k scorer (knorm, keydiff, lagkv, expected_attention,
// compactor, criticalkv): the budget b resolved on the region; everything kept when b covers it,
// else per KV head the b highest of c.keep_scores ([Hkv, n] float64 on CPU; ties to the lower
// index), kept exact.
inline CompressedKV compress_top_scores(const Compressor& c, const LayerKV& kv, const CompressOptions& opt) {
  const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
  if (b >= n) return keep_all(kv);
  const at::Tensor scores = c.keep_scores(kv, opt);  // [Hkv, n]
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
  for (int64_t h = 0; h < h_kv; ++h) rows[h] = top_k_indices(scores.data_ptr<double>() + h * n, n, b);
  return gather_kept(kv, pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, b]
}

}  // namespace kvlab::detail
