#include "kvlab/io/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

at::Tensor randn(at::IntArrayRef size, at::Generator& gen) {
  return at::randn(size, gen, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

LayerQKV synthetic_layer(const SyntheticSpec& s, int sample, int layer) {
  KVLAB_CHECK(s.n_q_heads % s.n_kv_heads == 0, "synthetic: n_q_heads={} not a multiple of n_kv_heads={}",
              s.n_q_heads, s.n_kv_heads);
  KVLAB_CHECK(s.n_q >= 1 && s.n_q <= s.n_tokens, "synthetic: n_q={} must be in [1, n_tokens={}]", s.n_q,
              s.n_tokens);
  // Deterministic in (seed, sample, layer), independent of the order of calls.
  uint64_t seed = s.seed * 1000003ULL + static_cast<uint64_t>(sample) * 7919ULL + static_cast<uint64_t>(layer);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t hq = s.n_q_heads, hkv = s.n_kv_heads, n = s.n_tokens, d = s.head_dim, nq = s.n_q;
  LayerQKV out;
  if (s.kind == "random") {
    out.q = randn({hq, nq, d}, gen);
    out.k = randn({hkv, n, d}, gen);
    out.v = randn({hkv, n, d}, gen);
  } else if (s.kind == "clustered") {
    // Keys: centre c(i) + noise, centres random directions of norm 3; queries near centres too.
    auto centres = randn({hkv, s.n_clusters, d}, gen);
    centres = centres / centres.norm(2, -1, true) * 3.0;                     // [Hkv, C, d]
    auto assign = at::randint(s.n_clusters, {hkv, n}, gen, at::TensorOptions().dtype(at::kLong));
    auto gathered = centres.gather(1, assign.unsqueeze(-1).expand({hkv, n, d}));  // [Hkv, n, d]
    out.k = gathered + s.cluster_noise * 3.0 * randn({hkv, n, d}, gen);
    auto qassign = at::randint(s.n_clusters, {hkv, nq}, gen, at::TensorOptions().dtype(at::kLong));
    auto qc = centres.gather(1, qassign.unsqueeze(-1).expand({hkv, nq, d}));  // [Hkv, nq, d]
    const int64_t g = hq / hkv;
    out.q = (qc.unsqueeze(1).expand({hkv, g, nq, d}).reshape({hq, nq, d}) + 0.3 * randn({hq, nq, d}, gen));
    out.v = randn({hkv, n, d}, gen);
  } else if (s.kind == "heavy") {
    // A few keys point along a direction u that every query shares: they dominate attention.
    auto u = randn({hkv, 1, d}, gen);
    u = u / u.norm(2, -1, true);                                             // [Hkv, 1, d]
    out.k = 0.5 * randn({hkv, n, d}, gen);
    auto heavy = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, std::min<int64_t>(s.n_heavy, n));
    auto idx = heavy.view({1, -1, 1}).expand({hkv, heavy.size(0), d});
    out.k.scatter_add_(1, idx, (s.heavy_strength * u).expand({hkv, heavy.size(0), d}).contiguous());
    const int64_t g = hq / hkv;
    auto uq = u.unsqueeze(1).expand({hkv, g, nq, d}).reshape({hq, nq, d});
    out.q = 0.5 * randn({hq, nq, d}, gen) + s.heavy_strength * uq;
    out.v = randn({hkv, n, d}, gen);
  } else {
    KVLAB_FAIL("--kind: expected random, clustered or heavy, got '{}'", s.kind);
  }
  return out;
}

void write_synthetic_capture(const std::string& path, const SyntheticSpec& spec, const std::string& dtype) {
  CaptureMeta meta;
  meta.model_id = "synthetic";
  meta.architecture = "synthetic";
  meta.n_layers = spec.n_layers;
  meta.n_q_heads = spec.n_q_heads;
  meta.n_kv_heads = spec.n_kv_heads;
  meta.head_dim = spec.head_dim;
  meta.rope_scaling = nullptr;
  meta.dtype = dtype;
  meta.queries = spec.n_q == spec.n_tokens ? "all" : fmt::format("last:{}", spec.n_q);
  meta.source_dataset = fmt::format("synthetic:{}:seed={}", spec.kind, spec.seed);
  CaptureWriter w(path, meta);
  for (int s = 0; s < spec.n_samples; ++s) {
    auto tokens = at::arange(spec.n_tokens, at::kLong);
    w.begin_sample(fmt::format("synthetic_{}", s), tokens, spec.n_q);
    for (int l = 0; l < spec.n_layers; ++l) {
      auto t = synthetic_layer(spec, s, l);
      w.write_layer(l, t.q, t.k, t.v);
    }
    w.end_sample();
  }
  w.finish();
}

}  // namespace kvlab
