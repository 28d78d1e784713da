// Query norms (ClusterGen Table 1): mean ‖q‖₂ per prompt, its mean over prompts with a 95%
// confidence interval (Student t, n − 1 degrees of freedom), and its trend with the position in
// the sequence (mean norm per position bin, and the least-squares slope per 1,000 tokens).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace kvlab {

// q [n_q_heads, n_q, head_dim] -> [n_q] float64: ‖q‖₂ per position, averaged over heads.
at::Tensor query_norm_per_position(const at::Tensor& q);

struct MeanCI {
  double mean = 0, low = 0, high = 0;  // low/high: mean ∓ t₀.₉₇₅(n−1) · sd / √n (equal to mean when n = 1)
  int64_t n = 0;
  double sd = 0;                       // sample standard deviation (n − 1)
};
MeanCI mean_ci95(const std::vector<double>& v);  // v non-empty

// Two-sided 95% Student t critical value with `df` degrees of freedom (df >= 1).
double t_critical_95(int64_t df);

struct NormTrend {
  std::vector<int64_t> bin_start, bin_end;  // position bins [start, end)
  std::vector<double> bin_mean;             // mean ‖q‖ over the positions (and prompts) in each bin
  std::vector<int64_t> bin_count;
  double slope_per_1k = 0;                  // least squares of ‖q‖ on position, per 1,000 tokens
  double pearson_r = 0;
};
// positions, norms: one entry per (prompt, position); bins of `bin` tokens from 0.
NormTrend norm_trend(const std::vector<int64_t>& positions, const std::vector<double>& norms, int64_t bin);

}  // namespace kvlab
