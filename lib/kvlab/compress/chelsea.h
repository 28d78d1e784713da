// Chelsea's per-layer cache state, its partition rule and the outlier-head score
// (implemented in chelsea.cpp). Exposed for generation (append + compress when the cache reaches
// B + g, Alg. 1) and for tests (Theorem 6.1, merging invariants).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvlab {

struct ChelseaConfig {
  int64_t n_sink = 16;    // n1: first entries never merged
  int64_t n_recent = 64;  // n2: last entries never merged
  int64_t chunk = 256;    // c; 0 = "none" (one chunk over the whole compressible part)
  double r_init = 0.45;   // schedule r_i = max(r_min, r_init − alpha·min(m, i))
  double alpha = 0.05;
  int64_t m = 3;
  double r_min = 0.05;    // "r is manually restricted to exceed 0": kvlab's floor

  double step_ratio(int64_t i) const {
    return std::max(r_min, r_init - alpha * static_cast<double>(std::min(m, i)));
  }
};

// The alternating partition inside a chunk (Theorem 6.1): local index j (0-based) is in set A
// iff j is even; B holds the odd ones. Every edge goes from an A entry to a B entry.
inline bool chelsea_in_set_a(int64_t j) { return j % 2 == 0; }

class ChelseaCache {
 public:
  ChelseaCache(const ChelseaConfig& cfg, int64_t n_kv_heads);

  // Appends tokens with degree 1. keys, values [n_kv_heads, t, head_dim].
  void append(const at::Tensor& keys, const at::Tensor& values);
  // Alg. 1's trigger for generation: compress to `budget` when size() >= budget + g.
  bool maybe_compress(int64_t budget, int64_t g);
  // Chunked-soft-matching steps with the r schedule until size() <= budget; the last step merges
  // only as many edges as needed, so size() == budget afterwards (when it started above).
  // Returns the number of steps.
  int compress_to(int64_t budget);
  // One step that merges the top `n_edges` edges (fewer if fewer exist); returns edges merged.
  int64_t step(int64_t n_edges);

  int64_t size() const { return keys_.defined() ? keys_.size(1) : 0; }
  const at::Tensor& keys() const { return keys_; }      // [n_kv_heads, size, head_dim]
  const at::Tensor& values() const { return values_; }  // [n_kv_heads, size, head_dim]
  const at::Tensor& degree() const { return degree_; }  // [n_kv_heads, size] tokens per entry
  // Sinks/recent actually protected (shrunk when the budget is below n1 + n2 + 1).
  int64_t n_sink() const { return n1_; }
  int64_t n_recent() const { return n2_; }

 private:
  ChelseaConfig cfg_;
  int64_t n_kv_heads_;
  int64_t n1_, n2_;
  at::Tensor keys_, values_, degree_;
};

// Best edge of every A entry of the compressible part [n1, n − n2) of `keys` [H, n, d]:
// cosine similarity to its most similar B entry in the same chunk.
// Returns {best [H, n_a] (−inf where an A entry has no B partner), b_local [H, n_a] int64 index of
// the partner, as an offset from n1}, with A entries listed chunk by chunk.
struct ChelseaEdges {
  at::Tensor best;      // [H, n_a]
  at::Tensor a_pos;     // [n_a] int64 offset from n1 of each A entry
  at::Tensor b_pos;     // [H, n_a] int64 offset from n1 of its partner
  int64_t n_valid = 0;  // A entries that have a partner (same for every head)
};
ChelseaEdges chelsea_edges(const at::Tensor& keys, int64_t n1, int64_t n2, int64_t chunk);

// App. B outlier score per head: the fraction of A entries whose best edge has cosine similarity
// below `sim_threshold` (0.8 in the paper). High = outlier head. keys [H, n, d] -> [H] double.
// Calibration (averaging this over WikiText-2 samples per (layer, head)) is done by the caller.
at::Tensor chelsea_outlier_scores(const at::Tensor& keys, const ChelseaConfig& cfg,
                                  double sim_threshold = 0.8);

// The top `fraction` of heads by calibrated outlier score. scores [n_layers, n_kv_heads] ->
// (layer, head) pairs, as the `full_heads` parameter takes them ("L:H,L:H").
std::vector<std::pair<int, int>> chelsea_select_outlier_heads(const at::Tensor& scores, double fraction);

}  // namespace kvlab
