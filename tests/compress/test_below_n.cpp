// Every method's own code at a budget below n, against what a naive rule or loop says it must keep.
// (The ratio-1 contract tests reach each method's `budget >= n` shortcut only.)
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "compress_test_util.h"
#include "kvlab/compress/compressor.h"

using namespace kvlab;
using kvlab::test::budget_opt;
using kvlab::test::make_kv;

namespace {

std::vector<int64_t> kept_row(const CompressedKV& c, int64_t h) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < c.kept_idx.size(1); ++j)
    if (c.kept_idx[h][j].item<int64_t>() >= 0) out.push_back(c.kept_idx[h][j].item<int64_t>());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> all_but(int64_t n, std::set<int64_t> dropped) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i)
    if (!dropped.count(i)) out.push_back(i);
  return out;
}

}  // namespace

TEST_SUITE("below n") {

TEST_CASE("streaming_llm and local at n - 1 drop the oldest token outside the sinks") {
  auto kv = make_kv("random", 64, 8);
  auto s = make_compressor("streaming_llm", {})->compress(kv, budget_opt(63));  // n_sink = 4
  auto l = make_compressor("local", {})->compress(kv, budget_opt(63));
  for (int64_t h = 0; h < 2; ++h) {
    CHECK(kept_row(s, h) == all_but(64, {4}));
    CHECK(kept_row(l, h) == all_but(64, {0}));
  }
}

TEST_CASE("uniform at n - 1 keeps n - 1 distinct tokens, each standing for n/(n - 1)") {
  auto kv = make_kv("random", 64, 8);
  auto c = make_compressor("uniform", {})->compress(kv, budget_opt(63));
  for (int64_t h = 0; h < 2; ++h) {
    auto r = kept_row(c, h);
    CHECK(std::set<int64_t>(r.begin(), r.end()).size() == 63);
  }
  CHECK(at::allclose(c.bias, at::full_like(c.bias, std::log(64.0 / 63.0))));
}

TEST_CASE("halving methods at n - 1: one halving of the two oldest tokens, the rest exact") {
  // ⌊64/2⌋ = 32 < 63, so T = 1 and the only halving covers the oldest 2(64 - 63) = 2 tokens.
  auto kv = make_kv("random", 64, 8);
  for (const char* m : {"uniform-halving", "balancekv"}) {
    INFO("method=" << m);
    auto c = make_compressor(m, {})->compress(kv, budget_opt(63));
    for (int64_t h = 0; h < 2; ++h) {
      auto r = kept_row(c, h);
      REQUIRE(r.size() == 63);
      CHECK((r[0] == 0 || r[0] == 1));
      CHECK(std::vector<int64_t>(r.begin() + 1, r.end()) == all_but(64, {0, 1}));
      for (int64_t j = 0; j < c.kept_idx.size(1); ++j) {
        const int64_t i = c.kept_idx[h][j].item<int64_t>();
        const double b = c.bias[h][j].item<double>();
        if (i >= 2) CHECK(b == doctest::Approx(0.0));
        if (i < 2) CHECK((std::abs(b - std::log(2.0)) < 1e-9 || std::abs(b) < 1e-9));  // weight 2 or 1
      }
    }
  }
}

TEST_CASE("chelsea at n - 1 merges exactly the most similar A->B pair (cosine), degree-weighted") {
  // n_sink = n_recent = 2, one chunk over the 36 middle entries: A = even, B = odd local index.
  const int64_t n = 40, n1 = 2, n2 = 2, d = 16;
  auto kv = make_kv("random", n, 8, 4, 2, d, 3);
  auto c = make_compressor("chelsea", {{"n_sink", n1}, {"n_recent", n2}, {"chunk", "none"}})
               ->compress(kv, budget_opt(n - 1));
  for (int64_t h = 0; h < 2; ++h) {
    double best = -2;
    int64_t ba = -1, bb = -1;
    for (int64_t a = n1; a < n - n2; a += 2)
      for (int64_t b = n1 + 1; b < n - n2; b += 2) {
        auto ka = kv.keys[h][a].to(at::kDouble), kb = kv.keys[h][b].to(at::kDouble);
        const double cos = (ka * kb).sum().item<double>() / (ka.norm() * kb.norm()).item<double>();
        if (cos > best) best = cos, ba = a, bb = b;
      }
    // The merged entry: the mean key and value of the pair, bias log 2; every other key unchanged.
    auto want_k = (kv.keys[h][ba] + kv.keys[h][bb]) / 2, want_v = (kv.values[h][ba] + kv.values[h][bb]) / 2;
    int64_t merged = 0, exact = 0;
    for (int64_t j = 0; j < c.keys.size(1); ++j) {
      if (std::isinf(c.bias[h][j].item<double>())) continue;
      if (std::abs(c.bias[h][j].item<double>() - std::log(2.0)) < 1e-9) {
        ++merged;
        CHECK(at::allclose(c.keys[h][j], want_k, 1e-5, 1e-6));
        CHECK(at::allclose(c.values[h][j], want_v, 1e-5, 1e-6));
      } else {
        ++exact;
        bool found = false;
        for (int64_t i = 0; i < n && !found; ++i)
          found = i != ba && i != bb && at::equal(c.keys[h][j], kv.keys[h][i]);
        CHECK(found);
      }
    }
    CHECK(merged == 1);
    CHECK(exact == n - 2);
  }
}

TEST_CASE("h2o at n - 1 evicts the lowest accumulated attention outside the recent window (naive loop)") {
  // Region of 64 keys at positions 0..63, 8 queries at 56..63 (causal); recent = ⌊63/2⌋ = 31
  // keeps 33..63; of 0..32 the key with the least summed attention (softmax over every key the
  // query sees, mean over the KV group's 2 query heads) is dropped.
  auto kv = make_kv("heavy", 64, 8, 4, 2, 16, 7);
  kv.query_pos = at::arange(56, 64, at::kLong);
  auto c = make_compressor("h2o", {})->compress(kv, budget_opt(63));
  auto K = kv.keys.to(at::kDouble), Q = kv.queries.to(at::kDouble);
  for (int64_t h = 0; h < 2; ++h) {
    std::vector<double> score(64, 0.0);
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t r = 0; r < 2; ++r) {
        const int64_t qp = 56 + j;
        std::vector<double> e(qp + 1);
        double z = 0;
        for (int64_t i = 0; i <= qp; ++i) z += e[i] = std::exp((Q[h * 2 + r][j] * K[h][i]).sum().item<double>() / 4.0);
        for (int64_t i = 0; i <= qp; ++i) score[i] += e[i] / z / 2;
      }
    const int64_t drop = std::min_element(score.begin(), score.begin() + 33) - score.begin();
    CHECK(kept_row(c, h) == all_but(64, {drop}));
  }
}

}  // TEST_SUITE
