// Trustworthiness of an embedding (Venna & Kaski 2001), as sklearn.manifold.trustworthiness:
//
//   T(k) = 1 − 2 / (n k (2n − 3k − 1)) · Σ_i Σ_{j ∈ N_k(i)} max(0, r(i, j) − k)
//
// N_k(i): the k nearest neighbours of i in the embedding (i excluded); r(i, j): the rank of j
// among i's neighbours in the input space (nearest = 1), Euclidean in both spaces. 1 when every
// embedded neighbourhood is an input neighbourhood; unexpected neighbours cost their input rank.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvlab {

// x [n, d] input, y [n, e] embedding (any floating dtype, same n); 1 <= k < n / 2 (as sklearn
// requires). O(n² log n) time, O(n) extra memory; distances in float64.
double trustworthiness(const at::Tensor& x, const at::Tensor& y, int64_t k);

}  // namespace kvlab
