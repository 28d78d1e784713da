// t-SNE objectives: exact O(n²) and Barnes-Hut O(n log n) (a quadtree rebuilt every iteration).
// The formulas are sklearn's _kl_divergence and _barnes_hut_tsne.gradient with one degree of
// freedom (2-D embeddings): w_ij = 1 / (1 + |y_i − y_j|²), Z = Σ_{i≠j} w_ij, q_ij = w_ij / Z,
//   grad_i = 4 Σ_j (p_ij − q_ij) w_ij (y_i − y_j),   KL = Σ_{i≠j} p_ij log(p_ij / q_ij).
#include "kvlab/analysis/tsne_gradient.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

namespace kvlab::tsne_detail {
namespace {

constexpr double kMachineEps = std::numeric_limits<double>::epsilon();
constexpr double kFloat32Tiny = FLT_MIN;  // sklearn's FLOAT32_TINY in the Barnes-Hut error
constexpr double kDupEps = 1e-6;          // sklearn's _QuadTree EPSILON: coordinates this close coincide

// A quadtree over 2-D points: a leaf holds one point (or several coinciding within kDupEps).
class QuadTree {
 public:
  struct Cell {
    double lo[2], hi[2];
    double bary[2] = {0, 0};  // centre of mass of the points below
    int64_t size = 0;         // points below
    int32_t child[4] = {-1, -1, -1, -1};
    bool leaf = true;
    double sq_width = 0;      // max over dims of (hi − lo)²
  };

  QuadTree(const std::vector<double>& y, int64_t n) {
    double lo[2] = {std::numeric_limits<double>::max(), std::numeric_limits<double>::max()};
    double hi[2] = {-lo[0], -lo[1]};
    for (int64_t i = 0; i < n; ++i)
      for (int a = 0; a < 2; ++a) {
        lo[a] = std::min(lo[a], y[2 * i + a]);
        hi[a] = std::max(hi[a], y[2 * i + a]);
      }
    for (int a = 0; a < 2; ++a) hi[a] += 1e-3 * (hi[a] - lo[a]) + 1e-12;  // points strictly inside
    cells_.reserve(4 * n + 1);
    add_cell(lo, hi);
    for (int64_t i = 0; i < n; ++i) insert(&y[2 * i]);
  }

  // Repulsive force on point p: adds Σ size·w·w·(p − bary) into neg[2] and returns Σ size·w,
  // over the cells summarising everything but p itself.
  double repulsion(const double* p, double theta2, double* neg, std::vector<int32_t>& stack) const {
    double sum_w = 0;
    stack.clear();
    stack.push_back(0);
    while (!stack.empty()) {
      const Cell& c = cells_[stack.back()];
      stack.pop_back();
      if (c.size == 0) continue;
      const double dx = p[0] - c.bary[0], dy = p[1] - c.bary[1];
      const double d2 = dx * dx + dy * dy;
      if (c.leaf && std::fabs(dx) <= kDupEps && std::fabs(dy) <= kDupEps) continue;  // self
      if (c.leaf || c.sq_width / d2 < theta2) {
        const double w = 1.0 / (1.0 + d2);
        const double sw = double(c.size) * w;
        sum_w += sw;
        neg[0] += sw * w * dx;
        neg[1] += sw * w * dy;
        continue;
      }
      for (int q = 0; q < 4; ++q)
        if (c.child[q] >= 0) stack.push_back(c.child[q]);
    }
    return sum_w;
  }

 private:
  std::vector<Cell> cells_;

  int32_t add_cell(const double* lo, const double* hi) {
    Cell c;
    for (int a = 0; a < 2; ++a) {
      c.lo[a] = lo[a];
      c.hi[a] = hi[a];
      c.sq_width = std::max(c.sq_width, (hi[a] - lo[a]) * (hi[a] - lo[a]));
    }
    cells_.push_back(c);
    return int32_t(cells_.size() - 1);
  }

  static int quadrant(const Cell& c, const double* p) {
    int q = 0;
    for (int a = 0; a < 2; ++a)
      if (p[a] >= 0.5 * (c.lo[a] + c.hi[a])) q |= 1 << a;
    return q;
  }

  int32_t child(int32_t ci, int q) {
    if (cells_[ci].child[q] >= 0) return cells_[ci].child[q];
    double lo[2], hi[2];
    for (int a = 0; a < 2; ++a) {
      const double mid = 0.5 * (cells_[ci].lo[a] + cells_[ci].hi[a]);
      lo[a] = (q >> a & 1) ? mid : cells_[ci].lo[a];
      hi[a] = (q >> a & 1) ? cells_[ci].hi[a] : mid;
    }
    const int32_t id = add_cell(lo, hi);  // may reallocate: index, never hold a reference across
    cells_[ci].child[q] = id;
    return id;
  }

  static void absorb(Cell& c, const double* p) {
    for (int a = 0; a < 2; ++a) c.bary[a] = (c.bary[a] * double(c.size) + p[a]) / double(c.size + 1);
    c.size += 1;
  }

  void insert(const double* p) {
    int32_t ci = 0;
    for (;;) {
      if (cells_[ci].leaf) {
        Cell& c = cells_[ci];
        if (c.size == 0 || (std::fabs(c.bary[0] - p[0]) <= kDupEps && std::fabs(c.bary[1] - p[1]) <= kDupEps)) {
          absorb(c, p);
          return;
        }
        // Split: the leaf's content moves into the child holding it; then insert below.
        const int q = quadrant(c, c.bary);
        const double bary[2] = {c.bary[0], c.bary[1]};
        const int64_t size = c.size;
        const int32_t ch = child(ci, q);
        cells_[ch].bary[0] = bary[0];
        cells_[ch].bary[1] = bary[1];
        cells_[ch].size = size;
        cells_[ci].leaf = false;
      }
      absorb(cells_[ci], p);
      ci = child(ci, quadrant(cells_[ci], p));
    }
  }
};

}  // namespace

double exact_kl_gradient(const std::vector<double>& p, const std::vector<double>& y, int64_t n,
                         std::vector<double>& grad, bool compute_error) {
  std::vector<double> w(size_t(n * n), 0.0);  // [n, n] Student-t kernel, diagonal 0
  double z = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) {
      const double dx = y[2 * i] - y[2 * j], dy = y[2 * i + 1] - y[2 * j + 1];
      const double wij = 1.0 / (1.0 + dx * dx + dy * dy);
      w[i * n + j] = w[j * n + i] = wij;
      z += 2 * wij;
    }
  double kl = 0;
  std::fill(grad.begin(), grad.end(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double gx = 0, gy = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == i) continue;
      const double wij = w[i * n + j];
      const double q = std::max(wij / z, kMachineEps);
      const double pij = p[i * n + j];
      const double f = (pij - q) * wij;
      gx += f * (y[2 * i] - y[2 * j]);
      gy += f * (y[2 * i + 1] - y[2 * j + 1]);
      if (compute_error) kl += pij * std::log(std::max(pij, kMachineEps) / q);
    }
    grad[2 * i] = 4 * gx;
    grad[2 * i + 1] = 4 * gy;
  }
  return kl;
}

double bh_kl_gradient(const SparseP& p, const std::vector<double>& y, int64_t n, double angle,
                      std::vector<double>& grad, bool compute_error) {
  // Repulsion: Σ_j w_ij² (y_i − y_j) / Z, with Z = Σ_{i≠j} w_ij estimated by the same tree.
  QuadTree tree(y, n);
  std::vector<double> neg(size_t(2 * n), 0.0);
  std::vector<int32_t> stack;
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += tree.repulsion(&y[2 * i], angle * angle, &neg[2 * i], stack);
  // Attraction over P's pattern: Σ_j p_ij w_ij (y_i − y_j).
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    double px = 0, py = 0;
    for (int64_t e = p.indptr[i]; e < p.indptr[i + 1]; ++e) {
      const int64_t j = p.indices[e];
      const double dx = y[2 * i] - y[2 * j], dy = y[2 * i + 1] - y[2 * j + 1];
      const double wij = 1.0 / (1.0 + dx * dx + dy * dy);
      const double pij = p.values[e];
      px += pij * wij * dx;
      py += pij * wij * dy;
      if (compute_error)
        kl += pij * std::log(std::max(pij, kFloat32Tiny) / std::max(wij / z, kFloat32Tiny));
    }
    grad[2 * i] = 4 * (px - neg[2 * i] / z);
    grad[2 * i + 1] = 4 * (py - neg[2 * i + 1] / z);
  }
  return kl;
}

}  // namespace kvlab::tsne_detail
