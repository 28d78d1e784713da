// Clusterability numbers against naive loops (k-center radii per prefix, diameter, δ-clusters,
// silhouette) and against data whose structure is known (tight clusters vs isotropic noise).
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/analysis/clusterability.h"
#include "kvlab/analysis/points.h"
#include "kvlab/compress/kcenter.h"
#include "kvlab/core/check.h"

using namespace kvlab;

namespace {

double dist(const at::Tensor& x, int64_t a, int64_t b) {
  return (x[a] - x[b]).to(at::kDouble).norm().item<double>();
}

at::Tensor clusters(int64_t c, int64_t per, int64_t dim, double spread, uint64_t seed) {
  at::manual_seed(seed);
  auto centres = at::randn({c, dim}, at::kDouble) * 10;  // [c, dim]
  auto x = centres.repeat_interleave(per, 0) + spread * at::randn({c * per, dim}, at::kDouble);  // [c*per, dim]
  return x.index_select(0, at::randperm(c * per));  // streamed in random order
}

}  // namespace

TEST_CASE("greedy k-center radii: r(j) is the covering radius of the first j centres (naive O(n·k) loop)") {
  at::manual_seed(1);
  auto x = at::randn({65, 7}, at::kDouble);  // [65, 7]
  auto kc = greedy_kcenter(x, 20, 0);
  for (int64_t j = 1; j <= 20; ++j) {
    double r = 0;
    for (int64_t i = 0; i < 65; ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < j; ++c) best = std::min(best, dist(x, i, kc.centres[c].item<int64_t>()));
      r = std::max(r, best);
    }
    CHECK(kc.radii[j - 1].item<double>() == doctest::Approx(r).epsilon(1e-12));
    // Farthest-first: centre j (0-based) is a point at exactly the previous covering radius.
    if (j < 20) {
      double dj = std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < j; ++c) dj = std::min(dj, dist(x, kc.centres[j].item<int64_t>(), kc.centres[c].item<int64_t>()));
      CHECK(dj == doctest::Approx(r).epsilon(1e-12));
    }
  }
}

TEST_CASE("diameter equals the largest pairwise distance") {
  at::manual_seed(2);
  auto x = at::randn({301, 5}, at::kFloat);  // [301, 5], more than one block
  double best = 0;
  for (int64_t i = 0; i < 301; ++i)
    for (int64_t j = i + 1; j < 301; ++j) best = std::max(best, dist(x, i, j));
  CHECK(diameter(x) == doctest::Approx(best).epsilon(1e-6));
}

TEST_CASE("δ-clusters follow SubGen's rule: join the nearest representative within δ, else open one") {
  // 1-D by hand, δ = 1: 0 opens, 0.5 joins, 3 opens, 3.2 joins, 1.9 opens (1.1 from 3, its nearest),
  // 10 opens. With δ just above 1.1, 1.9 joins 3.
  auto x = at::tensor({0.0, 0.5, 3.0, 3.2, 1.9, 10.0}, at::kDouble).view({6, 1});
  CHECK(delta_cluster_counts(x, 1.0, {1, 2, 3, 4, 5, 6}) == std::vector<int64_t>{1, 1, 2, 2, 3, 4});
  CHECK(delta_cluster_counts(x, 1.1 + 1e-9, {5, 6}) == std::vector<int64_t>{2, 3});
  // Random data against a naive loop over explicit representative lists.
  at::manual_seed(4);
  auto y = at::randn({200, 3}, at::kDouble);
  std::vector<int64_t> reps, counts;
  for (int64_t i = 0; i < 200; ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t r : reps) best = std::min(best, dist(y, i, r));
    if (best > 0.8) reps.push_back(i);
    counts.push_back(int64_t(reps.size()));
  }
  CHECK(delta_cluster_counts(y, 0.8, {17, 64, 200}) == std::vector<int64_t>{counts[16], counts[63], counts[199]});
}

TEST_CASE("silhouette matches a naive O(n²) loop, singletons count 0") {
  at::manual_seed(5);
  auto x = at::randn({47, 4}, at::kDouble);
  auto labels = at::randint(0, 4, {47}, at::kLong);
  labels[46] = 4;  // a singleton
  double total = 0;
  for (int64_t i = 0; i < 47; ++i) {
    const int64_t li = labels[i].item<int64_t>();
    std::vector<double> sum(5, 0.0), cnt(5, 0.0);
    for (int64_t j = 0; j < 47; ++j) {
      if (j == i) continue;
      sum[labels[j].item<int64_t>()] += dist(x, i, j);
      cnt[labels[j].item<int64_t>()] += 1;
    }
    if (cnt[li] == 0) continue;  // singleton: 0
    const double a = sum[li] / cnt[li];
    double b = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < 5; ++c)
      if (c != li && cnt[c] > 0) b = std::min(b, sum[c] / cnt[c]);
    total += (b - a) / std::max(a, b);
  }
  CHECK(silhouette_score(x, labels) == doctest::Approx(total / 47).epsilon(1e-9));
}

TEST_CASE("clusterability separates tight clusters from isotropic noise") {
  auto tight = clusters(8, 64, 16, 0.3, 7);                        // [512, 16]
  at::manual_seed(8);
  auto noise = at::randn({512, 16}, at::kDouble);                  // [512, 16]
  ClusterabilityOptions o;
  o.silhouette_k = 8;  // the partition into as many centres as clusters
  auto ct = clusterability(tight, o), cn = clusterability(noise, o);
  REQUIRE(ct.radius_ratio.size() == 256);
  MESSAGE("tight: r(8)/D ", ct.radius_ratio[7], ", silhouette ", ct.silhouette, ", m exponent ", ct.delta[1].fit.exponent);
  MESSAGE("noise: r(8)/D ", cn.radius_ratio[7], ", silhouette ", cn.silhouette, ", m exponent ", cn.delta[1].fit.exponent);
  CHECK(ct.radius_ratio[7] < 0.15);      // 8 centres cover 8 clusters
  CHECK(cn.radius_ratio[7] > 0.5);
  CHECK(ct.silhouette > 0.8);
  CHECK(cn.silhouette < 0.2);
  // δ-clusters saturate at the cluster count for tight clusters and keep growing for noise.
  CHECK(ct.delta[1].m.back() <= 16);
  CHECK(ct.delta[1].fit.exponent < 0.3);
  CHECK(cn.delta[1].fit.exponent > 0.6);
  // r(k) never increases with k.
  for (size_t j = 1; j < ct.radius.size(); ++j) CHECK(ct.radius[j] <= ct.radius[j - 1]);
  CHECK(ct.delta[0].n == std::vector<int64_t>{16, 32, 64, 128, 256, 512});
}

TEST_CASE("strided_positions: skip, stride, and --last (the generated tail of a dump --generate sample)") {
  auto v = [](const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); };
  CHECK(v(kvlab::strided_positions(10, 2, 0)) == std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(v(kvlab::strided_positions(10, 0, 4)) == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(v(kvlab::strided_positions(10, 0, 0, 3)) == std::vector<int64_t>{7, 8, 9});
  CHECK(v(kvlab::strided_positions(10, 8, 0, 3)) == std::vector<int64_t>{8, 9});      // skip_first reaches further
  CHECK(v(kvlab::strided_positions(10, 0, 2, 4)) == std::vector<int64_t>{6, 8});      // the stride within the tail
  CHECK_THROWS_WITH_AS(kvlab::strided_positions(10, 0, 0, 11), doctest::Contains("--last must be in [0, 10]"),
                       kvlab::Error);
}
