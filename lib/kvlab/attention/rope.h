// Rotary position embeddings in the Hugging Face rotate-half layout (the first head_dim/2 lanes
// pair with the last head_dim/2), with the float32 operations transformers uses
// (modeling_rope_utils.py), so post-RoPE q/k match it to float rounding. Shared by the forward
// pass (model/) and replay's --rerotate, which moves captured post-RoPE keys to other positions:
// RoPE is a rotation, so rotating by δ = new − old position is exact.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace kvlab {

// RoPE frequency scaling. kind: "none", "linear" (inv_freq / factor) or "llama3" (Llama 3.1's
// piecewise rule over wavelengths, HF `_compute_llama3_parameters`).
struct RopeScaling {
  std::string kind = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;                       // llama3 only
  double high_freq_factor = 4.0;                      // llama3 only
  int64_t original_max_position_embeddings = 8192;    // llama3 only
  nlohmann::json to_json() const;  // null for "none"; the HF object otherwise
};

// The HF `rope_scaling` object (null, {"rope_type"|"type": "default"|"linear"|"llama3", ...}), as in
// config.json and as RopeScaling::to_json writes it into captures; errors name `source`.
RopeScaling rope_scaling_from_json(const nlohmann::json& j, const std::string& source);

// inv_freq [head_dim / 2] float32: 1 / theta^(2i/d), scaling applied.
at::Tensor rope_inv_freq(double theta, int64_t head_dim, const RopeScaling& scaling);

// cos, sin [T, head_dim] for positions pos0 .. pos0+T-1, float32 (float64 when dtype is double),
// then converted to `dtype`.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t pos0, int64_t T,
                                               at::ScalarType dtype);
// x [H, T, head_dim] -> x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Rotates each row by its own number of positions: x [H, n, head_dim] post-RoPE at some positions,
// delta [H, n] int64 -> x as if it sat `delta` positions later (negative: earlier), computed in
// float64 and returned in x's dtype. rotate_by(rotate_by(x, δ), −δ) = x.
at::Tensor rotate_by(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& inv_freq);

}  // namespace kvlab
