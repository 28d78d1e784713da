// Metrics of docs/methods.md §2 against direct per-query computations.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "kvlab/attention/attention.h"
#include "kvlab/attention/metrics.h"
#include "test_util.h"

using namespace kvlab;

TEST_CASE("metrics: exact output has zero error; a perturbation gives the formula's value") {
  at::manual_seed(11);
  const int64_t hkv = 2, hq = 4, n = 41, nq = 7, d = 9;
  auto q = at::randn({hq, nq, d}, at::kDouble), k = at::randn({hkv, n, d}, at::kDouble),
       v = at::randn({hkv, n, d}, at::kDouble);
  auto ref = exact_reference(q, k, v);
  auto o = exact_attention(q, k, v, true);
  auto m0 = compare_to_exact(o, ref);
  CHECK(m0.rel_err < 1e-12);
  CHECK(m0.cosine == doctest::Approx(1.0).epsilon(1e-12));

  auto z = o + 0.1 * at::randn(o.sizes(), at::kDouble);
  auto m = compare_to_exact(z, ref);
  // Direct computation per (head, query).
  double rel = 0, bf = 0, bop = 0, cos = 0, rel_clamped = 0;
  const int64_t g = hq / hkv;
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t j = 0; j < nq; ++j) {
      int64_t p = n - nq + j;
      auto oj = o[h][j], zj = z[h][j];
      double e = (zj - oj).norm().item<double>();
      rel += e / oj.norm().item<double>();
      // The BalanceKV notebook's denominator ‖clamp(o, min=1e-8)‖: negative entries count as 1e-8.
      double cl = 0;
      for (int64_t c = 0; c < d; ++c) cl += std::pow(std::max(oj[c].item<double>(), 1e-8), 2);
      rel_clamped += e / std::sqrt(cl);
      auto kk = k[h / g].narrow(0, 0, p + 1), vv = v[h / g].narrow(0, 0, p + 1);
      auto probs = at::softmax(at::matmul(kk, q[h][j]) / std::sqrt(double(d)), 0);
      double pn = probs.norm().item<double>();
      bf += e / (pn * vv.norm().item<double>());
      auto sv = at::linalg_svdvals(vv);
      bop += e / (pn * sv.max().item<double>());
      cos += (zj * oj).sum().item<double>() / (zj.norm() * oj.norm()).item<double>();
    }
  }
  double cnt = double(hq * nq);
  CHECK(m.rel_err == doctest::Approx(rel / cnt).epsilon(1e-9));
  CHECK(m.bound_ratio_F == doctest::Approx(bf / cnt).epsilon(1e-9));
  CHECK(m.bound_ratio_op == doctest::Approx(bop / cnt).epsilon(1e-9));
  CHECK(m.cosine == doctest::Approx(cos / cnt).epsilon(1e-9));
  CHECK(m.rel_err_clamped == doctest::Approx(rel_clamped / cnt).epsilon(1e-9));
  CHECK(m.rel_err_clamped > m.rel_err);  // random values: about half of o's entries are negative
  CHECK(m.bound_ratio_op >= m.bound_ratio_F);  // ‖V‖_op ≤ ‖V‖_F
}

TEST_CASE("mass_recall: all kept -> 1, none kept -> 0, half matches a direct sum") {
  at::manual_seed(5);
  auto q = at::randn({4, 3, 8}), k = at::randn({2, 12, 8});
  auto p = exact_attention_probs(q, k, true);  // [4, 3, 12]
  CHECK(mass_recall(p, at::ones({2, 12}, at::kBool)) == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(mass_recall(p, at::zeros({2, 12}, at::kBool)) == doctest::Approx(0.0));
  auto kept = at::zeros({2, 12}, at::kBool);
  kept.index_put_({0, at::indexing::Slice(0, 6)}, true);
  kept.index_put_({1, at::indexing::Slice(6, 12)}, true);
  double direct = 0;
  for (int h = 0; h < 4; ++h)
    for (int j = 0; j < 3; ++j)
      direct += (h / 2 == 0 ? p[h][j].narrow(0, 0, 6) : p[h][j].narrow(0, 6, 6)).sum().item<double>();
  CHECK(mass_recall(p, kept) == doctest::Approx(direct / 12).epsilon(1e-6));
}
