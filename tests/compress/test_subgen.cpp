// subgen, clustergen and greedy k-center: k-center against a naive loop and Gonzalez's 2×
// bound, SubGen's reservoirs (chi-square, Lemmas 2.2–2.3) and estimator, ClusterGen's lossless
// merging of identical tokens, budgets, seeds, params, and clustered keys favouring both methods.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kvlab/attention/attention.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/kcenter.h"
#include "kvlab/compress/subgen.h"
#include "kvlab/core/check.h"
#include "kvlab/io/synthetic.h"

using namespace kvlab;

namespace {

double dist(const at::Tensor& x, int64_t a, int64_t b) {
  return (x[a] - x[b]).to(at::kDouble).norm().item<double>();
}

// Farthest-first traversal written the obvious way: O(n·k) distance calls.
std::pair<std::vector<int64_t>, double> naive_kcenter(const at::Tensor& x, int64_t k, int64_t first) {
  const int64_t n = x.size(0);
  std::vector<int64_t> c{first};
  auto covering = [&](int64_t i) {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t j : c) best = std::min(best, dist(x, i, j));
    return best;
  };
  while (static_cast<int64_t>(c.size()) < k) {
    int64_t far = -1;
    double fd = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (std::find(c.begin(), c.end(), i) != c.end()) continue;
      double d = covering(i);
      if (d > fd) fd = d, far = i;
    }
    c.push_back(far);
  }
  double r = 0;
  for (int64_t i = 0; i < n; ++i) r = std::max(r, covering(i));
  return {c, r};
}

// Optimal k-center radius (centres among the points) by brute force over all k-subsets.
double brute_force_kcenter(const at::Tensor& x, int64_t k) {
  const int64_t n = x.size(0);
  std::vector<int> sel(n, 0);
  std::fill(sel.begin(), sel.begin() + k, 1);
  double best = std::numeric_limits<double>::infinity();
  std::sort(sel.begin(), sel.end());
  do {
    double r = 0;
    for (int64_t i = 0; i < n; ++i) {
      double m = std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j)
        if (sel[j]) m = std::min(m, dist(x, i, j));
      r = std::max(r, m);
    }
    best = std::min(best, r);
  } while (std::next_permutation(sel.begin(), sel.end()));
  return best;
}

// Pearson's chi-square statistic of observed counts against expected counts.
double chi_square(const std::vector<double>& obs, const std::vector<double>& expct) {
  double s = 0;
  for (size_t i = 0; i < obs.size(); ++i) s += (obs[i] - expct[i]) * (obs[i] - expct[i]) / expct[i];
  return s;
}
// Upper 0.1% points of chi-square (p = 0.001) by degrees of freedom.
double chi2_crit_p001(int df) {
  static const double t[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322};
  return t[df];
}

LayerKV make_layer(const at::Tensor& k, const at::Tensor& v) {
  LayerKV kv;
  kv.keys = k;
  kv.values = v;
  return kv;
}

// Mean over query heads and queries of ‖z − a‖/‖a‖, queries seeing the whole region.
double rel_err(const at::Tensor& q, const CompressedKV& c, const LayerKV& kv) {
  auto exact = exact_attention(q, kv.keys, kv.values, /*causal=*/false).to(at::kDouble);
  KVSet num{c.keys, c.values, c.bias, {}};
  KVSet den{c.den_keys, {}, c.den_bias, {}};
  auto z = attention(q, num, c.has_separate_den() ? &den : nullptr).to(at::kDouble);
  return ((z - exact).norm(2, -1) / exact.norm(2, -1)).mean().item<double>();
}

// The uniform baseline at equal memory: a random subset of `budget` tokens, bias log(n/budget).
CompressedKV uniform_subset(const LayerKV& kv, int64_t budget, uint64_t seed) {
  const int64_t h = kv.n_kv_heads(), n = kv.n_tokens();
  std::mt19937_64 gen(seed);
  auto idx = at::empty({h, budget}, at::kLong);
  for (int64_t i = 0; i < h; ++i) {
    std::vector<int64_t> p(n);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), gen);
    p.resize(budget);
    std::sort(p.begin(), p.end());
    idx[i].copy_(at::tensor(p, at::kLong));
  }
  auto c = gather_kept(kv, idx);
  c.bias.fill_(std::log(double(n) / double(budget)));
  return c;
}

}  // namespace

TEST_SUITE("subgen") {

TEST_CASE("greedy k-center matches a naive loop (odd sizes, duplicates)") {
  at::manual_seed(3);
  for (int64_t n : {65, 127}) {
    for (int64_t k : {1, 2, 7, 16}) {
      for (int64_t first : {int64_t(0), n / 3}) {
        INFO("n=", n, " k=", k, " first=", first);
        auto x = at::randn({n, 5}, at::kDouble);
        auto r = greedy_kcenter(x, k, first);
        auto [c, rad] = naive_kcenter(x, k, first);
        std::vector<int64_t> got(r.centres.data_ptr<int64_t>(), r.centres.data_ptr<int64_t>() + k);
        CHECK(got == c);
        CHECK(r.radius == doctest::Approx(rad).epsilon(1e-12));
        CHECK(r.radii[k - 1].item<double>() == r.radius);
        for (int64_t j = 1; j < k; ++j) CHECK(r.radii[j].item<double>() <= r.radii[j - 1].item<double>());
        for (int64_t i = 0; i < n; ++i) {  // assignment = a nearest centre
          double best = std::numeric_limits<double>::infinity();
          for (int64_t j : c) best = std::min(best, dist(x, i, j));
          CHECK(dist(x, i, c[r.assignment[i].item<int64_t>()]) == doctest::Approx(best).epsilon(1e-12));
        }
      }
    }
  }
  // 4 distinct points repeated: 4 centres reach radius 0; k = 6 picks distinct indices.
  auto base = at::randn({4, 3}, at::kDouble);
  auto x = base.index_select(0, at::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 3, 3}, at::kLong));
  auto r4 = greedy_kcenter(x, 4);
  CHECK(r4.radius == 0.0);
  auto r6 = greedy_kcenter(x, 6);
  std::set<int64_t> distinct(r6.centres.data_ptr<int64_t>(), r6.centres.data_ptr<int64_t>() + 6);
  CHECK(distinct.size() == 6);
}

TEST_CASE("greedy k-center: the vectorized loop gives the plain loop's result bit for bit") {
  // Keys-like data (float32, d = 64, a few large coordinates, duplicated rows) and float64: the
  // same centres, assignment and radii, exactly (not approximately: clustergen's outputs must not
  // move when the fast loop replaced the plain one).
  at::manual_seed(11);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (int64_t n : {1, 33, 1000}) {
      auto x = at::randn({n, 64}, dtype);
      x.select(1, 3).mul_(20);                                   // an outlier channel
      if (n > 10) x.narrow(0, n - 5, 5).copy_(x.narrow(0, 0, 5));  // duplicates: ties
      for (int64_t k : {int64_t(1), std::min<int64_t>(n, 37), std::min<int64_t>(n, 300), n}) {
        for (int64_t first : {int64_t(0), n / 2}) {
          INFO("dtype=", dtype, " n=", n, " k=", k, " first=", first);
          const auto fast = greedy_kcenter(x, k, first);
          const auto ref = greedy_kcenter_reference(x, k, first);
          CHECK(at::equal(fast.centres, ref.centres));
          CHECK(at::equal(fast.assignment, ref.assignment));
          CHECK(at::equal(fast.radii, ref.radii));
          CHECK(fast.radius == ref.radius);
        }
      }
    }
  }
}

TEST_CASE("greedy k-center radius is within 2x of the brute-force optimum (Gonzalez)") {
  at::manual_seed(4);
  int tight = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 5 + trial % 5, k = 2 + trial % 3;
    auto x = trial % 2 ? at::randn({n, 2}, at::kDouble) : at::rand({n, 3}, at::kDouble).pow(3);
    const double opt = brute_force_kcenter(x, k);
    const double got = greedy_kcenter(x, k, trial % n).radius;
    INFO("trial=", trial, " n=", n, " k=", k, " greedy=", got, " opt=", opt);
    CHECK(got >= opt - 1e-12);
    CHECK(got <= 2 * opt + 1e-12);
    tight += got > opt + 1e-9;
  }
  CHECK(tight > 0);  // the comparison is not vacuous: greedy is sometimes worse than optimal
}

TEST_CASE("SubGen's value reservoir samples proportional to |v|^2 (Lemma 2.2, chi-square)") {
  const int n = 6, s = 5, runs = 2000, d = 3;
  std::vector<double> w{1, 2, 3, 4, 5, 6}, counts(n, 0);
  for (int seed = 0; seed < runs; ++seed) {
    subgen::SubGenState st(d, 0.5, s, 1, seed);
    for (int i = 0; i < n; ++i) {
      double k[d] = {double(i), 0, 0}, v[d] = {0, std::sqrt(w[i]), 0};
      st.append(k, v, d);
    }
    for (int64_t id : st.matrix_samples()) counts[id] += 1;
    if (seed == 0) CHECK(st.mu() == doctest::Approx(21.0));
  }
  const double total = double(runs) * s;
  std::vector<double> expct(n), unif(n, total / n);
  for (int i = 0; i < n; ++i) expct[i] = total * w[i] / 21.0;
  const double stat = chi_square(counts, expct);
  INFO("chi2=", stat, " crit(p=0.001, df=5)=", chi2_crit_p001(5));
  CHECK(stat < chi2_crit_p001(5));
  CHECK(chi_square(counts, unif) > chi2_crit_p001(5));  // and the test can tell ∝|v|² from uniform
}

TEST_CASE("SubGen's cluster reservoirs are uniform over each cluster (Lemma 2.3, chi-square)") {
  // Two clusters far apart, interleaved: A = ids {0,2,3,5,8}, B = {1,4,6,7}.
  const int t = 3, runs = 2000, d = 2;
  const std::vector<int> which{0, 1, 0, 0, 1, 0, 1, 1, 0};
  std::vector<double> ca(9, 0), cb(9, 0);
  for (int seed = 0; seed < runs; ++seed) {
    subgen::SubGenState st(d, 1.0, 1, t, seed, 99);
    for (size_t i = 0; i < which.size(); ++i) {
      double k[d] = {which[i] ? 10.0 : 0.0, 0.1 * double(i % 3)}, v[d] = {1, 0};
      st.append(k, v, d);
    }
    REQUIRE(st.clusters().size() == 2);
    CHECK(st.clusters()[0].count == 5);
    CHECK(st.clusters()[1].count == 4);
    CHECK(st.clusters()[0].rep == 0);
    CHECK(st.clusters()[1].rep == 1);
    for (int64_t id : st.clusters()[0].samples) ca[id] += 1;
    for (int64_t id : st.clusters()[1].samples) cb[id] += 1;
  }
  std::vector<double> oa, ob;
  for (int i = 0; i < 9; ++i) {
    if (which[i] == 0) oa.push_back(ca[i]);
    else {
      ob.push_back(cb[i]);
      CHECK(ca[i] == 0);
    }
  }
  const double na = double(runs) * t;
  const double sa = chi_square(oa, std::vector<double>(5, na / 5));
  const double sb = chi_square(ob, std::vector<double>(4, na / 4));
  INFO("chi2 A=", sa, " B=", sb);
  CHECK(sa < chi2_crit_p001(4));
  CHECK(sb < chi2_crit_p001(3));
}

TEST_CASE("SubGen clustering invariants (Lemma 2.3 items 1-4)") {
  at::manual_seed(5);
  const int64_t n = 400, d = 4;
  auto k = at::randn({n, d}, at::kDouble).contiguous();
  const double delta = 1.5;
  subgen::SubGenState st(d, delta, 4, 3, 1);
  for (int64_t i = 0; i < n; ++i) {
    double v[1] = {1};
    st.append(k.data_ptr<double>() + i * d, v, 1);
  }
  int64_t total = 0;
  const auto& cl = st.clusters();
  for (size_t a = 0; a < cl.size(); ++a) {
    total += cl[a].count;
    for (int64_t id : cl[a].samples) CHECK(dist(k, id, cl[a].rep) <= delta + 1e-12);
    for (size_t b = 0; b < a; ++b) CHECK(dist(k, cl[a].rep, cl[b].rep) > delta);
  }
  CHECK(total == n);
  CHECK(cl.size() > 1);
  CHECK(static_cast<int64_t>(cl.size()) < n);
}

TEST_CASE("SubGen estimator: exact denominator on duplicated keys, unbiased numerator") {
  // 5 distinct keys repeated over 60 tokens: with t = 1 the auto delta is 0, m = 5 clusters,
  // and the denominator Σ n_i/t Σ e^{q·k/√d} is exact.
  at::manual_seed(6);
  const int64_t n = 60, d = 8;
  auto base = at::randn({1, 5, d}, at::kDouble);
  auto pick = at::randint(5, {n}, at::kLong);
  auto keys = base.index_select(1, pick);                             // [1, n, d]
  auto values = at::randn({1, n, d}, at::kDouble);
  LayerKV kv = make_layer(keys, values);
  auto q = at::randn({2, 7, d}, at::kDouble);
  auto m = make_compressor("subgen", {{"t", 1}});
  CompressOptions opt;
  opt.budget = Budget::of_entries(30);
  auto c = m->compress(kv, opt);
  CHECK(c.mean_memory_entries() == 30);
  auto lse = [&](const at::Tensor& k, const at::Tensor& b) {
    auto s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(double(d));  // [2, 7, m]
    if (b.defined()) s = s + b.unsqueeze(1);
    return at::logsumexp(s, -1);
  };
  CHECK(at::allclose(lse(c.den_keys, c.den_bias), lse(keys, at::Tensor())));
  // Numerator Σ_M µ/(s|v|²) e^{q·k/√d} v averaged over seeds -> Σ_i e^{q·k_i/√d} v_i.
  auto exact = at::matmul((at::matmul(q, keys.transpose(1, 2)) / std::sqrt(double(d))).exp(), values);
  // Unbiased: E‖mean of N draws − exact‖² = E‖one draw − exact‖² / N; allow 3× that.
  at::Tensor mean = at::zeros_like(exact);
  const int seeds = 400;
  double single_sq = 0;
  for (int s = 0; s < seeds; ++s) {
    opt.seed = s;
    auto cs = m->compress(kv, opt);
    auto sc = at::matmul(q, cs.keys.transpose(1, 2)) / std::sqrt(double(d)) + cs.bias.unsqueeze(1);
    auto z = at::matmul(sc.exp(), cs.values);
    mean += z / seeds;
    single_sq += (z - exact).pow(2).sum().item<double>() / seeds;
  }
  const double mean_sq = (mean - exact).pow(2).sum().item<double>();
  INFO("squared error of the seed mean = ", mean_sq, ", single draw / N = ", single_sq / seeds);
  CHECK(mean_sq < 3.0 * single_sq / seeds);
  CHECK(mean_sq < 0.05 * exact.pow(2).sum().item<double>());
}

TEST_CASE("SubGen: memory = budget, ratio 1 exact, seeds, params") {
  SyntheticSpec spec;
  spec.kind = "clustered";
  spec.n_tokens = 500;
  spec.head_dim = 16;
  auto t = synthetic_layer(spec, 0, 0);
  LayerKV kv = make_layer(t.k, t.v);
  auto m = make_compressor("subgen", {});
  for (int64_t budget : {250, 100, 37, 2}) {
    INFO("budget=", budget);
    CompressOptions opt;
    opt.budget = Budget::of_entries(budget);
    auto c = m->compress(kv, opt);
    CHECK(c.mean_memory_entries() == budget);
    CHECK(!c.kept_idx.defined());
  }
  CompressOptions full;
  full.budget = Budget::of_ratio(1.0);
  CHECK(rel_err(t.q, m->compress(kv, full), kv) < 1e-5);
  CompressOptions o;
  o.budget = Budget::of_entries(100);
  o.seed = 1;
  auto a = m->compress(kv, o), b = m->compress(kv, o);
  CHECK(a.keys.equal(b.keys));
  CHECK(a.bias.equal(b.bias));
  CHECK(a.den_keys.equal(b.den_keys));
  o.seed = 2;
  CHECK(!m->compress(kv, o).keys.equal(a.keys));
  // Explicit delta too small for the budget: the error names the parameter.
  CHECK_THROWS_WITH_AS(make_compressor("subgen", {{"delta", 1e-6}})->compress(kv, o),
                       doctest::Contains("delta"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("subgen", {{"t", 0}}), doctest::Contains("'t'"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("subgen", {{"den_fraction", 1.5}}), doctest::Contains("den_fraction"),
                       kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("subgen", {{"delta", -1}}), doctest::Contains("delta"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("subgen", {{"sigma", 1}}), doctest::Contains("sigma"), kvlab::Error);
}

TEST_CASE("ClusterGen: merging identical tokens loses nothing") {
  at::manual_seed(7);
  const int64_t d = 8, distinct = 6;
  auto bk = at::randn({2, distinct, d}, at::kDouble), bv = at::randn({2, distinct, d}, at::kDouble);
  auto pick = at::cat({at::arange(distinct, at::kLong), at::randint(distinct, {49}, at::kLong)});
  pick = pick.index_select(0, at::randperm(pick.size(0), at::kLong));        // 55 tokens, shuffled
  const int64_t n = pick.size(0);
  auto keys = bk.index_select(1, pick), values = bv.index_select(1, pick);
  LayerKV kv = make_layer(keys, values);
  auto q = at::randn({4, 9, d}, at::kDouble);
  for (int64_t ell : {0, 3}) {
    for (int64_t extra : {0, 4}) {
      INFO("recent=", ell, " extra centres=", extra);
      auto m = make_compressor("clustergen", {{"recent", ell}});
      CompressOptions opt;
      opt.budget = Budget::of_entries(ell + distinct + extra);
      auto c = m->compress(kv, opt);
      CHECK(c.keys.size(1) == opt.budget.entries);
      // Extra centres beyond the distinct keys are duplicates with empty clusters (bias -inf).
      CHECK(c.mean_entries() == opt.budget.entries - extra);
      CHECK(rel_err(q, c, kv) < 1e-12);
      if (ell > 0) {
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t j = 0; j < ell; ++j) CHECK(c.kept_idx[h][opt.budget.entries - ell + j].item<int64_t>() == n - ell + j);
      }
    }
  }
  // Without the size weights the same cache is not exact (the weights are what makes it lossless).
  auto m0 = make_compressor("clustergen", {{"recent", 0}, {"kcenter_weights", "none"}});
  CompressOptions opt;
  opt.budget = Budget::of_entries(distinct);
  auto c0 = m0->compress(kv, opt);
  CHECK(at::allclose(c0.bias, at::zeros_like(c0.bias)));
  CHECK(rel_err(q, c0, kv) > 1e-3);
}

TEST_CASE("ClusterGen: budget, window, ratio 1, params") {
  SyntheticSpec spec;
  spec.kind = "clustered";
  spec.n_tokens = 301;
  auto t = synthetic_layer(spec, 0, 0);
  LayerKV kv = make_layer(t.k, t.v);
  auto m = make_compressor("clustergen", {});
  for (int64_t budget : {150, 31, 1}) {
    INFO("budget=", budget);
    CompressOptions opt;
    opt.budget = Budget::of_entries(budget);
    auto c = m->compress(kv, opt);
    CHECK(c.mean_entries() == budget);
    const int64_t ell = std::llround(0.5 * budget), k = budget - ell;
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < ell; ++j) CHECK(c.kept_idx[h][k + j].item<int64_t>() == 301 - ell + j);
      if (k > 0) CHECK(c.kept_idx[h][0].item<int64_t>() == 0);  // first centre = first token
      // Size weights of the centres sum to the tokens outside the window.
      if (k > 0) CHECK(c.bias[h].narrow(0, 0, k).exp().sum().item<double>() == doctest::Approx(301 - ell));
    }
  }
  CompressOptions full;
  full.budget = Budget::of_ratio(1.0);
  CHECK(rel_err(t.q, m->compress(kv, full), kv) < 1e-5);
  CHECK_THROWS_WITH_AS(make_compressor("clustergen", {{"recent", -2}}), doctest::Contains("recent"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("clustergen", {{"recent_fraction", 2}}),
                       doctest::Contains("recent_fraction"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("clustergen", {{"kcenter_weights", "mean"}}),
                       doctest::Contains("kcenter_weights"), kvlab::Error);
}

TEST_CASE("clustered keys: clustergen and SubGen's normaliser beat uniform at equal memory") {
  // 16 key clusters of geometric sizes (0.7^c), values = a per-cluster mean + small noise,
  // queries toward random clusters. Uniform sampling misses the small clusters; k-center puts a
  // centre in every one, and SubGen's cluster samples estimate the softmax normaliser better.
  at::manual_seed(11);
  const int64_t n = 2048, d = 64, C = 16, H = 2, nq = 32;
  auto probs = at::pow(0.7, at::arange(C, at::kDouble));
  auto assign = at::multinomial(probs / probs.sum(), n, /*replacement=*/true);   // [n]
  auto centres = at::randn({H, C, d});
  centres = centres / centres.norm(2, -1, true) * 8.0;                           // [H, C, d]
  auto keys = centres.index_select(1, assign) + 0.3 * at::randn({H, n, d});      // [H, n, d]
  auto values = at::randn({H, C, d}).index_select(1, assign) + 0.3 * at::randn({H, n, d});
  auto qa = at::randint(C, {nq}, at::kLong);
  auto q = centres.index_select(1, qa).repeat_interleave(2, 0) * 0.5 + 0.5 * at::randn({2 * H, nq, d});
  LayerKV kv = make_layer(keys, values);
  auto log_z = [&](const at::Tensor& k, const at::Tensor& b) {                  // [H, 2·nq]
    auto s = at::matmul(q.view({H, 2 * nq, d}), k.transpose(1, 2)) / std::sqrt(double(d));
    if (b.defined()) s = s + b.unsqueeze(1);
    return at::logsumexp(s.to(at::kDouble), -1);
  };
  const auto lz = log_z(keys, at::Tensor());
  for (double ratio : {0.05, 0.1, 0.25}) {
    const int64_t budget = Budget::of_ratio(ratio).entries_for(n);
    CompressOptions opt;
    opt.budget = Budget::of_entries(budget);
    double eu = 0, es = 0, zu = 0, zs = 0;
    const int seeds = 3;
    for (int s = 0; s < seeds; ++s) {
      opt.seed = s;
      auto cu = uniform_subset(kv, budget, s);
      auto cs = make_compressor("subgen", {})->compress(kv, opt);
      eu += rel_err(q, cu, kv) / seeds;
      es += rel_err(q, cs, kv) / seeds;
      zu += (log_z(cu.keys, cu.bias) - lz).exp().sub(1).abs().mean().item<double>() / seeds;
      zs += (log_z(cs.den_keys, cs.den_bias) - lz).exp().sub(1).abs().mean().item<double>() / seeds;
    }
    const double ec0 = rel_err(q, make_compressor("clustergen", {{"recent", 0}})->compress(kv, opt), kv);
    const double ec = rel_err(q, make_compressor("clustergen", {})->compress(kv, opt), kv);
    MESSAGE("ratio=", ratio, " rel_err uniform=", eu, " clustergen(recent=0)=", ec0, " clustergen=", ec,
            " subgen=", es, " | normaliser rel_err uniform=", zu, " subgen=", zs);
    INFO("ratio=", ratio, " uniform=", eu, " clustergen0=", ec0, " clustergen=", ec, " Z: uniform=", zu,
         " subgen=", zs);
    CHECK(ec0 < eu);
    CHECK(ec < eu);
    // SubGen's τ uses half the memory and still beats uniform's Σ_S (n/B)e^{q·k/√d} once the
    // budget allows enough clusters (at ratio 0.05, t = 8 leaves m ≤ 6 clusters for 16: not asserted).
    if (ratio >= 0.1) CHECK(zs < zu);
    // SubGen's full estimator z/τ is NOT asserted: its numerator Σ_M µ/(s|v|²)e^{q·k}v is not
    // self-normalised, so with structured values it is worse than uniform here (see MESSAGE).
  }
}

}  // TEST_SUITE
