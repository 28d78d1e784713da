// Synthetic captures so tests and benchmarks never need a model.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "kvlab/io/capture.h"

namespace kvlab {

struct SyntheticSpec {
  std::string kind = "random";  // "random" | "clustered" | "heavy"
  int n_layers = 2;
  int n_q_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 16;
  int64_t n_tokens = 128;
  int64_t n_q = 32;           // captured trailing queries
  int n_samples = 1;
  int n_clusters = 8;         // clustered: keys are centre + small noise
  double cluster_noise = 0.05;
  int n_heavy = 4;            // heavy: a few keys every query aligns with
  double heavy_strength = 6.0;  // at 4 the heavy keys hold only ~20% of the mass at n = 1000
  uint64_t seed = 0;
};

// One layer's tensors for a sample, deterministic in (spec.seed, sample, layer):
//   q [n_q_heads, n_q, head_dim], k, v [n_kv_heads, n_tokens, head_dim], float32.
//   random:    q, k, v ~ N(0, 1)
//   clustered: keys (and queries) near n_clusters random unit directions × 3, values random
//   heavy:     n_heavy keys at random positions share a direction every query points along
LayerQKV synthetic_layer(const SyntheticSpec& spec, int sample, int layer);

// Writes a complete capture file with every layer of every sample.
void write_synthetic_capture(const std::string& path, const SyntheticSpec& spec,
                             const std::string& dtype = "float32");

}  // namespace kvlab
