// How clusterable a set of vectors is (SubGen §3.1 / Fig. 1, ClusterGen Fig. 1 made measurable),
// all scale-free so that keys and values can be compared:
//
//   r(k) / diameter   the greedy k-center (Gonzalez) covering radius with k centres, over the
//                     largest pairwise distance; k = 1 .. k_max. Clusterable sets drop fast.
//   m(δ, n)           the number of δ-clusters SubGen's Algorithm 1 (UpdateSoftmaxNormalizer)
//                     opens on the first n vectors streamed in order: a vector joins its nearest
//                     cluster representative (the cluster's first vector) if within δ, else opens a
//                     new cluster. δ = fraction × rms spread (√ mean ‖x − x̄‖²). Sublinear growth
//                     in n (fitted exponent a of m ≈ c·nᵃ below 1) is the paper's assumption.
//   silhouette        mean silhouette (Rousseeuw 1987, as sklearn.metrics.silhouette_score) of
//                     the k-center partition with `silhouette_k` centres: a point's
//                     (b − a) / max(a, b), a = mean distance to its own cluster, b = the smallest
//                     mean distance to another cluster; 0 for a singleton.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "kvlab/core/fit.h"

namespace kvlab {

struct ClusterabilityOptions {
  int64_t k_max = 256;                             // r(k) for k = 1 .. min(k_max, n)
  int64_t silhouette_k = 16;
  std::vector<double> delta_fractions = {0.5, 0.75, 1.0};
  int64_t fit_min_n = 64;                          // m(δ, n) checkpoints below this are not fitted
};

struct DeltaClusterCurve {
  double fraction = 0;             // δ / rms spread
  double delta = 0;
  std::vector<int64_t> n;          // checkpoints: 16, 32, 64, ... and the full count
  std::vector<int64_t> m;          // clusters opened on the first n[i] vectors
  PowerLawFit fit;                 // m ≈ c·nᵃ over checkpoints n >= fit_min_n
};

struct Clusterability {
  int64_t n = 0, dim = 0;
  double diameter = 0;             // max pairwise Euclidean distance
  double rms_spread = 0;           // √ mean ‖x − x̄‖²
  std::vector<double> radius;      // [k_max] r(k), k = 1 .. k_max
  std::vector<double> radius_ratio;  // r(k) / diameter
  std::vector<int64_t> centres;    // the k-center picks in order (first = point 0)
  double silhouette = 0;
  std::vector<DeltaClusterCurve> delta;
};

// x [n, d], n >= 2, any floating dtype (computed in float64).
Clusterability clusterability(const at::Tensor& x, const ClusterabilityOptions& opt = {});

// ---- pieces ----

// Largest pairwise distance of x [n, d].
double diameter(const at::Tensor& x);

// SubGen's δ-cluster rule streamed over x [n, d] in row order: the cluster count after each of the
// (ascending) checkpoints, each in 1 .. n.
std::vector<int64_t> delta_cluster_counts(const at::Tensor& x, double delta, const std::vector<int64_t>& checkpoints);

// Mean silhouette of x [n, d] under labels [n] int64 in 0 .. k-1 (at least 2 distinct labels).
double silhouette_score(const at::Tensor& x, const at::Tensor& labels);

}  // namespace kvlab
