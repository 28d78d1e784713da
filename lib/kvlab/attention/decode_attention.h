// Attention of one query position over one cache set, in plain loops (issue 25): what a decode
// step does in every layer of every branch. Through ATen (attention_blocked) such a step is ~30
// small ops, ~340 µs per layer on SmolLM2 at 410 entries where the arithmetic is ~10 µs, and it
// was 84% of batched decoding's time. attention() takes this path when it applies;
// attention_blocked() stays the reference it is tested against (tests/core/test_attention.cpp).
#pragma once

#include <ATen/ATen.h>

#include "kvlab/attention/attention.h"

namespace kvlab {

// Whether attention_one_query can take these arguments: CPU float32 q [Hq, 1, d] and set (keys /
// values [Hkv, n, d] with unit stride along d and along the entries' rows; bias [Hkv, n] or
// undefined; pos [n] or [Hkv, n] int64 or undefined), no separate denominator, n > 0.
bool one_query_applies(const at::Tensor& q, const KVSet& num, const KVSet* den);

// The same result as attention(q, num, nullptr, opt) for one query position (opt.query_pos [1] or
// undefined), computed head by head on the calling thread: scores s_j = q·k_j · scale · logit_scale
// + bias_j, causal and window masks as attention_blocked applies them, softmax, Σ p_j v_j; sums in
// double. q [Hq, 1, d] -> [Hq, 1, d] float32.
at::Tensor attention_one_query(const at::Tensor& q, const KVSet& num, const AttentionOptions& opt);

}  // namespace kvlab
