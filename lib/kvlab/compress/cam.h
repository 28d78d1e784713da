// CaM's per-KV-head cache state, shared by replay (cam.cpp drives it over a region in one shot)
// and token-by-token generation: sinks + a recent window; a token leaving the window may have its
// value merged into the tokens after it.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvlab {

class CaMCache {
 public:
  // n_sink sinks, `window` recent tokens (n_sink + window = the budget), merge_budget m >= 1.
  CaMCache(int64_t n_sink, int64_t window, int64_t merge_budget, int64_t head_dim);

  // A new token with its value row [head_dim] and accumulated attention score. The first n_sink
  // tokens become sinks; later ones enter the window. When the window then holds window + 1
  // tokens its oldest, e, leaves: with probability
  //   p = clamp(A_e / mean(A over the window tokens after e, the new one included), 0, 1)
  // (p = 1 if that mean is 0 and A_e > 0, else 0 there; one uniform draw u = (gen() >> 11)·2^-53
  // per eviction, merge iff u < p) V[e]/m is added to the values of the next m window tokens
  // (all of them if the window holds fewer); keys are never changed.
  void append(int64_t token, const double* value, double score, std::mt19937_64& gen);
  // A larger window (generation under a ratio: the cache grows with the tokens seen); w >= the
  // current window.
  void set_window(int64_t w);
  // One query's attention over the held tokens, in held order (size() entries).
  void accumulate(const double* probs);

  int64_t size() const { return static_cast<int64_t>(sinks_.size()) + count_; }
  // Held tokens in order (sinks, then the window oldest first), their values [size(), head_dim].
  std::vector<int64_t> tokens() const;
  std::vector<double> values() const;
  int64_t merges() const { return merges_; }
  int64_t window() const { return window_; }  // evictions that merged

 private:
  int64_t slot(int64_t k) const { return (head_ + k) % (window_ + 1); }  // k-th oldest in window
  int64_t n_sink_, window_, m_, d_;
  std::vector<int64_t> sinks_;
  std::vector<double> sink_vals_, sink_scores_;
  // The window as a ring buffer of capacity window_ + 1 (the newcomer before e leaves).
  std::vector<int64_t> win_tok_;
  std::vector<double> win_vals_, win_scores_;
  int64_t head_ = 0, count_ = 0, merges_ = 0;
};

}  // namespace kvlab
