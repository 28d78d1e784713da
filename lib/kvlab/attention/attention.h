// Exact attention and attention over a compressed cache (docs/methods.md §1 "Compressed cache").
//
//   z = Σ_{i∈num} exp(s_i + b_i) v_i / Σ_{i∈den} exp(s'_i + b'_i),   s_i = q·k_i · scale
//
// GQA: query head h uses KV head h / (n_q_heads / n_kv_heads); K/V are never repeated per query
// head. Entries whose bias is -inf are padding (lets heads keep different counts).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace kvlab {

// One set of cache entries, all KV heads.
struct KVSet {
  at::Tensor keys;    // [n_kv_heads, n, head_dim]
  at::Tensor values;  // [n_kv_heads, n, head_dim]   (unused for a denominator set)
  at::Tensor bias;    // [n_kv_heads, n] additive logit bias (log-weights); undefined = 0
  at::Tensor pos;     // [n] or [n_kv_heads, n] int64 token positions; undefined = no causal mask
};

struct AttentionOptions {
  double scale = 0;        // 0 -> 1/sqrt(head_dim)
  at::Tensor query_pos;    // [n_q] int64; a key with pos > query_pos is masked. Undefined = no mask.
  int64_t window = 0;      // > 0 (with query_pos): a key with pos <= query_pos - window is masked too
  double logit_scale = 1;  // multiplies q·k before bias (BUZZ log n scaling)
};

// q [n_q_heads, n_q, head_dim] -> [n_q_heads, n_q, head_dim] in q's dtype.
// `den`, when given, replaces the numerator set in the denominator (SubGen, BalanceKV theory).
// Runs attention_one_query() for one query position in float32 on the CPU (decode_attention.h),
// attention_blocked() (blocked_attention.h: key tiles, online softmax) otherwise.
at::Tensor attention(const at::Tensor& q, const KVSet& num, const KVSet* den = nullptr,
                     const AttentionOptions& opt = {});

// The simple reference of attention(): the whole score matrix [n_kv_heads, g*n_q, n], one max,
// exp, sum and matmul. Tests compare the blocked path with it.
at::Tensor attention_reference(const at::Tensor& q, const KVSet& num, const KVSet* den = nullptr,
                               const AttentionOptions& opt = {});

// Exact causal attention where the queries are the last n_q of the n cached positions:
// query i sits at position n - n_q + i and sees keys 0..n - n_q + i.
// q [n_q_heads, n_q, head_dim], k, v [n_kv_heads, n, head_dim] -> [n_q_heads, n_q, head_dim]
at::Tensor exact_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           bool causal = true);

// Post-softmax exact attention probabilities, same causal convention.
// -> [n_q_heads, n_q, n] (zeros where masked)
at::Tensor exact_attention_probs(const at::Tensor& q, const at::Tensor& k, bool causal = true);

// Positions [n - n_q, n) as int64 on `like`'s device.
at::Tensor tail_positions(int64_t n, int64_t n_q, const at::Tensor& like);

}  // namespace kvlab
