// Helpers shared by the method test files: a synthetic region, a budget, and rel_err against
// exact (non-causal) attention over the region.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kvlab/attention/attention.h"
#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/io/synthetic.h"

namespace kvlab::test {

// A region of n tokens with the last n_q positions' queries (synthetic kind: random|clustered|heavy).
inline LayerKV make_kv(const std::string& kind, int64_t n, int64_t n_q, int hq = 4, int hkv = 2, int d = 16,
                       uint64_t seed = 1, at::ScalarType dt = at::kDouble) {
  SyntheticSpec spec;
  spec.kind = kind;
  spec.n_q_heads = hq;
  spec.n_kv_heads = hkv;
  spec.head_dim = d;
  spec.n_tokens = n;
  spec.n_q = n_q;
  spec.seed = seed;
  auto t = synthetic_layer(spec, 0, 0);
  LayerKV kv;
  kv.keys = t.k.to(dt);      // [Hkv, n, d]
  kv.values = t.v.to(dt);    // [Hkv, n, d]
  kv.queries = t.q.to(dt);   // [Hq, n_q, d]
  kv.query_pos = at::arange(n - n_q, n, at::kLong);
  kv.context.provide(inputs::rope_inv_freq, rope_inv_freq(10000.0, d, RopeScaling{}));  // expected_attention un-rotates with them
  return kv;
}

inline CompressOptions budget_opt(int64_t b) {
  CompressOptions o;
  o.budget = Budget::of_entries(b);
  return o;
}

// Mean over query heads and queries of ‖z − exact‖ / ‖exact‖ (non-causal: the whole region).
inline double rel_err(const LayerKV& kv, const CompressedKV& c) {
  AttentionOptions ao;
  ao.logit_scale = c.logit_scale;
  auto z = attention(kv.queries, {c.keys, c.values, c.bias, {}}, nullptr, ao);  // [Hq, nq, d]
  auto e = exact_attention(kv.queries, kv.keys, kv.values, false);             // [Hq, nq, d]
  return ((z - e).norm(2, -1) / e.norm(2, -1)).mean().item<double>();
}

}  // namespace kvlab::test
