// Exact attention against a naive double-precision loop (odd sizes, GQA 1/2/4, causal offset,
// bias, separate denominator set).
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/attention/attention.h"
#include "kvlab/attention/blocked_attention.h"
#include "kvlab/attention/decode_attention.h"
#include "test_util.h"

using namespace kvlab;

namespace {

// The naive reference: loops over every (query head, query, key) in double.
// num/den bias and positions as in KVSet; den_keys empty -> same as numerator.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& bias, const at::Tensor& kpos, const at::Tensor& qpos,
                           const at::Tensor& dk, const at::Tensor& dbias, const at::Tensor& dpos) {
  auto qa = q.to(at::kDouble).contiguous(), ka = k.to(at::kDouble).contiguous(), va = v.to(at::kDouble).contiguous();
  const int64_t hq = q.size(0), nq = q.size(1), d = q.size(2), hkv = k.size(0), n = k.size(1), dv = v.size(2);
  const int64_t g = hq / hkv;
  auto out = at::zeros({hq, nq, dv}, at::kDouble);
  auto Q = qa.accessor<double, 3>();
  auto K = ka.accessor<double, 3>();
  auto V = va.accessor<double, 3>();
  auto O = out.accessor<double, 3>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto bias_at = [](const at::Tensor& b, int64_t h, int64_t i) {
    return b.defined() ? b.index({h, i}).item<double>() : 0.0;
  };
  for (int64_t h = 0; h < hq; ++h) {
    int64_t kvh = h / g;
    for (int64_t j = 0; j < nq; ++j) {
      int64_t qp = qpos.defined() ? qpos[j].item<int64_t>() : INT64_MAX;
      std::vector<double> s(n), w(n);
      double mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += Q[h][j][c] * K[kvh][i][c];
        bool visible = !kpos.defined() || kpos[i].item<int64_t>() <= qp;
        s[i] = visible ? dot * scale + bias_at(bias, kvh, i) : -INFINITY;
        mx = std::max(mx, s[i]);
      }
      double den = 0;
      if (!dk.defined()) {
        for (int64_t i = 0; i < n; ++i) den += std::exp(s[i] - mx);
      } else {
        auto dka = dk.to(at::kDouble).contiguous();
        auto DK = dka.accessor<double, 3>();
        for (int64_t i = 0; i < dk.size(1); ++i) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += Q[h][j][c] * DK[kvh][i][c];
          bool visible = !dpos.defined() || dpos[i].item<int64_t>() <= qp;
          if (visible) den += std::exp(dot * scale + bias_at(dbias, kvh, i) - mx);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        double p = std::exp(s[i] - mx) / den;
        for (int64_t c = 0; c < dv; ++c) O[h][j][c] += p * V[kvh][i][c];
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("exact attention matches a naive loop: odd sizes, GQA, causal offset") {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int group : {1, 2, 4}) {
      const int64_t hkv = 2, hq = hkv * group, n = 127, nq = 9, d = 65;
      at::manual_seed(group);
      auto q = at::randn({hq, nq, d}, at::TensorOptions().dtype(dtype));
      auto k = at::randn({hkv, n, d}, at::TensorOptions().dtype(dtype));
      auto v = at::randn({hkv, n, d}, at::TensorOptions().dtype(dtype));
      auto z = exact_attention(q, k, v, /*causal=*/true);
      auto ref = naive_attention(q, k, v, {}, at::arange(n), at::arange(n - nq, n), {}, {}, {});
      // Relative difference per element, with values below 1e-2 compared on that scale (outputs
      // are O(0.1..1); float32 round-off over 127 keys is ~1e-6 absolute).
      double tol = dtype == at::kDouble ? 1e-6 : 1e-4;
      double err = test::max_rel_diff(z, ref, dtype == at::kDouble ? 1e-3 : 1e-2);
      INFO("dtype=" << std::string(c10::toString(dtype)) << " group=" << group << " max rel diff=" << err);
      CHECK(err <= tol);
      CHECK((z.scalar_type() == dtype));
      // The causal mask matters: without it the answer differs.
      auto full = exact_attention(q, k, v, /*causal=*/false);
      CHECK(test::max_rel_diff(full, ref, 1e-3) > 1e-2);
    }
  }
}

TEST_CASE("attention with bias, per-head padding and a separate denominator set") {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    const int64_t hkv = 3, hq = 6, n = 33, nq = 5, d = 17, nd = 21;
    at::manual_seed(7);
    auto opt = at::TensorOptions().dtype(dtype);
    auto q = at::randn({hq, nq, d}, opt), k = at::randn({hkv, n, d}, opt), v = at::randn({hkv, n, d}, opt);
    auto bias = at::rand({hkv, n}, opt) * 2;
    bias.index_put_({1, 3}, -INFINITY);  // padding entry in head 1
    auto dk = at::randn({hkv, nd, d}, opt);
    auto dbias = at::rand({hkv, nd}, opt);
    auto qpos = at::arange(100, 100 + nq);
    auto kpos = at::arange(n) * 4;        // some keys lie after some queries
    auto dpos = at::arange(nd) * 5;
    double tol = dtype == at::kDouble ? 1e-6 : 1e-4;
    double floor = dtype == at::kDouble ? 1e-3 : 1e-2;

    AttentionOptions o;
    o.query_pos = qpos;
    KVSet num{k, v, bias, kpos};
    auto z = attention(q, num, nullptr, o);
    auto ref = naive_attention(q, k, v, bias, kpos, qpos, {}, {}, {});
    CHECK(test::max_rel_diff(z, ref, floor) <= tol);

    KVSet den{dk, {}, dbias, dpos};
    auto z2 = attention(q, num, &den, o);
    auto ref2 = naive_attention(q, k, v, bias, kpos, qpos, dk, dbias, dpos);
    INFO("dtype=" << std::string(c10::toString(dtype)) << " max rel diff=" << test::max_rel_diff(z2, ref2, floor));
    CHECK(test::max_rel_diff(z2, ref2, floor) <= tol);
  }
}

TEST_CASE("blocked attention equals the naive loop and the reference for any tile size") {
  // The fast path (key tiles, online softmax) against the naive loop and attention_reference():
  // tiles smaller than n, not dividing n, of one key, and larger than n; keys after some queries
  // (the first tiles fully visible, later ones masked, one tile fully masked); -inf padding; a
  // separate denominator set; per-head positions; logit scaling.
  for (auto dtype : {at::kDouble, at::kFloat}) {
    const int64_t hkv = 3, hq = 9, n = 70, nq = 6, d = 16, nd = 23;
    at::manual_seed(11);
    auto opt = at::TensorOptions().dtype(dtype);
    auto q = at::randn({hq, nq, d}, opt), k = at::randn({hkv, n, d}, opt), v = at::randn({hkv, n, d}, opt);
    auto bias = at::rand({hkv, n}, opt);
    bias.index_put_({2, at::indexing::Slice(0, 9)}, -INFINITY);  // head 2: a whole tile of padding
    auto dk = at::randn({hkv, nd, d}, opt);
    auto dbias = at::rand({hkv, nd}, opt);
    auto qpos = at::arange(40, 40 + nq);
    auto kpos = at::arange(n);  // keys 46..69 lie after every query
    auto dpos = at::arange(nd) * 3;
    const double tol = dtype == at::kDouble ? 1e-9 : 2e-4;  // float: q pre-scaled, scores up to ~10
    const double floor = dtype == at::kDouble ? 1e-3 : 1e-2;
    AttentionOptions o;
    o.query_pos = qpos;
    KVSet num{k, v, bias, kpos}, den{dk, {}, dbias, dpos};
    auto naive = naive_attention(q, k, v, bias, kpos, qpos, {}, {}, {});
    auto naive_den = naive_attention(q, k, v, bias, kpos, qpos, dk, dbias, dpos);
    for (int64_t block : {1, 7, 16, 64, 1000}) {
      INFO("dtype=" << std::string(c10::toString(dtype)) << " block=" << block);
      CHECK(test::max_rel_diff(attention_blocked(q, num, nullptr, o, block), naive, floor) <= tol);
      CHECK(test::max_rel_diff(attention_blocked(q, num, &den, o, block), naive_den, floor) <= tol);
      // Per-head positions and logit scaling: against the reference (the naive loop has neither).
      KVSet per_head{k, v, bias, at::stack({kpos, kpos + 3, kpos - 50})};
      AttentionOptions o2 = o;
      o2.logit_scale = 1.7;
      auto ref = attention_reference(q, per_head, &den, o2);
      CHECK(test::max_rel_diff(attention_blocked(q, per_head, &den, o2, block), ref, floor) <= tol);
      CHECK(test::max_rel_diff(attention_blocked(q, per_head, nullptr, o2, block),
                               attention_reference(q, per_head, nullptr, o2), floor) <= tol);
    }
    // The check can fail: the mask matters across tiles.
    AttentionOptions unmasked;
    CHECK(test::max_rel_diff(attention_blocked(q, num, nullptr, unmasked, 16), naive, floor) > 1e-2);
  }
}

TEST_CASE("a bias of log w equals w copies of the entry") {
  const int64_t hkv = 1, hq = 2, n = 10, d = 8;
  at::manual_seed(3);
  auto q = at::randn({hq, 4, d}, at::kDouble), k = at::randn({hkv, n, d}, at::kDouble), v = at::randn({hkv, n, d}, at::kDouble);
  // Entry 0 repeated 3 times vs entry 0 once with bias log 3.
  auto k_rep = at::cat({k.narrow(1, 0, 1).repeat({1, 3, 1}), k.narrow(1, 1, n - 1)}, 1);
  auto v_rep = at::cat({v.narrow(1, 0, 1).repeat({1, 3, 1}), v.narrow(1, 1, n - 1)}, 1);
  auto bias = at::zeros({hkv, n}, at::kDouble);
  bias.index_put_({0, 0}, std::log(3.0));
  auto a = attention(q, KVSet{k_rep, v_rep, {}, {}});
  auto b = attention(q, KVSet{k, v, bias, {}});
  CHECK(test::max_rel_diff(a, b, 1e-6) < 1e-10);
}

TEST_CASE("exact attention probabilities sum to one and respect causality") {
  at::manual_seed(1);
  auto q = at::randn({4, 6, 16}), k = at::randn({2, 20, 16});
  auto p = exact_attention_probs(q, k, true);  // [4, 6, 20]
  CHECK(at::allclose(p.sum(-1), at::ones({4, 6}), 1e-5, 1e-5));
  // query 0 sits at position 14: keys 15..19 get nothing.
  CHECK(p.index({at::indexing::Slice(), 0, at::indexing::Slice(15, 20)}).abs().max().item<float>() == 0);
}

TEST_CASE("one-query attention (the decode path) equals the blocked attention: bias, padding, positions, window, views") {
  // issue 25: attention() takes attention_one_query for one query position on the CPU in float32.
  at::manual_seed(11);
  const int64_t h_kv = 3, g = 3, d = 16, n = 37;
  for (int variant = 0; variant < 6; ++variant) {
    CAPTURE(variant);
    // The keys/values as views into larger buffers (the compressed cache's room), as in decoding.
    at::Tensor kbuf = at::randn({h_kv, 64, d}), vbuf = at::randn({h_kv, 64, d});
    KVSet s;
    s.keys = kbuf.narrow(1, 0, n);
    s.values = vbuf.narrow(1, 0, n);
    at::Tensor q = at::randn({h_kv * g, 1, d});
    AttentionOptions o;
    if (variant >= 1) {
      s.bias = at::randn({h_kv, n}) * 0.5;
      s.bias.select(0, 1).narrow(0, 5, 4).fill_(-std::numeric_limits<double>::infinity());  // head 1's padding
    }
    if (variant >= 2) {
      s.pos = at::arange(n, at::kLong).unsqueeze(0).expand({h_kv, n}).contiguous();
      s.pos.select(1, 3).fill_(-1);  // a merged entry
      o.query_pos = at::full({1}, n - 1, at::kLong);
    }
    if (variant == 3) o.query_pos = at::full({1}, n - 10, at::kLong);  // later keys masked
    if (variant == 4) o.window = 8;                                    // sliding window
    if (variant == 5) {
      o.logit_scale = 1.7;
      o.scale = 0.3;
      s.pos = at::arange(n, at::kLong);  // one position row for every head
    }
    REQUIRE(one_query_applies(q, s, nullptr));
    at::Tensor fast = attention(q, s, nullptr, o), ref = attention_blocked(q, s, nullptr, o);
    CHECK(fast.sizes() == ref.sizes());
    CHECK((fast - ref).abs().max().item<double>() < 1e-5);
  }
  // What it does not take goes through the blocked path: several queries, float64, a denominator set.
  KVSet s;
  s.keys = at::randn({2, 9, 8});
  s.values = at::randn({2, 9, 8});
  CHECK_FALSE(one_query_applies(at::randn({4, 2, 8}), s, nullptr));
  CHECK_FALSE(one_query_applies(at::randn({4, 1, 8}, at::kDouble), s, nullptr));
  CHECK_FALSE(one_query_applies(at::randn({4, 1, 8}), s, &s));
}
