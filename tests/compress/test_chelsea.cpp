// Chelsea: budget hit exactly, protected ends exact, merging conserves tokens, identical keys merge
// losslessly, Theorem 6.1 by brute force, outlier-head score, full_heads, and clustered keys
// favouring Chelsea over uniform at equal memory.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <fstream>
#include <memory>
#include <vector>

#include "compress_test_util.h"
#include "kvlab/attention/attention.h"
#include "kvlab/compress/chelsea.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/io/synthetic.h"
#include "test_util.h"

using namespace kvlab;
using kvlab::test::budget_opt;
using kvlab::test::make_kv;
using kvlab::test::rel_err;

namespace {

// Σ_{x∈A} Σ_{y∈B} f(|x − y|) over positions 1..2n; in_a[x-1] says whether x ∈ A.
double partition_value(const std::vector<bool>& in_a, const std::vector<double>& f) {
  double s = 0;
  const int m = static_cast<int>(in_a.size());
  for (int x = 0; x < m; ++x)
    for (int y = 0; y < m; ++y)
      if (in_a[x] && !in_a[y]) s += f[std::abs(x - y)];
  return s;
}

// max over all balanced partitions of [2n] (brute force over subsets of size n).
double brute_force_max(int two_n, const std::vector<double>& f) {
  double best = -1e300;
  for (uint32_t mask = 0; mask < (1u << two_n); ++mask) {
    if (__builtin_popcount(mask) != two_n / 2) continue;
    std::vector<bool> in_a(two_n);
    for (int i = 0; i < two_n; ++i) in_a[i] = (mask >> i) & 1u;
    best = std::max(best, partition_value(in_a, f));
  }
  return best;
}

}  // namespace

TEST_SUITE("chelsea") {

TEST_CASE("chelsea_edges equals a naive loop: A = even, B = odd local index, cosine similarity") {
  // n1 = 3 sinks, n2 = 4 recent, chunks of 7 over the 43 compressible entries: six full chunks
  // and a 1-entry tail whose lone A entry has no partner. Key norms vary, so a dot product would
  // pick other partners than the cosine.
  at::manual_seed(21);
  const int64_t h = 2, n = 50, d = 6, n1 = 3, n2 = 4, c = 7, mc = n - n1 - n2;
  auto keys = at::randn({h, n, d}, at::kDouble) * at::rand({h, n, 1}, at::kDouble).mul(5).add(0.1);
  auto e = chelsea_edges(keys, n1, n2, c);
  int64_t valid = 0;
  for (int64_t a = 0; a < e.a_pos.size(0); ++a) {
    const int64_t i = e.a_pos[a].item<int64_t>();  // offset from n1
    if (i >= mc) continue;                          // padding of the last chunk
    REQUIRE((i % c) % 2 == 0);                      // an A entry
    for (int64_t hh = 0; hh < h; ++hh) {
      double best = -INFINITY;
      int64_t arg = -1;
      for (int64_t j = (i / c) * c + 1; j < std::min((i / c + 1) * c, mc); j += 2) {  // B entries of its chunk
        auto ki = keys[hh][n1 + i], kj = keys[hh][n1 + j];
        const double cos = (ki * kj).sum().item<double>() / (ki.norm() * kj.norm()).item<double>();
        if (cos > best) best = cos, arg = j;
      }
      if (arg < 0) {
        CHECK(std::isinf(e.best[hh][a].item<double>()));
        continue;
      }
      valid += hh == 0;
      CHECK(e.best[hh][a].item<double>() == doctest::Approx(best).epsilon(1e-12));
      CHECK(e.b_pos[hh][a].item<int64_t>() == arg);
    }
  }
  CHECK(valid == e.n_valid);
  CHECK(e.n_valid == 6 * 4);  // each full chunk of 7 has 4 A entries; the tail's one has no B
}

TEST_CASE("chelsea: ratio 1 reproduces exact attention") {
  auto kv = make_kv("random", 129, 16);
  auto c = make_compressor("chelsea", {})->compress(kv, budget_opt(129));
  CHECK(c.keys.size(1) == 129);
  CHECK(rel_err(kv, c) < 1e-12);
}

TEST_CASE("chelsea: kept entries equal the budget; degrees sum to n; weighted keys conserved") {
  struct Case {
    const char* chunk;
    const char* family;
    int64_t n;
  };
  for (const Case& cs : {Case{"16", "llama2", 65}, Case{"none", "llama2", 1027}, Case{"256", "llama2", 1027},
                         Case{"64", "llama3", 300}, Case{"16", "qwen2", 300}, Case{"none", "qwen2", 65}}) {
    nlohmann::json p = {{"family", cs.family}};
    p["chunk"] = std::string(cs.chunk) == "none" ? nlohmann::json("none") : nlohmann::json(std::stoi(cs.chunk));
    auto comp = make_compressor("chelsea", p);
    const int64_t n = cs.n;
    auto kv = make_kv("random", n, 8, 2, 2, 8);
    for (double ratio : {0.01, 0.1, 0.5, 0.8}) {
      const int64_t b = Budget::of_ratio(ratio).entries_for(n);
      INFO("chunk=", cs.chunk, " family=", cs.family, " n=", n, " ratio=", ratio, " budget=", b);
      auto c = comp->compress(kv, budget_opt(b));
      CHECK(c.keys.size(1) == b);
      CHECK(c.mean_entries() == doctest::Approx(static_cast<double>(b)));
      CHECK(!c.kept_idx.defined());
      auto deg = c.bias.exp();                                            // [H, b]
      CHECK(at::allclose(deg.sum(1), at::full({2}, static_cast<double>(n), deg.options())));
      // Σ_e N_e k̂_e = Σ_t k_t: the degree-weighted mean loses no mass.
      auto lhs = (c.keys * deg.unsqueeze(-1)).sum(1);
      CHECK(at::allclose(lhs, kv.keys.sum(1), 1e-9, 1e-9));
      auto lhv = (c.values * deg.unsqueeze(-1)).sum(1);
      CHECK(at::allclose(lhv, kv.values.sum(1), 1e-9, 1e-9));
    }
  }
}

TEST_CASE("chelsea: halvings give n / 2^T entries") {
  auto kv = make_kv("random", 1000, 8);
  CompressOptions o;
  o.budget = Budget::of_halvings(2);
  auto c = make_compressor("chelsea", {})->compress(kv, o);
  CHECK(c.keys.size(1) == 250);
}

TEST_CASE("chelsea: sinks and recent entries are kept exactly") {
  auto kv = make_kv("random", 1200, 16);
  for (int64_t b : {100, 240, 600}) {
    INFO("budget=", b);
    auto c = make_compressor("chelsea", {})->compress(kv, budget_opt(b));
    CHECK(at::equal(c.keys.narrow(1, 0, 16), kv.keys.narrow(1, 0, 16)));
    CHECK(at::equal(c.values.narrow(1, 0, 16), kv.values.narrow(1, 0, 16)));
    CHECK(at::equal(c.keys.narrow(1, b - 64, 64), kv.keys.narrow(1, 1200 - 64, 64)));
    CHECK(at::equal(c.values.narrow(1, b - 64, 64), kv.values.narrow(1, 1200 - 64, 64)));
    CHECK(c.bias.narrow(1, 0, 16).abs().max().item<double>() == 0.0);
    CHECK(c.bias.narrow(1, b - 64, 64).abs().max().item<double>() == 0.0);
  }
  // Budget below n1 + n2 + 1: the protected ends shrink, the budget still holds.
  auto small = make_compressor("chelsea", {})->compress(kv, budget_opt(20));
  CHECK(small.keys.size(1) == 20);
  CHECK(at::equal(small.keys.narrow(1, 0, 9), kv.keys.narrow(1, 0, 9)));
}

TEST_CASE("chelsea: merging identical keys and values loses nothing") {
  // (a) adjacent duplicate pairs, one step of r = 0.5 to half the size: every A entry merges
  //     into its twin (cosine 1), so attention is exact.
  {
    auto base = make_kv("random", 256, 24, 4, 2, 16, 7);
    LayerKV kv = base;
    auto twin = at::arange(512, at::kLong).div(2, "floor");                      // 0,0,1,1,...
    kv.keys = base.keys.index_select(1, twin);                                   // [2, 512, 16]
    kv.values = base.values.index_select(1, twin);
    kv.query_pos = at::arange(512 - 24, 512, at::kLong);
    auto comp = make_compressor("chelsea", {{"n_sink", 0}, {"n_recent", 0}, {"r_init", 0.5}, {"chunk", 64}});
    auto c = comp->compress(kv, budget_opt(256));
    CHECK(c.keys.size(1) == 256);
    CHECK(rel_err(kv, c) < 1e-12);
    CHECK(at::allclose(c.bias.exp(), at::full({2, 256}, 2.0, c.bias.options())));
  }
  // (b) blocks of 16 identical tokens, default schedule over several steps down to 4 entries per
  //     block: sim-1 edges always outnumber the edges a step merges, so every merge is lossless.
  {
    auto base = make_kv("random", 64, 24, 4, 2, 16, 9);
    LayerKV kv = base;
    auto block = at::arange(1024, at::kLong).div(16, "floor");
    kv.keys = base.keys.index_select(1, block);
    kv.values = base.values.index_select(1, block);
    kv.query_pos = at::arange(1024 - 24, 1024, at::kLong);
    auto comp = make_compressor("chelsea", {{"chunk", 64}});
    auto c = comp->compress(kv, budget_opt(256 + 80));
    CHECK(c.keys.size(1) == 336);
    CHECK(rel_err(kv, c) < 1e-10);
  }
}

TEST_CASE("chelsea: Theorem 6.1, the alternating partition maximises sum f(|x-y|) (brute force)") {
  // Theorem 6.1: for f on [2n−1] with f(1)−f(2) >= f(2)−f(3) >= ... >= f(2n−2)−f(2n−1) >= 0
  // (non-increasing and convex), A0 = odd positions, B0 = even positions (1-based) attains
  //   max over (A, B), |A| = |B| = n, A ∪ B = [2n], of  Σ_{x∈A} Σ_{y∈B} f(|x − y|),
  // the sum over every cross pair. kvlab's partition (chelsea_in_set_a on 0-based local index)
  // is that A0.
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int two_n = 2; two_n <= 12; two_n += 2) {
    std::vector<bool> alt(two_n);
    for (int i = 0; i < two_n; ++i) alt[i] = chelsea_in_set_a(i);
    for (int trial = 0; trial < 25; ++trial) {
      // Random convex non-increasing f: non-negative, non-increasing successive drops.
      std::vector<double> drops(two_n);
      for (auto& dd : drops) dd = u(rng) < 0.2 ? 0.0 : u(rng);
      std::sort(drops.begin(), drops.end(), std::greater<double>());
      std::vector<double> f(two_n + 1, 0.0);  // f[0] unused (|x−y| >= 1)
      f[two_n - 1] = u(rng) - 0.5;
      for (int dist = two_n - 2; dist >= 1; --dist) f[dist] = f[dist + 1] + drops[dist - 1];
      if (trial == 0) for (int dist = 1; dist < two_n; ++dist) f[dist] = two_n - dist;  // linear
      if (trial == 1) for (int dist = 1; dist < two_n; ++dist) f[dist] = std::exp(-0.7 * dist);
      if (trial == 2) for (int dist = 1; dist < two_n; ++dist) f[dist] = 1.0 / dist;
      const double best = brute_force_max(two_n, f), mine = partition_value(alt, f);
      INFO("2n=", two_n, " trial=", trial, " alternating=", mine, " max=", best);
      CHECK(mine >= best - 1e-9 * (1 + std::abs(best)));
    }
  }
  // Convexity matters: f = (1, 1, 0) on 2n = 4 is non-increasing but not convex, and
  // {1,4},{2,3} scores 4 against the alternating partition's 3.
  std::vector<double> f = {0, 1, 1, 0};
  std::vector<bool> alt = {true, false, true, false};
  CHECK(partition_value(alt, f) == doctest::Approx(3.0));
  CHECK(brute_force_max(4, f) == doctest::Approx(4.0));
}

TEST_CASE("chelsea: cache state, Alg. 1 trigger for generation") {
  ChelseaConfig cfg;
  ChelseaCache cache(cfg, 2);
  auto kv = make_kv("random", 600, 8);
  cache.append(kv.keys.narrow(1, 0, 500), kv.values.narrow(1, 0, 500));
  CHECK(cache.maybe_compress(200, 32));
  CHECK(cache.size() == 200);
  int fired = 0;
  for (int64_t t = 500; t < 600; ++t) {
    cache.append(kv.keys.narrow(1, t, 1), kv.values.narrow(1, t, 1));
    if (cache.maybe_compress(200, 32)) ++fired;
    CHECK(cache.size() < 200 + 32);
  }
  CHECK(fired == 3);  // at sizes 232 after 32, 64, 96 new tokens
  CHECK(cache.degree().sum(1).allclose(at::full({2}, 600.0, cache.degree().options())));
  // The last decoded token is still exact (recent window).
  CHECK(at::equal(cache.keys().select(1, cache.size() - 1), kv.keys.select(1, 599)));
}

TEST_CASE("chelsea: outlier score (App. B) and full_heads") {
  // Head 0: adjacent duplicates (every A has a sim-1 partner) -> score 0; head 1: random keys in
  // 64 dimensions (best cosine far below 0.8) -> score 1.
  auto kv = make_kv("random", 1024, 8, 2, 2, 64, 4);
  auto twin = at::arange(1024, at::kLong).div(2, "floor");
  auto k = kv.keys.clone();
  k[0] = kv.keys[0].index_select(0, twin);
  ChelseaConfig cfg;
  auto s = chelsea_outlier_scores(k, cfg, 0.8);
  CHECK(s[0].item<double>() == doctest::Approx(0.0));
  CHECK(s[1].item<double>() == doctest::Approx(1.0));
  auto table = at::tensor({0.1, 0.9, 0.2, 0.3, 0.05, 0.8}, at::kDouble).view({3, 2});
  auto top = chelsea_select_outlier_heads(table, 2.0 / 6.0);
  REQUIRE(top.size() == 2);
  CHECK(top[0] == std::make_pair(0, 1));
  CHECK(top[1] == std::make_pair(2, 1));

  // full_heads with reallocate=layer: head 1 of layer 0 keeps everything; head 0 gets 2B − n so
  // the layer's total matches.
  kv.layer = 0;
  kv.n_layers = 4;
  auto comp = make_compressor("chelsea", {{"full_heads", "0:1"}, {"reallocate", "layer"}});
  auto c = comp->compress(kv, budget_opt(600));
  CHECK(c.keys.size(1) == 1024);
  CHECK(c.mean_entries() == doctest::Approx(600.0));
  CHECK(at::equal(c.keys[1], kv.keys[1]));
  CHECK(at::isinf(c.bias[0]).sum().item<int64_t>() == 1024 - 176);
  kv.layer = 1;  // not listed: plain budget
  CHECK(comp->compress(kv, budget_opt(600)).keys.size(1) == 600);
  // A head the model does not have: one error naming the parameter, whatever the layer.
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"full_heads", "3:5"}})->compress(kv, budget_opt(600)),
                       doctest::Contains("full_heads"), kvlab::Error);
}

TEST_CASE("chelsea: outlier heads from a calibration file; the budget reallocated over the model") {
  // 4 layers x 2 KV heads, n = 1024, B = 600 per head: 4,800 entries over the model.
  auto kv = make_kv("random", 1024, 8, 2, 2, 16, 5);
  kv.n_layers = 4;
  auto entries = [&](const std::shared_ptr<Compressor>& comp, int layer) {
    kv.layer = layer;
    auto out = comp->compress(kv, budget_opt(600));
    std::vector<int64_t> per_head;
    for (int64_t h = 0; h < 2; ++h) per_head.push_back(at::isfinite(out.bias[h]).sum().item<int64_t>());
    return per_head;
  };
  // full_layers=0 (the paper's Llama-2 setting): layer 0 keeps 1,024 per head; the other six heads
  // share 4,800 − 2,048 = 2,752: 458 each, the remainder 4 to the first four in (layer, head) order.
  std::shared_ptr<Compressor> first(make_compressor("chelsea", {{"full_layers", "0"}}));
  CHECK(entries(first, 0) == std::vector<int64_t>{1024, 1024});
  CHECK(entries(first, 1) == std::vector<int64_t>{459, 459});
  CHECK(entries(first, 2) == std::vector<int64_t>{459, 459});
  CHECK(entries(first, 3) == std::vector<int64_t>{458, 458});
  // A calibration file: the top 25% of the 8 heads (2) keep everything.
  auto dir = test::temp_dir("chelsea_outliers");
  const std::string file = dir + "/scores.json";
  std::ofstream(file) << R"({"kind": "chelsea_outlier_scores", "scores": [[0.1, 0.2], [0.9, 0.3], [0.05, 0.8], [0.4, 0.0]]})";
  std::shared_ptr<Compressor> cal(make_compressor("chelsea", {{"outliers", file}, {"outlier_fraction", 0.25}}));
  CHECK(entries(cal, 1) == std::vector<int64_t>{1024, 459});  // 1:0 (0.9) is an outlier
  CHECK(entries(cal, 2) == std::vector<int64_t>{459, 1024});  // 2:1 (0.8) too
  CHECK(entries(cal, 0) == std::vector<int64_t>{459, 459});  // others in (layer, head) order: 0:0 0:1
  CHECK(entries(cal, 3) == std::vector<int64_t>{458, 458});  // 1:1 2:0 get the remainder, 3:x do not
  // Full layers count inside the fraction: with layer 0 full, 3/8 adds only the best outlier (1:0);
  // the other five heads share 4,800 − 3·1,024 = 1,728: 345 each, +1 for 1:1, 2:0, 2:1.
  std::shared_ptr<Compressor> both(
      make_compressor("chelsea", {{"outliers", file}, {"outlier_fraction", 0.375}, {"full_layers", "0"}}));
  CHECK(entries(both, 0) == std::vector<int64_t>{1024, 1024});
  CHECK(entries(both, 1) == std::vector<int64_t>{1024, 346});
  CHECK(entries(both, 2) == std::vector<int64_t>{346, 346});  // 2:1 is not added at 3/8
  CHECK(entries(both, 3) == std::vector<int64_t>{345, 345});
  // Bad files and shapes: one error naming the parameter and the file.
  std::ofstream(dir + "/bad.json") << R"({"scores": [[0.1, 0.2], [0.3]]})";
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"outliers", dir + "/bad.json"}}), doctest::Contains("outliers"),
                       kvlab::Error);
  std::ofstream(dir + "/three.json") << R"({"scores": [[0.1, 0.2, 0.3]]})";
  kv.layer = 0;
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"outliers", dir + "/three.json"}})->compress(kv, budget_opt(600)),
                       doctest::Contains("1 layers x 3 KV heads"), kvlab::Error);
}

TEST_CASE("chelsea: clustered keys favour Chelsea over uniform at equal memory") {
  for (double ratio : {0.1, 0.25}) {
    double err_c = 0, err_u = 0;
    const int n_samples = 2;
    for (int sd = 0; sd < n_samples; ++sd) {
      auto kv = make_kv("clustered", 1024, 64, 4, 2, 16, 100 + sd);
      const int64_t b = Budget::of_ratio(ratio).entries_for(1024);
      auto c = make_compressor("chelsea", {})->compress(kv, budget_opt(b));
      CHECK(c.mean_entries() == doctest::Approx(static_cast<double>(b)));
      err_c += rel_err(kv, c) / n_samples;
      double eu = 0;
      for (uint64_t seed = 0; seed < 3; ++seed) {
        CompressOptions o = budget_opt(b);
        o.seed = seed;
        auto cu = make_compressor("uniform", {})->compress(kv, o);
        CHECK(cu.mean_entries() == doctest::Approx(static_cast<double>(b)).epsilon(0.01));
        eu += rel_err(kv, cu) / 3;
      }
      err_u += eu / n_samples;
    }
    INFO("ratio=", ratio, " chelsea rel_err=", err_c, " uniform rel_err=", err_u);
    MESSAGE("clustered ratio=", ratio, ": chelsea rel_err=", err_c, ", uniform rel_err=", err_u);
    CHECK(err_c < err_u);
  }
}

TEST_CASE("chelsea: deterministic and invalid parameters rejected with their name") {
  auto kv = make_kv("random", 700, 8);
  auto comp = make_compressor("chelsea", {});
  auto a = comp->compress(kv, budget_opt(150));
  auto b = comp->compress(kv, budget_opt(150));
  CHECK(at::equal(a.keys, b.keys));
  CHECK(at::equal(a.values, b.values));
  CHECK(at::equal(a.bias, b.bias));
  CHECK(comp->params()["chunk"] == 256);
  CHECK(comp->params()["r_init"] == 0.45);
  CHECK(make_compressor("chelsea", {{"chunk", "none"}})->params()["chunk"] == "none");
  CHECK(make_compressor("chelsea", {{"family", "qwen2"}})->params()["r_init"] == 0.2);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"chunk", 1}}), doctest::Contains("chunk"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"chunk", "all"}}), doctest::Contains("chunk"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"r_init", 0.7}}), doctest::Contains("r_init"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"alpha", -1}}), doctest::Contains("alpha"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"n_sink", -1}}), doctest::Contains("n_sink"), kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"n_recent", -1}}), doctest::Contains("n_recent"),
                       kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"family", "llama4"}}), doctest::Contains("family"),
                       kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"full_heads", "3"}}), doctest::Contains("full_heads"),
                       kvlab::Error);
  CHECK_THROWS_WITH_AS(make_compressor("chelsea", {{"chunk_size", 3}}), doctest::Contains("chunk_size"),
                       kvlab::Error);
}

// Not run by default (shared CI cores); run with --no-skip.
TEST_CASE("chelsea: timing per layer (3 KV heads, head_dim 64)" * doctest::skip()) {
  for (int64_t n : {4096, 16384}) {
    auto kv = make_kv("random", n, 16, 3, 3, 64, 5, at::kFloat);
    auto comp = make_compressor("chelsea", {});
    auto t0 = std::chrono::steady_clock::now();
    auto c = comp->compress(kv, budget_opt(n / 5));
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("chelsea n=", n, " ratio=0.2: ", ms, " ms per layer (3 KV heads), ", ms / 3, " ms per head");
    CHECK(c.keys.size(1) == n / 5);
  }
}

}  // TEST_SUITE
