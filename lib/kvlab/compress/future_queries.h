// The prompt's queries as a model of the queries still to come (expected_attention, capkv): the
// queries past the sinks un-rotated to their pre-RoPE form, and the average RoPE rotation that moves
// a pre-RoPE statistic to the next positions (kvpress's ExpectedAttentionPress and CapPress share
// this step: `get_prerope_query_states` and the averaged rotation over n_future_positions).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "kvlab/compress/compressor.h"

namespace kvlab::detail {

// The average rotation over positions [t0, t0 + count): R̄ = mean_t (diag(cos_t) + diag(sin_t)·P),
// P x = rotate_half(x) = cat(−x₂, x₁). -> [d, d] float64; R̄ q moves a pre-RoPE q to "the future".
at::Tensor average_rope_rotation(const at::Tensor& inv_freq, int64_t t0, int64_t count);

// The method's queries at positions >= n_sink, un-rotated with the context's RoPE frequencies.
struct PreRopeQueries {
  at::Tensor q;    // [Hq, m, d] float64 on CPU, pre-RoPE
  at::Tensor pos;  // [m] int64, their absolute positions
  at::Tensor inv_freq;  // [d/2] the model's RoPE frequencies (input rope_inv_freq)
};
// Errors name `method`: no queries, no RoPE frequencies, or no query past the sinks.
PreRopeQueries pre_rope_queries(const LayerKV& kv, int64_t n_sink, const std::string& method);

}  // namespace kvlab::detail
