// One tensor of one layer (keys or values, [H, T, D]) held as transformers' QuantizedCache holds it
// (docs/quantization.md §1): the prefill quantized whole at once (attention during the prefill sees
// it in full precision); then each update returns [dequantized old part | full-precision residual |
// the new tokens], and once the residual holds residual - 1 tokens the next update quantizes that
// whole returned tensor again (the old part from its dequantized values) and empties the residual.
// With one token a step, 127 decoded tokens wait in full precision and the 128th flushes all.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "kvlab/quant/affine.h"

namespace kvlab {

class ResidualQuantized {
 public:
  ResidualQuantized(int bits, int64_t group, AffineGroups groups, int64_t residual = 128);
  // x: [H, t, D] float32, the tokens after those already held. Returns [H, T, D] float32, what
  // attention sees now (T = every token so far).
  at::Tensor update(const at::Tensor& x);
  // The quantized part (none before the first update) and the tokens waiting in full precision.
  const std::optional<AffineQuantized>& quantized() const { return q_; }
  int64_t residual_tokens() const { return residual_.defined() ? residual_.size(1) : 0; }

 private:
  int bits_;
  int64_t group_;
  AffineGroups groups_;
  int64_t residual_length_;
  std::optional<AffineQuantized> q_;
  at::Tensor residual_;  // [H, r, D], undefined when empty
};

}  // namespace kvlab
