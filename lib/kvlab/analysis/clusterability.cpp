// Clusterability numbers: k-center radii over the diameter, δ-cluster growth, silhouette.
#include "kvlab/analysis/clusterability.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlab/compress/kcenter.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// Pairwise Euclidean distances of rows [s, e) of x to all rows: [e − s, n] float64.
at::Tensor block_dist(const at::Tensor& x, const at::Tensor& sq, int64_t s, int64_t e) {
  auto xb = x.slice(0, s, e);                                                             // [b, d]
  auto d2 = sq.slice(0, s, e).unsqueeze(1) + sq.unsqueeze(0) - 2 * at::matmul(xb, x.t());  // [b, n]
  return d2.clamp_min(0).sqrt();
}

constexpr int64_t kBlock = 256;

}  // namespace

double diameter(const at::Tensor& x_in) {
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  auto sq = (x * x).sum(1);                                 // [n]
  double best = 0;
  for (int64_t s = 0; s < x.size(0); s += kBlock)
    best = std::max(best, block_dist(x, sq, s, std::min(x.size(0), s + kBlock)).max().item<double>());
  return best;
}

std::vector<int64_t> delta_cluster_counts(const at::Tensor& x_in, double delta,
                                          const std::vector<int64_t>& checkpoints) {
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  const int64_t n = x.size(0), d = x.size(1);
  KVLAB_CHECK(delta > 0, "delta_cluster_counts: δ must be > 0, got {}", delta);
  const double* px = x.data_ptr<double>();
  const double delta2 = delta * delta;
  std::vector<int64_t> reps;  // row of each cluster's representative (its first vector)
  std::vector<int64_t> out;
  size_t next = 0;
  for (int64_t i = 0; i < n && next < checkpoints.size(); ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t r : reps) {
      double s = 0;
      for (int64_t a = 0; a < d && s < best; ++a) {
        const double t = px[i * d + a] - px[r * d + a];
        s += t * t;
      }
      best = std::min(best, s);
    }
    if (!(best <= delta2)) reps.push_back(i);  // ‖k − x_i*‖ > δ: a new cluster
    while (next < checkpoints.size() && checkpoints[next] == i + 1) {
      out.push_back(int64_t(reps.size()));
      ++next;
    }
  }
  KVLAB_CHECK(out.size() == checkpoints.size(), "delta_cluster_counts: checkpoints must ascend within 1 .. n = {}", n);
  return out;
}

double silhouette_score(const at::Tensor& x_in, const at::Tensor& labels_in) {
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  auto labels = labels_in.to(at::kCPU).to(at::kLong).contiguous();  // [n]
  const int64_t n = x.size(0);
  KVLAB_CHECK(labels.dim() == 1 && labels.size(0) == n, "silhouette_score: labels must be [n = {}], got {}", n,
              labels.sizes());
  const int64_t k = labels.max().item<int64_t>() + 1;
  auto onehot = at::zeros({n, k}, x.options());  // [n, k]
  onehot.scatter_(1, labels.unsqueeze(1), 1.0);
  auto counts = onehot.sum(0);                    // [k]
  KVLAB_CHECK((counts > 0).sum().item<int64_t>() >= 2, "silhouette_score: needs at least 2 non-empty clusters");
  auto sq = (x * x).sum(1);
  double total = 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t e = std::min(n, s + kBlock);
    auto sums = at::matmul(block_dist(x, sq, s, e), onehot);  // [b, k] distance sums per cluster
    auto lab = labels.slice(0, s, e);                        // [b]
    auto own_count = counts.index_select(0, lab);            // [b]
    auto a = sums.gather(1, lab.unsqueeze(1)).squeeze(1) / (own_count - 1).clamp_min(1);  // self distance is 0
    auto means = sums / counts.unsqueeze(0);                 // [b, k]
    means.scatter_(1, lab.unsqueeze(1), INFINITY);           // not its own cluster
    means.masked_fill_((counts == 0).unsqueeze(0).expand_as(means), INFINITY);
    auto b = std::get<0>(means.min(1));                      // [b]
    auto sil = (b - a) / at::maximum(a, b);
    sil = at::where(own_count > 1, sil, at::zeros_like(sil));  // singletons: 0
    total += sil.sum().item<double>();
  }
  return total / double(n);
}

Clusterability clusterability(const at::Tensor& x_in, const ClusterabilityOptions& opt) {
  KVLAB_CHECK(x_in.dim() == 2 && x_in.size(0) >= 2, "clusterability: expected [n >= 2, d] vectors, got {}",
              x_in.sizes());
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  Clusterability c;
  c.n = x.size(0);
  c.dim = x.size(1);
  c.diameter = diameter(x);
  c.rms_spread = std::sqrt((x - x.mean(0, true)).pow(2).sum(1).mean().item<double>());

  const int64_t kmax = std::min(opt.k_max, c.n);
  auto kc = greedy_kcenter(x, std::max(kmax, std::min(opt.silhouette_k, c.n)), /*first=*/0);
  auto radii = kc.radii.contiguous();
  for (int64_t j = 0; j < kmax; ++j) {
    c.radius.push_back(radii[j].item<double>());
    c.radius_ratio.push_back(c.diameter > 0 ? c.radius.back() / c.diameter : 0.0);
  }
  auto cen = kc.centres.contiguous();
  c.centres.assign(cen.data_ptr<int64_t>(), cen.data_ptr<int64_t>() + cen.size(0));

  // The partition by the first silhouette_k centres: each point's nearest of them.
  const int64_t ks = std::min(opt.silhouette_k, c.n);
  if (ks >= 2) {
    auto centres = x.index_select(0, kc.centres.slice(0, 0, ks));  // [ks, d]
    auto labels = at::cdist(x, centres).argmin(1);                 // [n]
    if ((labels.max() != labels.min()).item<bool>()) c.silhouette = silhouette_score(x, labels);
  }

  std::vector<int64_t> checkpoints;
  for (int64_t m = 16; m < c.n; m *= 2) checkpoints.push_back(m);
  checkpoints.push_back(c.n);
  for (double f : opt.delta_fractions) {
    KVLAB_CHECK(f > 0, "--delta-fractions must be > 0, got {}", f);
    DeltaClusterCurve curve;
    curve.fraction = f;
    curve.delta = f * c.rms_spread;
    curve.n = checkpoints;
    curve.m = delta_cluster_counts(x, curve.delta, checkpoints);
    std::vector<double> xs, ys;
    for (size_t i = 0; i < checkpoints.size(); ++i)
      if (checkpoints[i] >= opt.fit_min_n) xs.push_back(double(checkpoints[i])), ys.push_back(double(curve.m[i]));
    if (xs.size() >= 2) curve.fit = fit_power_law(xs, ys);
    c.delta.push_back(curve);
  }
  return c;
}

}  // namespace kvlab
