// HeldSet (the streams' in-place buffers) against the copying path it replaced: append_exact and
// gather_entries (stream.h), over random sequences of appends and evictions.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kvlab/compress/held_set.h"
#include "kvlab/compress/stream.h"

using namespace kvlab;

namespace {

void check_same(const KVSet& a, const KVSet& b) {
  REQUIRE(a.keys.sizes() == b.keys.sizes());
  CHECK(at::equal(a.keys, b.keys));
  CHECK(at::equal(a.values, b.values));
  CHECK(at::equal(a.bias, b.bias));
  CHECK(at::equal(a.pos, b.pos));
}

// m' strictly ascending indices below m.
std::vector<int64_t> random_row(std::mt19937& rng, int64_t m, int64_t m_new) {
  std::vector<int64_t> all(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(m_new));
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

TEST_CASE("HeldSet appends and evicts in place as append_exact and gather_entries do") {
  const int64_t h = 3, d = 5, n = 20;
  std::mt19937 rng(7);
  at::manual_seed(3);
  KVSet ref;
  ref.keys = at::randn({h, n, d});
  ref.values = at::randn({h, n, d});
  ref.bias = at::zeros({h, n});
  ref.pos = at::arange(10, 10 + n, at::kLong).view({1, n}).expand({h, n}).contiguous();
  HeldSet held(ref);
  check_same(held.set(), ref);
  int64_t pos = 10 + n;
  for (int step = 0; step < 200; ++step) {
    // Appends of 1-3 tokens (past the first buffer's room, so it grows), evictions of 0-4 entries
    // per step, per head or the same row for every head.
    const int64_t t = 1 + step % 3;
    auto k = at::randn({h, t, d}), v = at::randn({h, t, d});
    append_exact(ref, k, v, pos);
    held.append(k, v, pos);
    pos += t;
    check_same(held.set(), ref);
    const int64_t m = ref.keys.size(1), m_new = std::max<int64_t>(1, m - int64_t(rng() % 5) - (step % 7 == 0 ? 0 : t));
    std::vector<int64_t> rows;
    if (step % 2) {
      for (int64_t i = 0; i < h; ++i) {
        auto r = random_row(rng, m, m_new);
        rows.insert(rows.end(), r.begin(), r.end());
      }
      held.keep_rows(rows);
    } else {
      auto r = random_row(rng, m, m_new);
      for (int64_t i = 0; i < h; ++i) rows.insert(rows.end(), r.begin(), r.end());
      held.keep_same(r);
    }
    ref = gather_entries(ref, at::tensor(rows, at::kLong).view({h, m_new}));
    check_same(held.set(), ref);
    CHECK(held.size() == m_new);
  }
}

TEST_CASE("HeldSet refuses rows that are not strictly ascending or out of range") {
  KVSet s;
  s.keys = at::randn({2, 4, 3});
  s.values = at::randn({2, 4, 3});
  s.bias = at::zeros({2, 4});
  s.pos = at::arange(0, 4, at::kLong).view({1, 4}).expand({2, 4}).contiguous();
  HeldSet held(s);
  CHECK_THROWS(held.keep_same({1, 1}));
  CHECK_THROWS(held.keep_same({2, 4}));
  CHECK_THROWS(held.keep_rows({0, 1, 2}));  // three indices do not make two rows
  held.keep_rows({0, 3, 1, 2});
  CHECK(at::equal(held.set().pos, at::tensor({0, 3, 1, 2}, at::kLong).view({2, 2})));
}
