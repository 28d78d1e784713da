#include "kvlab/quant/residual_cache.h"

#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {

ResidualQuantized::ResidualQuantized(int bits, int64_t group, AffineGroups groups, int64_t residual)
    : bits_(bits), group_(group), groups_(groups), residual_length_(residual) {
  KVLAB_CHECK(residual >= 1, "quantized cache: residual length must be >= 1, got {}", residual);
}

at::Tensor ResidualQuantized::update(const at::Tensor& x) {
  KVLAB_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "quantized cache: [H, t, D] float32 expected");
  if (!q_) {  // the prefill: quantized as it came, returned as it came
    q_ = affine_quantize(x.contiguous(), bits_, group_, groups_);
    return x;
  }
  std::vector<at::Tensor> parts = {affine_dequantize(*q_)};
  if (residual_.defined()) parts.push_back(residual_);
  parts.push_back(x);
  const at::Tensor full = at::cat(parts, 1);
  // transformers' rule (cache_utils.py:548): not while the residual is empty; then at r + 1 >= R.
  if (residual_.defined() && residual_.size(1) + 1 >= residual_length_) {
    q_ = affine_quantize(full.contiguous(), bits_, group_, groups_);
    residual_ = at::Tensor();
  } else {
    residual_ = residual_.defined() ? at::cat({residual_, x}, 1) : x.clone();
  }
  return full;
}

}  // namespace kvlab
