#include "kvlab/core/fit.h"

#include <algorithm>
#include <cmath>

#include "kvlab/core/check.h"

namespace kvlab {

PowerLawFit fit_power_law(const std::vector<double>& xs, const std::vector<double>& ys) {
  KVLAB_CHECK(xs.size() == ys.size(), "fit_power_law: {} sizes but {} times", xs.size(), ys.size());
  KVLAB_CHECK(xs.size() >= 2, "fit_power_law: need at least 2 points, got {}", xs.size());
  const size_t m = xs.size();
  std::vector<double> lx(m), ly(m);
  for (size_t i = 0; i < m; ++i) {
    KVLAB_CHECK(xs[i] > 0 && ys[i] > 0 && std::isfinite(xs[i]) && std::isfinite(ys[i]),
                "fit_power_law: point {} is (n={}, t={}); both must be finite and > 0", i, xs[i], ys[i]);
    lx[i] = std::log(xs[i]);
    ly[i] = std::log(ys[i]);
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < m; ++i) mx += lx[i], my += ly[i];
  mx /= double(m);
  my /= double(m);
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < m; ++i) {
    sxx += (lx[i] - mx) * (lx[i] - mx);
    sxy += (lx[i] - mx) * (ly[i] - my);
    syy += (ly[i] - my) * (ly[i] - my);
  }
  KVLAB_CHECK(sxx > 0, "fit_power_law: all {} sizes are equal ({}); need two distinct sizes", m, xs[0]);
  PowerLawFit f;
  f.exponent = sxy / sxx;
  f.coefficient = std::exp(my - f.exponent * mx);
  f.r2 = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  f.n_points = m;
  return f;
}

double median(std::vector<double> v) {
  KVLAB_CHECK(!v.empty(), "median of an empty list");
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace kvlab
