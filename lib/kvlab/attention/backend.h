// The seam between the forward pass and the KV cache: the model hands each layer's new q/k/v to
// an AttentionBackend, which stores what it keeps and returns the attention output. The exact
// cache (exact_cache.h) is one; compressed caches are others.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

// Where attention happens; owns the KV cache. Compressed caches implement this too.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // q [n_q_heads, T, head_dim] at positions pos0 .. pos0+T-1; k_new, v_new [n_kv_heads, T,
  // head_dim] for those positions. Adds k_new/v_new to the layer's cache and returns the causal
  // attention output [n_q_heads, T, head_dim] in q's dtype. window > 0: the layer's sliding window
  // (ModelConfig::layer_window): a query at position p sees only keys at positions (p - window, p].
  virtual at::Tensor attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                            const at::Tensor& v_new, int64_t pos0, int64_t window) = 0;
  // Forget every cached entry (a new sequence starts at position 0).
  virtual void reset() = 0;
};

}  // namespace kvlab
