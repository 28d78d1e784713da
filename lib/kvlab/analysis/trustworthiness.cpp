// Trustworthiness, one row at a time: rank every point in the input space by distance to i,
// find i's k nearest in the embedding, and charge each by how far past k its input rank lies.
#include "kvlab/analysis/trustworthiness.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// Squared distances from row i of p [n, d] to every row, into out [n].
void row_sqdist(const double* p, int64_t n, int64_t d, int64_t i, std::vector<double>& out) {
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t a = 0; a < d; ++a) {
      const double t = p[i * d + a] - p[j * d + a];
      s += t * t;
    }
    out[j] = s;
  }
}

}  // namespace

double trustworthiness(const at::Tensor& x_in, const at::Tensor& y_in, int64_t k) {
  KVLAB_CHECK(x_in.dim() == 2 && y_in.dim() == 2 && x_in.size(0) == y_in.size(0),
              "trustworthiness: expected x [n, d] and y [n, e] with the same n, got {} and {}", x_in.sizes(),
              y_in.sizes());
  const int64_t n = x_in.size(0);
  KVLAB_CHECK(k >= 1 && 2 * k < n, "trustworthiness: k must be in [1, n/2) = [1, {}), got {}", (n + 1) / 2, k);
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  auto y = y_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, e]
  const int64_t dx = x.size(1), dy = y.size(1);
  const double* px = x.data_ptr<double>();
  const double* py = y.data_ptr<double>();

  std::vector<double> dist(n), edist(n);
  std::vector<int64_t> order(n), rank(n), nbr(n);
  double penalty = 0;
  for (int64_t i = 0; i < n; ++i) {
    row_sqdist(px, n, dx, i, dist);
    dist[i] = INFINITY;  // i is never its own neighbour: it ranks last
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return dist[a] < dist[b]; });
    for (int64_t r = 0; r < n; ++r) rank[order[r]] = r + 1;
    row_sqdist(py, n, dy, i, edist);
    edist[i] = INFINITY;
    std::iota(nbr.begin(), nbr.end(), 0);
    std::partial_sort(nbr.begin(), nbr.begin() + k, nbr.end(), [&](int64_t a, int64_t b) {
      return edist[a] < edist[b] || (edist[a] == edist[b] && a < b);
    });
    for (int64_t c = 0; c < k; ++c) penalty += double(std::max<int64_t>(0, rank[nbr[c]] - k));
  }
  return 1.0 - penalty * (2.0 / (double(n) * double(k) * (2.0 * double(n) - 3.0 * double(k) - 1.0)));
}

}  // namespace kvlab
