// The exact KV cache of the forward pass, and the blocked causal GQA attention it uses.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "kvlab/attention/backend.h"

namespace kvlab {

// Exact attention over a growing per-layer KV cache (capacity doubles; K/V stored once per KV
// head, never repeated per query head). Queries are processed in blocks of `query_block` rows so
// prefill memory stays O(query_block * n) instead of O(T * n).
class ExactAttention : public AttentionBackend {
 public:
  explicit ExactAttention(int64_t n_layers, int64_t query_block = 128);
  // Keeps every position (a sliding window masks the older ones; the cache does not drop them).
  at::Tensor attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                    const at::Tensor& v_new, int64_t pos0, int64_t window) override;
  void reset() override;
  int64_t n_cached(int layer) const;
  at::Tensor keys(int layer) const;    // [n_kv_heads, n_cached, head_dim] (view)
  at::Tensor values(int layer) const;  // [n_kv_heads, n_cached, head_dim] (view)

 private:
  struct LayerCache {
    at::Tensor k, v;  // [n_kv_heads, capacity, head_dim]
    int64_t n = 0;
  };
  std::vector<LayerCache> cache_;
  int64_t query_block_;
};

// Causal GQA attention: query i of q sits at position pos0 + i; key j at position j.
// q [n_q_heads, T, head_dim], k, v [n_kv_heads, n, head_dim] (n >= pos0 + T)
// -> [n_q_heads, T, head_dim]. Blocks of `query_block` queries; each block only reads the keys it
// can see: window > 0 (sliding window) hides keys at positions <= query - window.
// Reference: kvlab::attention() with AttentionOptions::query_pos and window (tests compare them).
at::Tensor causal_gqa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t pos0, int64_t query_block = 128, int64_t window = 0);

// Whether causal_gqa_attention runs its (KV head, query block) items in parallel on CPU: this
// build calls ATen's parallel_for with OpenMP on LibTorch's own runtime. False: block by block,
// with ATen's ops threading inside (about 1.6x slower at 8k tokens on 2 threads).
bool causal_attention_parallel();

}  // namespace kvlab
