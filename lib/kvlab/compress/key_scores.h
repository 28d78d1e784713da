// The scores of the query-agnostic scorers (knorm.cpp, keydiff.cpp, lagkv.cpp, cur.cpp), exposed so that tests can
// compare them with kvpress's own (tests/generate/test_kvpress_golden.cpp). Higher = keep.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace kvlab {

// keys [Hkv, n, d] -> [Hkv, n] float64 on CPU: −‖k_j‖₂ (knorm).
at::Tensor knorm_scores(const at::Tensor& keys);
// keys [Hkv, n, d] -> [Hkv, n] float64 on CPU: −cos(k_j, mean_i k_i/‖k_i‖) (keydiff).
at::Tensor keydiff_scores(const at::Tensor& keys);
// keys, values [Hkv, n, d] -> [Hkv, n] float64 on CPU: LagKV's (1 for sinks and tail, rank / lag
// in between; lagkv.cpp).
at::Tensor lagkv_scores(const at::Tensor& keys, const at::Tensor& values, int64_t n_sink, int64_t lag_size);

// keys, values [Hkv, n, d] -> [Hkv, n] float64 on CPU: CurDKV's leverage scores as kvpress CURPress
// (cur.cpp; leverage "kv_product" | "key" | "value" | "kv_avg"; the first n_sink score 1).
at::Tensor cur_scores(const at::Tensor& keys, const at::Tensor& values, int64_t n_sink, const std::string& leverage,
                      bool local, int64_t window);

}  // namespace kvlab
