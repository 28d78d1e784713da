// Greedy k-center (Gonzalez 1985; Dyer & Frieze 1985): the farthest-first traversal.
//
// Start from `first`; repeatedly add the point farthest from the centres chosen so far. The
// covering radius after k centres is at most twice the optimum k-center radius (Gonzalez's
// guarantee). Used by `clustergen` (its k centres), and by the clusterability analyses (SubGen
// Fig. 1 / ClusterGen Fig. 1: centres on a t-SNE plot, radius r(k)/diameter for k = 1..256).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

struct KCenterResult {
  at::Tensor centres;     // [k] int64 indices into points, in the order they were picked
  at::Tensor assignment;  // [n] int64 position in `centres` (0..k-1) of each point's nearest centre;
                          // ties go to the earlier centre
  at::Tensor radii;       // [k] float64: radii[j] = covering radius with the first j+1 centres
  double radius = 0;      // = radii[k-1]: max over points of the distance to the nearest centre
};

// points [n, d] (any floating dtype; distances computed in that dtype, Euclidean);
// 1 <= k <= n; 0 <= first < n. A point already chosen is never chosen again, so with k larger
// than the number of distinct points the extra centres are duplicates at distance 0.
KCenterResult greedy_kcenter(const at::Tensor& points, int64_t k, int64_t first = 0);

// The same result from the plain loop (one point at a time), kept as the reference greedy_kcenter's
// vectorized loop is tested against (bit-identical centres, assignment and radii).
KCenterResult greedy_kcenter_reference(const at::Tensor& points, int64_t k, int64_t first = 0);

}  // namespace kvlab
