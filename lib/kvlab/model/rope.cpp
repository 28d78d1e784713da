// A model's RoPE frequencies (the math is attention/rope.cpp), with GGUF's rope_freqs divisors.
#include "kvlab/attention/rope.h"
#include "kvlab/core/check.h"
#include "kvlab/model/model.h"

namespace kvlab {

at::Tensor rope_inv_freq(const ModelConfig& cfg, const at::Tensor& freq_factors) {
  const int64_t d = cfg.head_dim;
  at::Tensor inv_freq = rope_inv_freq(cfg.rope_theta, d, cfg.rope_scaling);  // [d/2] float32
  if (freq_factors.defined()) {
    KVLAB_CHECK(freq_factors.numel() == d / 2,
                "rope_freqs has {} entries, expected head_dim/2 = {}", freq_factors.numel(), d / 2);
    inv_freq = inv_freq / freq_factors.to(at::kFloat).cpu().reshape({d / 2});
  }
  return inv_freq;
}

}  // namespace kvlab
