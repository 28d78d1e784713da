// A weight matrix kept as a GGUF file stores it, and multiplied without dequantizing it whole
// (issue 51: "weights as stored").
//
// Decode reads every weight once per token, so its time is the bytes of the weights over the memory
// bandwidth: SmolLM2-135M's Q4_1 file holds 90 MB, its fp32 weights ~540 MB. A StoredMatrix keeps
// each row as the file's ggml blocks (Q4_1: 32 weights in 20 bytes); stored_linear decodes one block
// at a time into a buffer in L1 (gguf_dequant.h's decoders, inlined) and meets every x row there,
// accumulating in fp32: the same product as dequantize-then-multiply, up to the order of summation.
// stored_linear_reference is that dequantize-then-multiply (at::mm on the fp32 matrix), the simple
// reference the kernels are tested against (tests/model/test_stored_matrix.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kvlab/io/gguf.h"

namespace kvlab {

struct StoredMatrix {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  int64_t block_elems = 0, block_bytes = 0;  // weights and bytes per block; F16/BF16: blocks of 32
  at::Tensor data;                           // [rows, cols / block_elems * block_bytes] uint8

  bool defined() const { return data.defined(); }
  int64_t row_bytes() const { return cols / block_elems * block_bytes; }
  // The bytes held (what resident memory follows).
  int64_t nbytes() const { return rows * row_bytes(); }
  // Rows idx[0], idx[1], ... of this matrix (gguf_unpermute_qk's row order; embedding lookups).
  StoredMatrix take_rows(const at::Tensor& idx) const;  // idx [m] int64
  // Rows [start, start + n) as a view of the same bytes (the parts of a fused projection).
  StoredMatrix narrow_rows(int64_t start, int64_t n) const;
  // [rows, cols] float32: every block decoded (gguf_dequantize's values).
  at::Tensor dequantize() const;
};

// Whether a 2-D tensor of this type can be held as stored: the block types with a decoder and
// F16/BF16 (cols a multiple of 32), cols a whole number of blocks.
bool stored_applies(GgmlType type, int64_t cols);
// The tensor's bytes copied out of the file (the mapping may be unaligned), shape info.shape [rows, cols].
StoredMatrix stored_matrix(const GgufTensorInfo& info);
// Rows stacked: every matrix of one type and cols (wq, wk, wv into wqkv).
StoredMatrix stored_cat(const std::vector<const StoredMatrix*>& parts);

// y = x wᵀ: x [B, cols] float32 (any B >= 1) -> [B, rows] float32. Rows are split over the
// threads; each block of a row is decoded once and dotted with every row of x (16 fp32 lanes per
// dot product, then the lanes).
at::Tensor stored_linear(const at::Tensor& x, const StoredMatrix& w);
// The reference: x · dequantize(w)ᵀ by at::mm.
at::Tensor stored_linear_reference(const at::Tensor& x, const StoredMatrix& w);

}  // namespace kvlab
