// BalanceKV's practical parallel halving (balancekv.cpp), exposed piece by piece so the tests can
// check each piece against a naive reference. See balancekv.cpp for the paper and deviations.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace kvlab::balancekv {

// The release's keep rule for one round over m signs (±1): exactly ⌊m/2⌋ positions, ascending,
// each with its round weight (2 or 1).
//   c± = first index where the running count of ±1 reaches ⌊m/2⌋ (0 if it never does, as
//   torch.argmax of an all-false mask gives); c = max(c−, c+). Weights: at or before c, the sign
//   opposite to sign[c] gets 2 and sign[c]'s gets −2; after c every token gets 1. Keep the first
//   ⌊m/2⌋ by descending weight (stable). If both signs reach ⌊m/2⌋ this keeps the first ⌊m/2⌋
//   of the sign that got there first (×2); otherwise all of the minority sign before c (×2),
//   then the tokens after c in order (×1).
struct KeepRule {
  std::vector<int64_t> keep;  // [⌊m/2⌋] positions in 0..m-1, ascending
  std::vector<int> weight;    // [⌊m/2⌋] 2 or 1
};
KeepRule keep_rule(const std::vector<int>& signs);

// Kernel of one round, per block:
//   K_ij = exp(temp·⟨k̄_i, k̄_j⟩/√d) · (⟨ṽ_i, ṽ_j⟩ + 1e-8 + value_offset),
// k̄ = key minus the block mean (zero padding included in the mean, as in the release).
// keys [B, b, d], values_w [B, b, dv] (values × accumulated weight, padding 0) -> [B, b, b]
at::Tensor round_kernel(const at::Tensor& keys, const at::Tensor& values_w, double temp,
                        double value_offset);

// Sequential signs of the self-balancing walk, per block: s_0 = +1; for i >= 1
//   p_i = 0.5 − gamma · Σ_{j<i} K_ij s_j  (unclamped),  s_i = +1 iff u_i < p_i.
// kernel [B, b, b], u [B, b] uniforms in [0, 1) -> int8 [B, b] of ±1
at::Tensor walk_signs(const at::Tensor& kernel, const at::Tensor& u, double gamma);

struct HalvingOptions {
  int halvings = 2;           // T
  int64_t block = 256;        // b
  double temp = 0.1;
  double gamma = 4.0;
  double value_offset = 0.025;
};

struct HalvingResult {
  at::Tensor idx;     // [n_kv_heads, m] int64 kept positions into the region, ascending
  at::Tensor weight;  // [n_kv_heads, m] float64 accumulated weight (product over rounds)
  int rounds = 0;     // halvings actually done (stops early when one token is left)
  std::vector<at::Tensor> round_idx;     // per round r: [n_kv_heads, m_r] survivors after round r
  std::vector<at::Tensor> round_weight;  // per round r: [n_kv_heads, m_r] that round's weight (1|2)
};

// T rounds over keys, values [n_kv_heads, n, d]; uniforms from `gen`: one
// at::rand({n_kv_heads·blocks, b}, gen, options) per round done, options = the kernel's.
HalvingResult halve(const at::Tensor& keys, const at::Tensor& values, const HalvingOptions& opt,
                    at::Generator& gen);

// The uniforms of round `round` (0-based): a tensor of `shape` = [n_kv_heads·blocks, b] in [0, 1),
// row h·blocks + blk, column = position in the block (column 0 is drawn but unused). `options`
// are the kernel's (dtype of the inputs, CPU); another floating dtype is converted.
using UniformSource = std::function<at::Tensor(int round, at::IntArrayRef shape,
                                               const at::TensorOptions& options)>;

// The same rounds with the uniforms from `uniforms`, called once per round done, in order (the
// seam the golden test uses to feed the reference's numbers). halve(…, gen) is this with
// at::rand(shape, gen, options).
HalvingResult halve(const at::Tensor& keys, const at::Tensor& values, const HalvingOptions& opt,
                    const UniformSource& uniforms);

}  // namespace kvlab::balancekv
