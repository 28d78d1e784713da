// BUZZ's per-layer cache state and its layout arithmetic (implemented in buzz.cpp).
//
// Exposed so that generation can drive the same state token by token, and so that tests can check
// the layout rule (Theorem 3.1) against the state object. Replay uses it through the registered
// compressors buzz, buzz-interval and buzz-logn.
//
// Layout of the cache, per KV head (every head has the same counts; only which token wins each
// hive differs):   [sink k][old samples][new tokens][window w]
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

struct BuzzConfig {
  int64_t n_sink = 4;         // k
  int64_t window = 160;       // w
  int64_t threshold = 400;    // T: evict when |old| + |new| > T
  int64_t stride = 5;         // s (new tokens); old samples use ŝ = ⌊(s+1)/2⌋
  bool swap_strides = false;  // Fig. 8a ablation: new tokens use ŝ, old samples use s
  bool interval_new = false;  // buzz-interval (Fig. 8b): new tokens by interval sampling too

  int64_t small_stride() const { return (stride + 1) / 2; }
  int64_t new_stride() const { return swap_strides ? small_stride() : stride; }
  int64_t old_stride() const { return swap_strides ? stride : small_stride(); }
};

// ---- Layout arithmetic (entry counts never depend on the scores) ------------------------------

// ⌈a / b⌉ for a >= 0, b >= 1.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Old samples after one eviction of `n_old` old samples and `n_new` new tokens:
//   ⌈n_old / s_old⌉ + ⌈n_new / s_new⌉   (interval sampling and one winner per hive of s_new).
int64_t buzz_old_after_eviction(int64_t n_old, int64_t n_new, const BuzzConfig& c);

// Entries left when an n-token region is prefilled in one block and evicted until it fits in
// T + k + w (Remark 2). n itself when no eviction triggers (n - k - w <= T).
int64_t buzz_prefill_size(int64_t n, const BuzzConfig& c);

// Theorem 3.1's T/w:  s odd: (s² + 1) / (s + 1);  s even: s − 1. Both equal s_new − s_new/s_old + 1,
// the T/w for which the streaming fixed point of the old-sample count a* = (T+1)/(T/w) equals w.
double buzz_theorem_ratio(int64_t s);

// Streaming steady state (decoding one token at a time, trigger at |other| = T + 1): the old
// sample count after each eviction follows a' = ⌈a/s_old⌉ + ⌈(T + 1 − a)/s_new⌉, whose real
// fixed point is a* = (T + 1) / ρ with ρ = s_new − s_new/s_old + 1 (= buzz_theorem_ratio(s) when
// the strides are not swapped). With λ = 1/s_old − 1/s_new ∈ [0, 1) the ceilings keep the
// iterates within [a*, a* + 2/(1 − λ)) once transients die out.
double buzz_steady_state_old(const BuzzConfig& c);

// The (w, T) replay uses to meet a budget; see buzz.cpp "Budget" for the rule.
struct BuzzLayout {
  int64_t n_sink = 0, window = 0, threshold = 0;
  int64_t size = 0;  // entries after prefill (buzz_prefill_size)
};
// `base` gives k, s and the strides; base.window / base.threshold < 0 mean "choose", >= 0 fixed.
BuzzLayout buzz_choose_layout(int64_t n, int64_t budget, const BuzzConfig& base);

// The (w, T) of a cache streamed under a cap of `capacity` entries: the most it holds between
// decode steps, k + w + T, equals the cap, with T/w as close to Theorem 3.1's ρ as integers allow
// (w = round((C − k)/(1 + ρ)), T = C − k − w), unless base.window or base.threshold fix one of them.
// A cap below the minimum (k + 1 with w = 0, T = 1, or k + w + 1 for a given w) is an error.
BuzzLayout buzz_stream_layout(int64_t capacity, const BuzzConfig& base);

// ---- The state object ------------------------------------------------------------------------

class BuzzCache {
 public:
  BuzzCache(const BuzzConfig& cfg, int64_t n_kv_heads);

  // Appends t tokens and runs at most one eviction (Alg. 1 checks its trigger once per call).
  //   keys, values [n_kv_heads, t, head_dim]; pos [t] int64 (carried to `pos()`, e.g. region index)
  //   score [n_kv_heads, size() + t]: accumulated-attention increment, i.e. the post-softmax
  //     attention of the new queries on the current cache followed by the new tokens, summed over
  //     those queries and the KV group's query heads; undefined = no increment (buzz-interval).
  // Returns whether an eviction ran.
  bool append(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& pos,
              const at::Tensor& score);
  // One eviction if |old| + |new| > T; returns whether it ran.
  bool evict_once();
  // Remark 2 (prefill): evict until |old| + |new| <= T. Returns the number of evictions.
  int fit();

  int64_t size() const { return keys_.defined() ? keys_.size(1) : 0; }
  int64_t n_old() const { return n_old_; }
  // |old| + |new|: the part between sink and window.
  int64_t n_other() const;
  const at::Tensor& keys() const { return keys_; }      // [n_kv_heads, size, head_dim]
  const at::Tensor& values() const { return values_; }  // [n_kv_heads, size, head_dim]
  const at::Tensor& pos() const { return pos_; }        // [n_kv_heads, size] int64
  const at::Tensor& score() const { return score_; }    // [n_kv_heads, size] accumulated attention
  // Rotates the held keys by delta [n_kv_heads, size] positions (attention/rope.h rotate_by;
  // re-rotation, cache/rerotation.h).
  void rotate_keys(const at::Tensor& delta, const at::Tensor& inv_freq);

 private:
  BuzzConfig cfg_;
  int64_t n_kv_heads_;
  at::Tensor keys_, values_, pos_, score_;
  int64_t n_old_ = 0;
};

}  // namespace kvlab
