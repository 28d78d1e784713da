// few_rows_linear (issue 25) against at::linear, the reference it replaces for 2..32 rows.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "kvlab/model/few_rows.h"

using namespace kvlab;

namespace {
// Largest |a - b| relative to the largest |b|.
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-30, b.abs().max().item<double>());
}
}  // namespace

TEST_CASE("few_rows_linear equals at::linear: rows, widths off the 16-lane and 4-row blocks, bias, threads") {
  at::manual_seed(7);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t B : {2, 3, 10, 32})
      for (int64_t K : {1, 15, 16, 64, 577})
        for (int64_t N : {1, 3, 4, 7, 300, 1001}) {
          auto x = at::randn({B, K});  // [B, K]
          auto w = at::randn({N, K});  // [N, K]
          auto b = at::randn({N});     // [N]
          CAPTURE(threads);
          CAPTURE(B);
          CAPTURE(K);
          CAPTURE(N);
          REQUIRE(few_rows_applies(x, w, at::Tensor()));
          auto want = at::linear(x.to(at::kDouble), w.to(at::kDouble));  // [B, N], summed in double
          CHECK(rel_diff(few_rows_linear(x, w).to(at::kDouble), want) < 1e-5);
          auto want_b = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
          CHECK(rel_diff(few_rows_linear(x, w, b).to(at::kDouble), want_b) < 1e-5);
        }
  }
  at::set_num_threads(saved);
}

TEST_CASE("few_rows_applies: only what the kernel takes") {
  auto x = at::randn({4, 8}), w = at::randn({5, 8});
  CHECK(few_rows_applies(x, w, at::randn({5})));
  CHECK_FALSE(few_rows_applies(x.narrow(0, 0, 1), w, at::Tensor()));       // one row: at::mv
  CHECK_FALSE(few_rows_applies(at::randn({33, 8}), w, at::Tensor()));      // more than kFewRowsMax
  CHECK_FALSE(few_rows_applies(x.to(at::kDouble), w, at::Tensor()));       // not float32
  CHECK_FALSE(few_rows_applies(x, w.t().contiguous().t(), at::Tensor()));  // w not contiguous
  CHECK_FALSE(few_rows_applies(x, at::randn({5, 9}), at::Tensor()));       // K differs
  CHECK_FALSE(few_rows_applies(x, w, at::randn({4})));                     // bias length
  CHECK_THROWS_WITH(few_rows_linear(x, at::randn({5, 9})), doctest::Contains("few_rows_linear"));
}
