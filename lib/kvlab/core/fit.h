// Small fitting helpers for benchmarks: the growth exponent of a time in n.
//
//   fit_power_law(n, t): least squares of log t = log c + a·log n over the points, i.e.
//     a = Σ (x_i − x̄)(y_i − ȳ) / Σ (x_i − x̄)²,  x = log n, y = log t,  c = exp(ȳ − a·x̄),
//   accumulated in double. t = c·n^a recovers a and c up to rounding.
#pragma once

#include <cstddef>
#include <vector>

namespace kvlab {

struct PowerLawFit {
  double exponent = 0;     // a: slope of log t vs log n
  double coefficient = 0;  // c: t ≈ c·n^a
  double r2 = 1;           // coefficient of determination of the log-log fit (1 for exact power laws)
  size_t n_points = 0;
};

// xs, ys: same length >= 2, every value > 0, at least two distinct xs (errors say which).
PowerLawFit fit_power_law(const std::vector<double>& xs, const std::vector<double>& ys);

// Median of a non-empty list (the mean of the two middle values for an even count).
double median(std::vector<double> v);

}  // namespace kvlab
