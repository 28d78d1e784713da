// The quantized part of a held set (issue 52): its oldest `keys` / `values` entries, in cache
// order, hold the dequantized values of what a KvQuantizer (quant/kv_quantizer.h) stores for them;
// the rest are full precision. The quantizer says when entries leave full precision.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "kvlab/quant/kv_quantizer.h"

namespace kvlab {

struct QuantizedPart {
  int64_t keys = 0, values = 0;            // entries quantized (cache order, the oldest first)
  int64_t key_bytes = 0, value_bytes = 0;  // what the quantizer stores for them
};

// After a step took a held set (keys, values [Hkv, m, d]) from t_before entries to m (t_before = 0:
// the set as compression left it), quantizes in place the entries the quantizer lets go. At
// t_before = 0 keys and values are first copied (they may share memory with the prefill).
void settle_quantized(at::Tensor& keys, at::Tensor& values, QuantizedPart& part, const KvQuantizer& q,
                      int64_t t_before);

// K and V bytes of m entries (H heads, head_dim D, full precision at `elt` bytes an element) right
// after compression: stored by `q` as its window leaves them (null: all full precision).
int64_t held_kv_bytes(const KvQuantizer* q, int64_t m, int64_t H, int64_t D, int64_t elt);

// Equal memory in bytes (issue 52, --bytes): the most entries m in [1, n] of a layer of n tokens
// whose held_kv_bytes are at most `fraction` of the full-precision layer's (n entries at `elt`).
// Unquantized: ⌊fraction · n⌋ (Budget::of_bytes's entries); quantized: more, as the bits
// allow. Bytes are not monotone in m under a window (a block leaving full precision shrinks
// them), so every m is tried.
int64_t entries_for_bytes(const KvQuantizer* q, int64_t n, int64_t H, int64_t D, int64_t elt, double fraction);

// K and V of a held set as stored: full-precision entries at their dtype, quantized ones as counted
// in `part`. Undefined keys: 0.
int64_t quantized_kv_bytes(const at::Tensor& keys, const at::Tensor& values, const QuantizedPart& part);

}  // namespace kvlab
