// Rotary position embeddings in the Hugging Face rotate-half layout (the first head_dim/2 lanes
// pair with the last head_dim/2), with the same float32 operations transformers uses
// (modeling_rope_utils.py) so post-RoPE q/k match it to float rounding.
#include "kvlab/core/check.h"
#include "kvlab/model/model.h"

#include <cmath>

namespace kvlab {

namespace {

// HF _compute_llama3_parameters, op for op in float32.
at::Tensor llama3_scale(const at::Tensor& inv_freq, const RopeScaling& rs) {
  const double factor = rs.factor;
  const double low = rs.low_freq_factor, high = rs.high_freq_factor;
  const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
  const double low_freq_wavelen = old_ctx / low;
  const double high_freq_wavelen = old_ctx / high;
  at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);             // [d/2]
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  at::Tensor smooth = ((wavelen.reciprocal() * old_ctx) - low) / (high - low);
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(is_medium, smoothed, scaled);
}

}  // namespace

at::Tensor rope_inv_freq(const ModelConfig& cfg, const at::Tensor& freq_factors) {
  const int64_t d = cfg.head_dim;
  // 1 / theta^(arange(0, d, 2) / d), as HF: int64 arange -> float32, pow with a scalar base.
  at::Tensor exponent = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv_freq = at::pow(cfg.rope_theta, exponent).reciprocal();  // [d/2] float32
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.kind == "linear") {
    inv_freq = inv_freq / rs.factor;
  } else if (rs.kind == "llama3") {
    inv_freq = llama3_scale(inv_freq, rs);
  } else {
    TORCH_INTERNAL_ASSERT(rs.kind == "none", "unknown rope scaling ", rs.kind);
  }
  if (freq_factors.defined()) {
    KVLAB_CHECK(freq_factors.numel() == d / 2,
                "rope_freqs has {} entries, expected head_dim/2 = {}", freq_factors.numel(), d / 2);
    inv_freq = inv_freq / freq_factors.to(at::kFloat).cpu().reshape({d / 2});
  }
  return inv_freq;
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t pos0, int64_t T,
                                               at::ScalarType dtype) {
  const at::ScalarType work = dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor pos = at::arange(pos0, pos0 + T, inv_freq.options().dtype(at::kLong)).to(work);  // [T]
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq.to(work).unsqueeze(0);  // [T, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, 1);                           // [T, d]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x [H, T, d]; cos, sin [T, d] broadcast over heads.
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);     // [H, T, d/2]
  at::Tensor x2 = x.narrow(-1, half, half);  // [H, T, d/2]
  at::Tensor rotated = at::cat({x2.neg(), x1}, -1);  // [H, T, d]
  return x * cos + rotated * sin;
}

}  // namespace kvlab
