// t-SNE and trustworthiness: the perplexity search against the entropy's definition, both
// gradients against finite differences and each other, trustworthiness against scikit-learn's
// own numbers, and embedding quality on known clusters and on real SmolLM2 keys against
// scikit-learn's TSNE (tests/fixtures/tsne_golden/, data_scripts/make_tsne_golden.py).
#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "kvlab/analysis/trustworthiness.h"
#include "kvlab/analysis/tsne.h"
#include "kvlab/analysis/tsne_gradient.h"
#include "kvlab/core/check.h"
#include "test_util.h"

using namespace kvlab;

namespace {

// n points in `dim` dimensions around `clusters` well-separated centres: [n, dim] float32.
at::Tensor gaussian_clusters(int64_t clusters, int64_t per, int64_t dim, double spread, uint64_t seed) {
  at::manual_seed(seed);
  auto centres = at::randn({clusters, dim}) * 10;                         // [c, dim]
  auto x = centres.repeat_interleave(per, 0) + spread * at::randn({clusters * per, dim});  // [c*per, dim]
  return x;
}

struct Golden {
  at::Tensor x;  // [n, d] float32
  nlohmann::json j;
};

Golden load_golden() {
  const std::string dir = test::fixtures_dir() + "/tsne_golden";
  Golden g;
  g.j = nlohmann::json::parse(test::read_file(dir + "/golden.json"));
  const int64_t n = g.j["n"], d = g.j["d"];
  g.x = at::empty({n, d}, at::kFloat);
  std::ifstream f(dir + "/keys.f32", std::ios::binary);
  f.read(reinterpret_cast<char*>(g.x.data_ptr<float>()), n * d * 4);
  REQUIRE(f.gcount() == n * d * 4);
  return g;
}

at::Tensor embedding_of(const nlohmann::json& rows) {
  std::vector<double> v;
  for (const auto& r : rows) v.insert(v.end(), {r[0].get<double>(), r[1].get<double>()});
  return at::tensor(v, at::kDouble).view({int64_t(rows.size()), 2});
}

}  // namespace

TEST_CASE("conditional_p: every row sums to 1 with entropy log(perplexity)") {
  at::manual_seed(3);
  auto d = at::rand({7, 40}, at::kDouble) * 50;  // [7, 40] squared distances
  for (double perp : {2.0, 5.0, 15.0}) {
    auto p = conditional_p(d, perp);
    for (int64_t i = 0; i < 7; ++i) {
      auto row = p[i];
      CHECK(row.sum().item<double>() == doctest::Approx(1.0).epsilon(1e-12));
      const double h = -(row * row.clamp_min(1e-300).log()).sum().item<double>();  // Shannon entropy, nats
      CHECK(h == doctest::Approx(std::log(perp)).epsilon(1e-4));
    }
  }
}

TEST_CASE("exact KL gradient matches central finite differences; Barnes-Hut at small angle matches exact") {
  const int64_t n = 23;  // odd on purpose
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> u(0.01, 1.0), c(-3.0, 3.0);
  std::vector<double> p(n * n, 0.0), y(2 * n), g(2 * n), g2(2 * n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) p[i * n + j] = p[j * n + i] = u(gen), total += 2 * p[i * n + j];
  for (auto& v : p) v /= total;
  for (auto& v : y) v = c(gen);
  const double kl = tsne_detail::exact_kl_gradient(p, y, n, g, true);
  CHECK(kl > 0);
  const double h = 1e-6;
  for (int64_t a = 0; a < 2 * n; a += 5) {
    auto yp = y, ym = y;
    yp[a] += h;
    ym[a] -= h;
    std::vector<double> scratch(2 * n);
    const double fd = (tsne_detail::exact_kl_gradient(p, yp, n, scratch, true) -
                       tsne_detail::exact_kl_gradient(p, ym, n, scratch, true)) / (2 * h);
    CHECK(g[a] == doctest::Approx(fd).epsilon(1e-5));
  }
  // The dense P as a full sparse pattern: Barnes-Hut with a tiny angle opens every cell.
  tsne_detail::SparseP sp;
  sp.n = n;
  sp.indptr.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j)
      if (j != i) sp.indices.push_back(j), sp.values.push_back(p[i * n + j]);
    sp.indptr.push_back(int64_t(sp.indices.size()));
  }
  const double kl_bh = tsne_detail::bh_kl_gradient(sp, y, n, 1e-6, g2, true);
  CHECK(kl_bh == doctest::Approx(kl).epsilon(1e-9));
  for (int64_t a = 0; a < 2 * n; ++a) CHECK(g2[a] == doctest::Approx(g[a]).epsilon(1e-9));
  // At the default angle 0.5 it is an approximation, within a few percent in norm.
  tsne_detail::bh_kl_gradient(sp, y, n, 0.5, g2, false);
  double num = 0, den = 0;
  for (int64_t a = 0; a < 2 * n; ++a) num += (g2[a] - g[a]) * (g2[a] - g[a]), den += g[a] * g[a];
  CHECK(std::sqrt(num / den) < 0.05);
}

TEST_CASE("trustworthiness equals scikit-learn's on fixed projections of real keys") {
  auto g = load_golden();
  const auto& pt = g.j["projection_trustworthiness"];
  CHECK(trustworthiness(g.x, g.x.slice(1, 0, 2), 5) == doctest::Approx(pt["first2_k5"].get<double>()).epsilon(1e-9));
  CHECK(trustworthiness(g.x, g.x.slice(1, 0, 2), 10) == doctest::Approx(pt["first2_k10"].get<double>()).epsilon(1e-9));
  CHECK(trustworthiness(g.x, g.x.slice(1, 10, 12), 10) ==
        doctest::Approx(pt["dims_10_12_k10"].get<double>()).epsilon(1e-9));
  // On scikit-learn's own t-SNE embeddings (stored to 6 decimals).
  for (const char* m : {"exact", "barnes_hut"})
    CHECK(trustworthiness(g.x, embedding_of(g.j[m]["embedding"]), 10) ==
          doctest::Approx(g.j[m]["trustworthiness_k10"].get<double>()).epsilon(1e-6));
  CHECK(trustworthiness(g.x, g.x, 10) == doctest::Approx(1.0));
  CHECK_THROWS_AS(trustworthiness(g.x, g.x, 200), Error);
}

TEST_CASE("t-SNE of 5 known clusters: trustworthiness(10) >= 0.9, clusters separated") {
  auto x = gaussian_clusters(5, 60, 20, 1.0, 5);  // [300, 20]
  for (auto method : {TsneMethod::exact, TsneMethod::barnes_hut}) {
    TsneOptions o;
    o.method = method;
    auto r = tsne(x, o);
    REQUIRE(r.embedding.sizes() == at::IntArrayRef({300, 2}));
    const double t = trustworthiness(x, r.embedding, 10);
    MESSAGE("method ", std::string(method == TsneMethod::exact ? "exact" : "barnes_hut"), ": trustworthiness ", t, ", KL ",
            r.kl_divergence, ", iterations ", r.n_iter + 1);
    CHECK(t >= 0.9);
    // Each point's nearest embedded neighbour lies in its own cluster.
    auto d = at::cdist(r.embedding, r.embedding);
    d.fill_diagonal_(INFINITY);
    auto nn = d.argmin(1);
    CHECK((nn.div(60, "floor") == at::arange(300).div(60, "floor")).all().item<bool>());
    CHECK(r.learning_rate == doctest::Approx(50.0));  // auto: max(300 / 12 / 4, 50)
  }
}

TEST_CASE("t-SNE of real SmolLM2 keys: trustworthiness within 0.02 of scikit-learn's at perplexity 30") {
  auto g = load_golden();
  TsneOptions o;
  o.perplexity = g.j["perplexity"];
  for (auto [method, name] : {std::pair{TsneMethod::exact, "exact"}, std::pair{TsneMethod::barnes_hut, "barnes_hut"}}) {
    o.method = method;
    auto r = tsne(g.x, o);
    const double ours = trustworthiness(g.x, r.embedding, 10);
    const double theirs = g.j[name]["trustworthiness_k10"];
    MESSAGE(std::string(name), ": kvlab ", ours, " (KL ", r.kl_divergence, "), scikit-learn ", theirs, " (KL ",
            g.j[name]["kl_divergence"].get<double>(), ")");
    CHECK(std::fabs(ours - theirs) <= 0.02);
    CHECK(r.kl_divergence == doctest::Approx(g.j[name]["kl_divergence"].get<double>()).epsilon(0.1));
  }
}

TEST_CASE("t-SNE: same seed same embedding; bad options name the option") {
  auto x = gaussian_clusters(3, 10, 5, 1.0, 2);  // [30, 5]
  TsneOptions o;
  o.init = TsneInit::random;
  o.perplexity = 5;
  o.seed = 9;
  auto a = tsne(x, o), b = tsne(x, o);
  CHECK(at::equal(a.embedding, b.embedding));
  o.perplexity = 30;
  CHECK_THROWS_WITH_AS(tsne(x, o), doctest::Contains("--perplexity"), Error);
  o.perplexity = 5;
  o.max_iter = 100;
  CHECK_THROWS_WITH_AS(tsne(x, o), doctest::Contains("--max-iter"), Error);
  CHECK_THROWS_WITH_AS(parse_tsne_method("bh", "--method"), doctest::Contains("--method"), Error);
  TsneOptions ex;
  ex.method = TsneMethod::exact;
  CHECK_THROWS_WITH_AS(tsne(at::zeros({5001, 2}), ex), doctest::Contains("barnes_hut"), Error);
}
