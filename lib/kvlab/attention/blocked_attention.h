// Attention over key blocks with an online softmax (Milakov & Gimelshein 2018; FlashAttention's
// recurrence): the score matrix is never materialised beyond one [n_kv_heads, g*n_q, block] tile,
// so each tile's scores, exponentials and sums stay in cache instead of streaming n-wide rows
// through memory several times. Same contract and result as attention_reference() (attention.h)
// up to rounding; tests/core/test_attention.cpp compares the two.
//
// Per KV head and query row, over key blocks b:
//   s_b = (q · scale·logit_scale) K_bᵀ + bias_b, masked -inf where pos > query_pos (or, with a
//         sliding window, pos <= query_pos − window)
//   m'  = max(m, max_j s_b)     l = l·e^(m−m') + Σ_j e^(s_b − m')     o = o·e^(m−m') + e^(s_b − m') V_b
// With a separate denominator set, numerator and denominator run their own recurrences and are
// put on a common max at the end.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kvlab/attention/attention.h"

namespace kvlab {

// q [n_q_heads, n_q, head_dim] -> [n_q_heads, n_q, head_dim_v] in q's dtype. bf16/fp16 inputs are
// computed in float32. `block` keys per tile (<= 0: ~2^16 scores per tile, 256..16384 keys).
at::Tensor attention_blocked(const at::Tensor& q, const KVSet& num, const KVSet* den,
                             const AttentionOptions& opt, int64_t block = 0);

}  // namespace kvlab
