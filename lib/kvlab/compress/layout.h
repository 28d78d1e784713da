// The layout every compressed cache has, in replay and in generation alike:
//
//   [0, begin)        exact (sinks, --keep-first; bias 0)
//   [begin, end)      the compressible region, handed to a method as a LayerKV
//   [end, n)          exact (the tail, --keep-last; in generation also every token decoded since)
//
// region_of builds the LayerKV a method compresses (with the observation queries it may score
// with and the exact keys around the region, for the softmax of its scores); assemble puts the
// method's output back between the exact parts as one attention set. Replay and generation both
// call these two, so a method sees exactly the same input in both.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kvlab/attention/attention.h"
#include "kvlab/compress/compressor.h"

namespace kvlab {

// k, v [Hkv, n, d] at positions 0..n-1; q_obs [Hq, n_obs, d] at positions obs_pos [n_obs] (both
// undefined, or n_obs = 0: no queries). -> the region [begin, end) with prefix/suffix keys.
LayerKV region_of(const at::Tensor& k, const at::Tensor& v, int64_t begin, int64_t end, const at::Tensor& q_obs,
                  const at::Tensor& obs_pos, int layer, int n_layers);

// [exact k/v of [0, begin) | compressed (ck, cv, cbias) | exact k/v of [end, n)] as one set
// (keys [Hkv, begin + m + n - end, d]); compressed entries precede every later query, so their
// position is -1 (always visible); cv undefined = a denominator set (no values).
KVSet assemble(const at::Tensor& k, const at::Tensor& v, int64_t begin, int64_t end, const at::Tensor& ck,
               const at::Tensor& cv, const at::Tensor& cbias);

}  // namespace kvlab
