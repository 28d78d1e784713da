// y = x wᵀ + b for a few rows of x (batched branch decoding, issue 25), in one pass over w.
//
// A decode step of B branches multiplies B rows by every weight matrix of the model. OpenBLAS's
// sgemm at B = 2..32 packs and computes as for a large product: on SmolLM2's matrices, weights
// streamed from memory, one thread, 10 rows cost 2.3-2.8x one matrix-vector product (at::mm or
// at::linear), so batching saved little. Here each block of four weight rows is read once, from
// memory into L1, and meets every x row there: 10 rows cost 1.6-1.9x one product (the
// measurements are in the README, "Batched branch decoding"). at::linear stays the reference it
// is tested against (tests/model/test_few_rows.cpp).
#pragma once

#include <ATen/ATen.h>

namespace kvlab {

// Whether few_rows_linear takes these: CPU float32, x [B, K] and w [N, K] contiguous, 2 <= B <=
// kFewRowsMax, b [N] contiguous float32 or undefined.
constexpr int64_t kFewRowsMax = 32;
bool few_rows_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

// x [B, K], w [N, K], b [N] or undefined -> [B, N] float32: each output row by row of w, split
// over the threads by blocks of w's rows; every dot product sums 16 lanes, then the lanes.
at::Tensor few_rows_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = at::Tensor());

}  // namespace kvlab
