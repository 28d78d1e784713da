// The growth-exponent fit behind `kvlab bench compress` (lib/kvlab/core/fit.h).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/core/fit.h"

using kvlab::fit_power_law;

TEST_CASE("fit_power_law recovers the exponent and coefficient of exact power laws") {
  const std::vector<double> sizes = {1024, 2048, 4096, 8192, 16384};
  for (double a : {0.0, 0.5, 1.0, 1.37, 2.0, 3.0}) {
    for (double c : {1e-6, 0.25, 3.0}) {
      std::vector<double> t;
      for (double n : sizes) t.push_back(c * std::pow(n, a));
      auto f = fit_power_law(sizes, t);
      CAPTURE(a);
      CAPTURE(c);
      CHECK(std::abs(f.exponent - a) < 1e-9);
      CHECK(std::abs(f.coefficient - c) < 1e-9 * c);
      CHECK(f.r2 == doctest::Approx(1.0).epsilon(1e-12));
      CHECK(f.n_points == sizes.size());
    }
  }
}

TEST_CASE("fit_power_law: unevenly spaced sizes, two points, and noisy data") {
  // Odd sizes on purpose (not powers of two).
  const std::vector<double> sizes = {65, 127, 1000, 3001, 12345, 20000};
  std::vector<double> t;
  for (double n : sizes) t.push_back(7.5 * std::pow(n, 1.25));
  CHECK(std::abs(fit_power_law(sizes, t).exponent - 1.25) < 1e-9);
  CHECK(std::abs(fit_power_law({100, 400}, {3, 48}).exponent - 2.0) < 1e-9);
  // Alternating noise ×1.1, ÷1.1 on t = n at n = 1, 2, 4, 8: with x = k·ln 2 (k = 0..3) and
  // residuals e = (+L, −L, +L, −L), L = ln 1.1, the slope is 1 + Σ(k − 1.5)e_k / (Σ(k − 1.5)²·ln 2)
  // = 1 − 2L / (5 ln 2).
  auto f = fit_power_law({1, 2, 4, 8}, {1 * 1.1, 2 / 1.1, 4 * 1.1, 8 / 1.1});
  CHECK(std::abs(f.exponent - (1 - 2 * std::log(1.1) / (5 * std::log(2.0)))) < 1e-12);
  CHECK(f.r2 < 1.0);
}

TEST_CASE("fit_power_law rejects bad input with a message") {
  CHECK_THROWS_WITH_AS(fit_power_law({1024}, {1.0}), doctest::Contains("at least 2 points"), kvlab::Error);
  CHECK_THROWS_WITH_AS(fit_power_law({1024, 2048}, {1.0}), doctest::Contains("sizes but"), kvlab::Error);
  CHECK_THROWS_WITH_AS(fit_power_law({1024, 2048}, {1.0, 0.0}), doctest::Contains("> 0"), kvlab::Error);
  CHECK_THROWS_WITH_AS(fit_power_law({512, 512}, {1.0, 2.0}), doctest::Contains("two distinct sizes"),
                       kvlab::Error);
}

TEST_CASE("median") {
  CHECK(kvlab::median({3, 1, 2}) == 2);
  CHECK(kvlab::median({4, 1, 3, 2}) == 2.5);
  CHECK(kvlab::median({5}) == 5);
  CHECK_THROWS_AS(kvlab::median({}), kvlab::Error);
}
