// Greedy k-center (farthest-first traversal). O(n·k·d) time, O(n) extra memory.
#include "kvlab/compress/kcenter.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

template <class T>
KCenterResult kcenter_impl(const at::Tensor& pts, int64_t k, int64_t first) {
  const int64_t n = pts.size(0), d = pts.size(1);
  const T* x = pts.data_ptr<T>();                      // [n, d] contiguous
  std::vector<T> dist2(n);                             // squared distance to the nearest centre
  std::vector<int64_t> assign(n, 0);
  std::vector<char> chosen(n, 0);
  std::vector<int64_t> centres;
  std::vector<double> radii;
  centres.reserve(k);
  radii.reserve(k);

  auto sqdist = [&](int64_t a, int64_t b) {
    const T* pa = x + a * d;
    const T* pb = x + b * d;
    T s = 0;
    for (int64_t j = 0; j < d; ++j) {
      T diff = pa[j] - pb[j];
      s += diff * diff;
    }
    return s;
  };

  int64_t c = first;
  for (int64_t j = 0; j < k; ++j) {
    centres.push_back(c);
    chosen[c] = 1;
    // Update nearest-centre distances; strict < keeps ties on the earlier centre.
    T far = -1;
    int64_t far_i = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (j == 0) {
        dist2[i] = sqdist(i, c);
      } else {
        T dd = sqdist(i, c);
        if (dd < dist2[i]) {
          dist2[i] = dd;
          assign[i] = j;
        }
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

  KCenterResult out;
  auto lopt = at::TensorOptions().dtype(at::kLong);
  out.centres = at::tensor(centres, lopt);                        // [k]
  out.assignment = at::tensor(assign, lopt);                      // [n]
  out.radii = at::tensor(radii, at::TensorOptions().dtype(at::kDouble));  // [k]
  out.radius = radii.back();
  return out;
}

}  // namespace

KCenterResult greedy_kcenter(const at::Tensor& points, int64_t k, int64_t first) {
  KVLAB_CHECK(points.dim() == 2, "greedy_kcenter: points must be [n, d], got {} dims", points.dim());
  const int64_t n = points.size(0);
  KVLAB_CHECK(k >= 1 && k <= n, "greedy_kcenter: k must be in [1, n={}], got {}", n, k);
  KVLAB_CHECK(first >= 0 && first < n, "greedy_kcenter: first must be in [0, {}), got {}", n, first);
  auto pts = points.to(at::kCPU).contiguous();                   // [n, d]
  if (pts.scalar_type() == at::kDouble) return kcenter_impl<double>(pts, k, first);
  return kcenter_impl<float>(pts.to(at::kFloat), k, first);
}

}  // namespace kvlab
