// Greedy k-center (farthest-first traversal). O(n·k·d) time, O(n·d) extra memory.
//
// Two implementations of one arithmetic: kcenter_reference, the plain loop (each point's squared
// distance to the new centre summed over the d coordinates in order), and kcenter_lanes, the one
// greedy_kcenter runs, which stores the points transposed and sums the same terms in the same order
// for many points at once, so the compiler vectorizes over points (each SIMD lane is one point's
// sequential sum: bit-identical distances, hence the same centres, assignment and radii; a test
// compares the two). ClusterGen at 4k tokens spent ~12% of a RULER sample in the plain loop.
#include "kvlab/compress/kcenter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

KCenterResult make_result(const std::vector<int64_t>& centres, const std::vector<int64_t>& assign,
                          const std::vector<double>& radii) {
  KCenterResult out;
  auto lopt = at::TensorOptions().dtype(at::kLong);
  out.centres = at::tensor(centres, lopt);                                // [k]
  out.assignment = at::tensor(assign, lopt);                              // [n]
  out.radii = at::tensor(radii, at::TensorOptions().dtype(at::kDouble));  // [k]
  out.radius = radii.back();
  return out;
}

// The farthest-first traversal, given the squared distances of every point to a centre:
// `to_centre(c, dd)` fills dd[i] = |x_i - x_c|² for i = 0..n-1.
template <class T, class ToCentre>
KCenterResult traverse(int64_t n, int64_t k, int64_t first, ToCentre to_centre) {
  std::vector<T> dist2(n), dd(n);  // squared distance to the nearest centre, to the new centre
  std::vector<int64_t> assign(n, 0);
  std::vector<char> chosen(n, 0);
  std::vector<int64_t> centres;
  std::vector<double> radii;
  centres.reserve(k);
  radii.reserve(k);

  int64_t c = first;
  for (int64_t j = 0; j < k; ++j) {
    centres.push_back(c);
    chosen[c] = 1;
    to_centre(c, dd.data());
    // Update nearest-centre distances; strict < keeps ties on the earlier centre.
    T far = -1;
    int64_t far_i = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (j == 0) {
        dist2[i] = dd[i];
      } else if (dd[i] < dist2[i]) {
        dist2[i] = dd[i];
        assign[i] = j;
      }
      if (!chosen[i] && dist2[i] > far) {  // first index among equals: deterministic
        far = dist2[i];
        far_i = i;
      }
    }
    // Covering radius with j+1 centres = the farthest point's distance (chosen points are at 0).
    radii.push_back(far_i < 0 ? 0.0 : std::sqrt(static_cast<double>(far)));
    c = far_i;
  }
  return make_result(centres, assign, radii);
}

// The plain loop: one point at a time, its d coordinates summed in order.
template <class T>
KCenterResult kcenter_reference(const at::Tensor& pts, int64_t k, int64_t first) {
  const int64_t n = pts.size(0), d = pts.size(1);
  const T* x = pts.data_ptr<T>();  // [n, d] contiguous
  return traverse<T>(n, k, first, [&](int64_t c, T* dd) {
    const T* pc = x + c * d;
    for (int64_t i = 0; i < n; ++i) {
      const T* pi = x + i * d;
      T s = 0;
      for (int64_t e = 0; e < d; ++e) {
        const T diff = pi[e] - pc[e];
        s += diff * diff;
      }
      dd[i] = s;
    }
  });
}

// Every point at once from the points transposed: dd[i] += (x[i][e] - c[e])² for e = 0..d-1,
// the reference's order per point, one SIMD lane per point.
template <class T>
KCenterResult kcenter_lanes(const at::Tensor& pts, int64_t k, int64_t first) {
  const int64_t n = pts.size(0), d = pts.size(1);
  const T* x = pts.data_ptr<T>();                     // [n, d] contiguous
  const at::Tensor xt_tensor = pts.t().contiguous();  // [d, n]
  const T* xt = xt_tensor.data_ptr<T>();
  return traverse<T>(n, k, first, [&](int64_t c, T* __restrict dd) {
    const T* pc = x + c * d;
    std::fill(dd, dd + n, T(0));
    for (int64_t e = 0; e < d; ++e) {
      const T* __restrict row = xt + e * n;
      const T ce = pc[e];
      for (int64_t i = 0; i < n; ++i) {
        const T diff = row[i] - ce;
        dd[i] += diff * diff;
      }
    }
  });
}

template <class T>
KCenterResult dispatch(const at::Tensor& points, int64_t k, int64_t first, bool reference) {
  return reference ? kcenter_reference<T>(points, k, first) : kcenter_lanes<T>(points, k, first);
}

KCenterResult run(const at::Tensor& points, int64_t k, int64_t first, bool reference) {
  KVLAB_CHECK(points.dim() == 2, "greedy_kcenter: points must be [n, d], got {} dims", points.dim());
  const int64_t n = points.size(0);
  KVLAB_CHECK(k >= 1 && k <= n, "greedy_kcenter: k must be in [1, n={}], got {}", n, k);
  KVLAB_CHECK(first >= 0 && first < n, "greedy_kcenter: first must be in [0, {}), got {}", n, first);
  auto pts = points.to(at::kCPU).contiguous();                   // [n, d]
  if (pts.scalar_type() == at::kDouble) return dispatch<double>(pts, k, first, reference);
  return dispatch<float>(pts.to(at::kFloat), k, first, reference);
}

}  // namespace

KCenterResult greedy_kcenter(const at::Tensor& points, int64_t k, int64_t first) {
  return run(points, k, first, /*reference=*/false);
}

KCenterResult greedy_kcenter_reference(const at::Tensor& points, int64_t k, int64_t first) {
  return run(points, k, first, /*reference=*/true);
}

}  // namespace kvlab
