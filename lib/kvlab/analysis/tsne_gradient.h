// The two t-SNE objectives (KL divergence of P and Q and its gradient), exact and Barnes-Hut, on
// a flat embedding y [n * 2] (row-major, float64). Internal to tsne.cpp; exposed for tests.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab::tsne_detail {

// Joint probabilities restricted to a sparse pattern (CSR, columns sorted within a row, no i == j).
struct SparseP {
  int64_t n = 0;
  std::vector<int64_t> indptr;  // [n + 1]
  std::vector<int64_t> indices;
  std::vector<double> values;
};

// Exact: p is the dense [n * n] joint P (diagonal ignored). Writes grad [n * 2]; returns
// KL(P || Q) when compute_error, else 0.
double exact_kl_gradient(const std::vector<double>& p, const std::vector<double>& y, int64_t n,
                         std::vector<double>& grad, bool compute_error);

// Barnes-Hut: attractive forces over p's pattern, repulsive ones from a quadtree of y with
// opening criterion width² / dist² < angle². Same outputs as exact_kl_gradient.
double bh_kl_gradient(const SparseP& p, const std::vector<double>& y, int64_t n, double angle,
                      std::vector<double>& grad, bool compute_error);

}  // namespace kvlab::tsne_detail
