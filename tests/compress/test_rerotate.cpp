// --rerotate: RoPE is a rotation, so captured post-RoPE keys can be moved to other positions
// exactly; a re-rotated replay equals attention over a cache built from pre-RoPE keys placed at
// their in-cache positions.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/replay/replay.h"
#include "test_util.h"

using namespace kvlab;

namespace {
at::Tensor rope_at(const at::Tensor& x0, const at::Tensor& pos, const at::Tensor& inv_freq) {
  // x0 [H, n, d] pre-RoPE, pos [n] -> post-RoPE at those positions (float64)
  return rotate_by(x0, pos.view({1, -1}).expand({x0.size(0), pos.size(0)}), inv_freq);
}
}  // namespace

TEST_CASE("rerotate: rotate_by inverts itself and equals RoPE applied at the new position") {
  at::manual_seed(4);
  const int64_t h = 2, n = 40, d = 16;
  auto inv_freq = rope_inv_freq(10000.0, d, RopeScaling{});
  auto k0 = at::randn({h, n, d}, at::kDouble);
  auto pos = at::arange(n, at::kLong);
  // rotate_by at integer positions equals the forward pass's rope (rope_cos_sin + apply_rope).
  auto [cos, sin] = rope_cos_sin(inv_freq, 0, n, at::kDouble);
  auto post = apply_rope(k0, cos, sin);                                            // [H, n, d]
  CHECK(test::max_rel_diff(rope_at(k0, pos, inv_freq), post, 1e-9) < 1e-10);
  // un-rotate ∘ rotate is the identity (float32 too, to 1e-6).
  auto delta = at::randint(-500, 500, {h, n}, at::kLong);
  CHECK((rotate_by(rotate_by(post, delta, inv_freq), -delta, inv_freq) - post).abs().max().item<double>() < 1e-12);
  auto post32 = post.to(at::kFloat);
  CHECK((rotate_by(rotate_by(post32, delta, inv_freq), -delta, inv_freq) - post32).abs().max().item<double>() < 1e-6);
  // Moving post-RoPE keys from p to c equals building them from pre-RoPE keys at c.
  auto c = at::randint(0, 1000, {n}, at::kLong);
  auto moved = rotate_by(post, (c - pos).view({1, n}).expand({h, n}), inv_freq);
  CHECK(test::max_rel_diff(moved, rope_at(k0, c, inv_freq), 1e-9) < 1e-9);
}

TEST_CASE("rerotate: replay equals attention over pre-RoPE keys placed at their cache positions") {
  at::manual_seed(8);
  const int64_t hq = 4, hkv = 2, g = 2, n = 120, d = 16, n_eval = 10, n_obs = 10;
  const int64_t keep_first = 4, budget = 30;
  auto inv_freq = rope_inv_freq(10000.0, d, RopeScaling{});
  auto q0 = at::randn({hq, n, d}, at::kDouble), k0 = at::randn({hkv, n, d}, at::kDouble);
  auto v = at::randn({hkv, n, d}, at::kDouble);
  auto pos = at::arange(n, at::kLong);
  auto q = rope_at(q0, pos, inv_freq), k = rope_at(k0, pos, inv_freq);           // post-RoPE
  ReplayProtocol p;
  p.keep_first = keep_first;
  p.eval_queries = "last:" + std::to_string(n_eval);
  p.obs_queries = n_obs;
  p.rerotate = true;
  auto u = make_unit(q.narrow(1, n - n_eval - n_obs, n_eval + n_obs), k, v, p);
  u.inv_freq = inv_freq;
  auto c = make_compressor("h2o", {});  // keeps a different set per head
  auto out = replay_attend(u, *c, Budget::of_entries(budget), 1, p);
  const int64_t rb = out.region_begin, re = out.region_end, tail = n - re;
  REQUIRE(tail == n_eval);
  // Direct: per KV head, the cache is [sinks | kept region tokens in order | tail] at positions
  // 0, 1, 2, ...; a query sits at its cache position; all built from pre-RoPE q0/k0.
  for (int64_t hk = 0; hk < hkv; ++hk) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < rb; ++i) order.push_back(i);
    std::vector<int64_t> kept;
    for (int64_t j = 0; j < out.region.kept_idx.size(1); ++j)
      if (out.region.kept_idx[hk][j].item<int64_t>() >= 0) kept.push_back(rb + out.region.kept_idx[hk][j].item<int64_t>());
    std::sort(kept.begin(), kept.end());
    REQUIRE(static_cast<int64_t>(kept.size()) == budget);
    order.insert(order.end(), kept.begin(), kept.end());
    for (int64_t i = re; i < n; ++i) order.push_back(i);
    const int64_t m = static_cast<int64_t>(order.size()), shift = n - m;
    auto idx = at::tensor(order);
    auto kc = rope_at(k0[hk].index_select(0, idx).unsqueeze(0), at::arange(m, at::kLong), inv_freq)[0];  // [m, d]
    auto vc = v[hk].index_select(0, idx);
    for (int64_t r = 0; r < g; ++r) {
      const int64_t hh = hk * g + r;
      for (int64_t j = 0; j < n_eval; ++j) {
        const int64_t P = n - n_eval + j, cq = P - shift;  // the query's cache position
        auto qc = rope_at(q0[hh].narrow(0, P, 1).unsqueeze(0), at::tensor(std::vector<int64_t>{cq}), inv_freq)[0][0];
        auto logits = at::matmul(kc.narrow(0, 0, cq + 1), qc) / std::sqrt(double(d));
        auto z = at::matmul(at::softmax(logits, 0), vc.narrow(0, 0, cq + 1));
        CHECK(test::max_rel_diff(out.z[hh][j].to(at::kDouble), z, 1e-9) < 1e-6);
      }
    }
  }
  // Without --rerotate the same cache differs (the keys keep their original positions).
  p.rerotate = false;
  auto plain = replay_attend(u, *c, Budget::of_entries(budget), 1, p);
  CHECK((plain.z - out.z).abs().max().item<double>() > 1e-3);
  // Merging methods have no position to re-rotate to: one clear error.
  p.rerotate = true;
  CHECK_THROWS_WITH_AS(replay_attend(u, *make_compressor("chelsea", {}), Budget::of_entries(budget), 1, p),
                       doctest::Contains("--rerotate: chelsea merges"), Error);
}
