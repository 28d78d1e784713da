// The exact KV cache and causal GQA attention of the forward pass (query blocks, key tiles).
#include "kvlab/attention/exact_cache.h"

#include "kvlab/attention/blocked_attention.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>

#include "kvlab/core/check.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace kvlab {

namespace {

// Query blocks in the order 0, N-1, 1, N-2, …: block b reads pos0 + (b+1)·query_block keys, so
// each consecutive pair carries the same work and at::parallel_for's contiguous chunks balance.
std::vector<int64_t> zigzag(int64_t n_blocks) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n_blocks));
  for (int64_t lo = 0, hi = n_blocks - 1; lo <= hi; ++lo, --hi) {
    order.push_back(lo);
    if (lo != hi) order.push_back(hi);
  }
  return order;
}

}  // namespace

// at::parallel_for must run on ATen's own OpenMP runtime: this file is compiled with OpenMP, and
// the libgomp it calls must be LibTorch's (a LibTorch that bundles its own copy, as PyPI's does,
// would not see our parallel region, and every ATen op inside would start a team of its own).
bool causal_attention_parallel() {
#ifdef _OPENMP
  static const bool ok = [] {
    std::atomic<bool> seen{true};
#pragma omp parallel num_threads(2)
    if (!at::in_parallel_region()) seen = false;
    return seen.load();
  }();
  return ok;
#else
  return false;
#endif
}

at::Tensor causal_gqa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t pos0, int64_t query_block, int64_t window) {
  TORCH_INTERNAL_ASSERT(q.dim() == 3 && k.dim() == 3 && v.dim() == 3);
  const int64_t n_q_heads = q.size(0), T = q.size(1);
  const int64_t n_kv_heads = k.size(0), n = k.size(1);
  TORCH_INTERNAL_ASSERT(n_q_heads % n_kv_heads == 0 && n >= pos0 + T, "n_q_heads=", n_q_heads,
                        " n_kv_heads=", n_kv_heads, " n=", n, " pos0=", pos0, " T=", T);
  if (query_block <= 0) query_block = T;
  const int64_t g = n_q_heads / n_kv_heads;
  const at::Tensor pos = at::arange(pos0 + T, q.options().dtype(at::kLong));  // [pos0+T] key positions
  at::Tensor out = at::empty({n_q_heads, T, v.size(2)}, q.options());       // [Hq, T, dv]
  // One work item: the g query heads of KV head h over query block b, against the keys the block
  // can see, with key tiles and an online softmax (blocked_attention.h): only the last tile or two
  // is masked, and no [rows, nk] score matrix is ever materialised.
  auto attend_block = [&](int64_t h, int64_t h_count, int64_t b) {
    const int64_t b0 = b * query_block, bl = std::min(query_block, T - b0);
    const int64_t nk = pos0 + b0 + bl;  // keys visible to the last query of the block
    // The oldest key the block's first query still sees under a sliding window.
    const int64_t k0 = window > 0 ? std::max<int64_t>(0, pos0 + b0 - window + 1) : 0;
    KVSet set{k.narrow(0, h, h_count).narrow(1, k0, nk - k0),
              v.narrow(0, h, h_count).narrow(1, k0, nk - k0), {}, pos.narrow(0, k0, nk - k0)};
    AttentionOptions opt;
    opt.query_pos = pos.narrow(0, pos0 + b0, bl);  // [bl]
    opt.window = window;
    out.narrow(0, h * g, h_count * g)
        .narrow(1, b0, bl)
        .copy_(attention_blocked(q.narrow(0, h * g, h_count * g).narrow(1, b0, bl), set, nullptr, opt));
  };
  const int64_t n_blocks = (T + query_block - 1) / query_block;
  if (!q.is_cpu() || n_blocks == 1 || at::get_num_threads() == 1 || !causal_attention_parallel()) {
    // Decoding, one thread, or a GPU: each block once over all heads; ATen's ops thread inside.
    for (int64_t b = 0; b < n_blocks; ++b) attend_block(0, n_kv_heads, b);
    return out;
  }
  // Prefill on CPU: the (KV head, query block) items run in parallel, each on one thread (ATen
  // ops and OpenBLAS's OpenMP build run serially inside a parallel region). Parallelising inside
  // each item's small tiles instead barely scaled (bench prefill at 8192 tokens, issue 13).
  const std::vector<int64_t> order = zigzag(n_blocks);
  const at::ThreadLocalState caller;  // inference / grad mode, which are per thread
  at::parallel_for(0, n_blocks * n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard same_modes(caller);
    for (int64_t i = begin; i < end; ++i) attend_block(i % n_kv_heads, 1, order[i / n_kv_heads]);
  });
  return out;
}

ExactAttention::ExactAttention(int64_t n_layers, int64_t query_block)
    : cache_(static_cast<size_t>(n_layers)), query_block_(query_block) {}

at::Tensor ExactAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                  const at::Tensor& v_new, int64_t pos0, int64_t window) {
  TORCH_INTERNAL_ASSERT(layer >= 0 && layer < static_cast<int>(cache_.size()));
  LayerCache& c = cache_[layer];
  KVLAB_CHECK(pos0 == c.n, "ExactAttention: layer {} holds {} positions but the forward starts at "
              "position {} (reset() before a new sequence)", layer, c.n, pos0);
  const int64_t T = k_new.size(1);
  const int64_t need = c.n + T;
  if (!c.k.defined() || c.k.size(1) < need) {
    int64_t cap = c.k.defined() ? c.k.size(1) : 0;
    cap = std::max<int64_t>(need, std::max<int64_t>(2 * cap, 64));
    // [Hkv, cap, d]
    at::Tensor k2 = at::empty({k_new.size(0), cap, k_new.size(2)}, k_new.options());
    at::Tensor v2 = at::empty({v_new.size(0), cap, v_new.size(2)}, v_new.options());
    if (c.n > 0) {
      k2.narrow(1, 0, c.n).copy_(c.k.narrow(1, 0, c.n));
      v2.narrow(1, 0, c.n).copy_(c.v.narrow(1, 0, c.n));
    }
    c.k = k2;
    c.v = v2;
  }
  c.k.narrow(1, c.n, T).copy_(k_new);
  c.v.narrow(1, c.n, T).copy_(v_new);
  c.n = need;
  return causal_gqa_attention(q, c.k.narrow(1, 0, c.n), c.v.narrow(1, 0, c.n), pos0, query_block_,
                              window);
}

void ExactAttention::reset() {
  for (auto& c : cache_) c = LayerCache{};
}

int64_t ExactAttention::n_cached(int layer) const { return cache_.at(layer).n; }
at::Tensor ExactAttention::keys(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.k.narrow(1, 0, c.n) : at::Tensor();
}
at::Tensor ExactAttention::values(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.v.narrow(1, 0, c.n) : at::Tensor();
}

}  // namespace kvlab
