// DuoAttention's head scores (kvpress's on-the-fly variant), shared by the compressor
// (duo_attention.cpp) and `kvlab calibrate duo`, which makes them from calibration text.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace kvlab {

// One calibration window's score of every KV head of one layer, as kvpress 0.5.5's
// duo_attention_on_the_fly: the mean pre-RoPE query q̄ and key k̄ of each head over the window,
// each repeated `q_len` times and rotated to positions 0 .. q_len-1; the attention of the last of
// those queries over the q_len keys; the score is the area under its cumulated curve,
// mean_j Σ_{i<=j} a_i (near 1: the attention sits on the first positions, near 0: on the last),
// averaged over the KV group's query heads. Low = a streaming head.
//   q [Hq, T, d], k [Hkv, T, d] post-RoPE at positions 0 .. T-1 (a prefill's tap); inv_freq the
//   layer's RoPE frequencies [d / 2] -> [Hkv] float64.
at::Tensor duo_head_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& inv_freq, int64_t q_len = 500);

// The scores of a `kvlab calibrate duo` file: [L, Hkv] float64, NaN rows for layers it left out
// (sliding window layers). Errors name `param` (the method's parameter) and the file.
at::Tensor read_duo_head_scores(const std::string& path, const std::string& param);

}  // namespace kvlab
