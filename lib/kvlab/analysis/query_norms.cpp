// Query norm statistics: per-position norms, t-based confidence intervals, binned trend.
#include "kvlab/analysis/query_norms.h"

#include <algorithm>
#include <cmath>

#include "kvlab/core/check.h"

namespace kvlab {

at::Tensor query_norm_per_position(const at::Tensor& q) {
  KVLAB_CHECK(q.dim() == 3, "query_norm_per_position: q must be [heads, n_q, head_dim], got {}", q.sizes());
  return q.to(at::kCPU).to(at::kDouble).norm(2, {2}).mean(0);  // [n_q]
}

double t_critical_95(int64_t df) {
  KVLAB_CHECK(df >= 1, "t_critical_95: df must be >= 1, got {}", df);
  // t_{0.975, df} for df = 1..30, then 40, 60, 120 and the normal limit.
  static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                             2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df <= 30) return t[df - 1];
  if (df <= 40) return 2.021;
  if (df <= 60) return 2.000;
  if (df <= 120) return 1.980;
  return 1.960;
}

MeanCI mean_ci95(const std::vector<double>& v) {
  KVLAB_CHECK(!v.empty(), "mean_ci95: no values");
  MeanCI r;
  r.n = int64_t(v.size());
  for (double x : v) r.mean += x;
  r.mean /= double(r.n);
  if (r.n > 1) {
    double ss = 0;
    for (double x : v) ss += (x - r.mean) * (x - r.mean);
    r.sd = std::sqrt(ss / double(r.n - 1));
  }
  const double half = r.n > 1 ? t_critical_95(r.n - 1) * r.sd / std::sqrt(double(r.n)) : 0.0;
  r.low = r.mean - half;
  r.high = r.mean + half;
  return r;
}

NormTrend norm_trend(const std::vector<int64_t>& positions, const std::vector<double>& norms, int64_t bin) {
  KVLAB_CHECK(positions.size() == norms.size() && !norms.empty(), "norm_trend: {} positions for {} norms",
              positions.size(), norms.size());
  KVLAB_CHECK(bin >= 1, "norm_trend: bin must be >= 1, got {}", bin);
  NormTrend t;
  const int64_t pmax = *std::max_element(positions.begin(), positions.end());
  const int64_t nb = pmax / bin + 1;
  std::vector<double> sum(nb, 0.0);
  std::vector<int64_t> cnt(nb, 0);
  double mx = 0, my = 0;
  for (size_t i = 0; i < norms.size(); ++i) {
    sum[positions[i] / bin] += norms[i];
    cnt[positions[i] / bin] += 1;
    mx += double(positions[i]);
    my += norms[i];
  }
  mx /= double(norms.size());
  my /= double(norms.size());
  for (int64_t b = 0; b < nb; ++b)
    if (cnt[b] > 0) {
      t.bin_start.push_back(b * bin);
      t.bin_end.push_back((b + 1) * bin);
      t.bin_mean.push_back(sum[b] / double(cnt[b]));
      t.bin_count.push_back(cnt[b]);
    }
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < norms.size(); ++i) {
    const double dx = double(positions[i]) - mx, dy = norms[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  t.slope_per_1k = sxx > 0 ? 1000.0 * sxy / sxx : 0.0;
  t.pearson_r = sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
  return t;
}

}  // namespace kvlab
