// t-SNE: input similarities (exact or k-nearest-neighbour), initialisation and sklearn's
// two-phase gradient descent. The objectives are in tsne_gradient.cpp.
#include "kvlab/analysis/tsne.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kvlab/analysis/tsne_gradient.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

using tsne_detail::SparseP;

constexpr double kMachineEps = std::numeric_limits<double>::epsilon();
constexpr int kExplorationIter = 250;  // sklearn's _EXPLORATION_MAX_ITER
constexpr int kIterCheck = 50;         // sklearn's _N_ITER_CHECK
constexpr int kIterWithoutProgress = 300;
constexpr double kMinGradNorm = 1e-7;
constexpr double kMinGain = 0.01;
constexpr int64_t kMaxExact = 5000;  // points the exact method accepts (~0.6 GB)

// sklearn's _binary_search_perplexity for one row: d [m] squared distances, p [m] out.
void binary_search_row(const double* d, int64_t m, double perplexity, double* p) {
  const double desired_entropy = std::log(perplexity);
  double beta = 1, beta_min = -INFINITY, beta_max = INFINITY;
  for (int step = 0; step < 100; ++step) {
    double sum_p = 0;
    for (int64_t j = 0; j < m; ++j) {
      p[j] = std::exp(-d[j] * beta);
      sum_p += p[j];
    }
    if (sum_p == 0) sum_p = 1e-8;  // sklearn's EPSILON_DBL
    double sum_dp = 0;
    for (int64_t j = 0; j < m; ++j) {
      p[j] /= sum_p;
      sum_dp += d[j] * p[j];
    }
    const double diff = std::log(sum_p) + beta * sum_dp - desired_entropy;
    if (std::fabs(diff) <= 1e-5) break;
    if (diff > 0) {
      beta_min = beta;
      beta = beta_max == INFINITY ? beta * 2 : (beta + beta_max) / 2;
    } else {
      beta_max = beta;
      beta = beta_min == -INFINITY ? beta / 2 : (beta + beta_min) / 2;
    }
  }
}

// Squared Euclidean distances [n, n] float64, computed from differences (no cancellation).
std::vector<double> dense_sqdist(const at::Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1);
  const double* px = x.data_ptr<double>();
  std::vector<double> out(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) {
      double s = 0;
      for (int64_t a = 0; a < d; ++a) {
        const double t = px[i * d + a] - px[j * d + a];
        s += t * t;
      }
      out[i * n + j] = out[j * n + i] = s;
    }
  return out;
}

// Exact joint P [n * n]: conditional rows over j != i, (C + Cᵀ) / sum, floored at machine eps.
std::vector<double> exact_joint_p(const at::Tensor& x, double perplexity) {
  const int64_t n = x.size(0);
  const std::vector<double> d2 = dense_sqdist(x);
  std::vector<double> cond(size_t(n * n), 0.0), row_d(n - 1), row_p(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0, c = 0; j < n; ++j)
      if (j != i) row_d[c++] = d2[i * n + j];
    binary_search_row(row_d.data(), n - 1, perplexity, row_p.data());
    for (int64_t j = 0, c = 0; j < n; ++j)
      if (j != i) cond[i * n + j] = row_p[c++];
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (j != i) total += cond[i * n + j] + cond[j * n + i];
  total = std::max(total, kMachineEps);
  std::vector<double> p(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (j != i) p[i * n + j] = std::max((cond[i * n + j] + cond[j * n + i]) / total, kMachineEps);
  return p;
}

// Exact k nearest neighbours (self excluded) by blocks of rows: squared distances [n, k] and
// indices [n, k], nearest first.
void knn(const at::Tensor& x, int64_t k, at::Tensor& dist2, at::Tensor& idx) {
  const int64_t n = x.size(0), block = 512;
  auto sq = (x * x).sum(1);  // [n]
  dist2 = at::empty({n, k}, x.options());
  idx = at::empty({n, k}, x.options().dtype(at::kLong));
  for (int64_t s = 0; s < n; s += block) {
    const int64_t e = std::min(n, s + block);
    auto xb = x.slice(0, s, e);                                                    // [b, d]
    auto d = (sq.slice(0, s, e).unsqueeze(1) + sq.unsqueeze(0) - 2 * at::matmul(xb, x.t())).clamp_min(0);  // [b, n]
    auto self = at::arange(s, e, idx.options());
    d.index_put_({at::arange(e - s, idx.options()), self}, INFINITY);
    auto top = at::topk(d, k, /*dim=*/1, /*largest=*/false, /*sorted=*/true);
    dist2.slice(0, s, e).copy_(std::get<0>(top));
    idx.slice(0, s, e).copy_(std::get<1>(top));
  }
}

// Sparse joint P over each point's k nearest neighbours: P = (C + Cᵀ) / sum.
SparseP knn_joint_p(const at::Tensor& x, double perplexity) {
  const int64_t n = x.size(0);
  const int64_t k = std::min<int64_t>(n - 1, int64_t(3.0 * perplexity + 1));
  at::Tensor d2, nbr;
  knn(x, k, d2, nbr);
  auto d2c = d2.contiguous();
  auto nc = nbr.contiguous();
  const double* pd = d2c.data_ptr<double>();
  const int64_t* pn = nc.data_ptr<int64_t>();
  std::vector<double> cond(size_t(n * k));
  for (int64_t i = 0; i < n; ++i) binary_search_row(pd + i * k, k, perplexity, &cond[i * k]);
  std::vector<std::vector<std::pair<int64_t, double>>> rows(n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < k; ++c) {
      rows[i].emplace_back(pn[i * k + c], cond[i * k + c]);
      rows[pn[i * k + c]].emplace_back(i, cond[i * k + c]);
    }
  SparseP p;
  p.n = n;
  p.indptr.assign(1, 0);
  double total = 0;
  for (auto& r : rows) {
    std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t e = 0; e < r.size(); ++e) {
      if (!p.indices.empty() && int64_t(p.indices.size()) > p.indptr.back() && p.indices.back() == r[e].first) {
        p.values.back() += r[e].second;
      } else {
        p.indices.push_back(r[e].first);
        p.values.push_back(r[e].second);
      }
      total += r[e].second;
    }
    p.indptr.push_back(int64_t(p.indices.size()));
  }
  total = std::max(total, kMachineEps);
  for (auto& v : p.values) v /= total;
  return p;
}

using Objective = std::function<double(const std::vector<double>& y, std::vector<double>& grad, bool error)>;

// sklearn's _gradient_descent: iterations it .. max_iter-1; returns the last iteration index.
int gradient_descent(const Objective& objective, std::vector<double>& y, int it, int max_iter, double momentum,
                     double learning_rate, int without_progress, double& error) {
  std::vector<double> update(y.size(), 0.0), gains(y.size(), 1.0), grad(y.size());
  double best_error = std::numeric_limits<double>::max();
  int best_iter = it, i = it;
  error = std::numeric_limits<double>::max();
  for (i = it; i < max_iter; ++i) {
    const bool check = (i + 1) % kIterCheck == 0;
    const bool compute_error = check || i == max_iter - 1;
    const double e = objective(y, grad, compute_error);
    if (compute_error) error = e;
    double norm2 = 0;
    for (double g : grad) norm2 += g * g;
    for (size_t a = 0; a < y.size(); ++a) {
      if (update[a] * grad[a] < 0)
        gains[a] += 0.2;
      else
        gains[a] *= 0.8;
      gains[a] = std::max(gains[a], kMinGain);
      update[a] = momentum * update[a] - learning_rate * gains[a] * grad[a];
      y[a] += update[a];
    }
    if (check) {
      if (error < best_error) {
        best_error = error;
        best_iter = i;
      } else if (i - best_iter > without_progress) {
        break;
      }
      if (std::sqrt(norm2) <= kMinGradNorm) break;
    }
  }
  return std::min(i, max_iter - 1);
}

// N(0, 1) from a 64-bit Mersenne Twister by Box-Muller (the same numbers on every platform).
at::Tensor random_init(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto u = [&] { return (double(gen() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  auto y = at::empty({n, 2}, at::kDouble);
  double* py = y.data_ptr<double>();
  for (int64_t i = 0; i < 2 * n; i += 2) {
    const double r = std::sqrt(-2 * std::log(u())), t = 2 * M_PI * u();
    py[i] = 1e-4 * r * std::cos(t);
    py[i + 1] = 1e-4 * r * std::sin(t);
  }
  return y;
}

}  // namespace

TsneMethod parse_tsne_method(const std::string& name, const std::string& flag) {
  if (name == "exact") return TsneMethod::exact;
  if (name == "barnes_hut") return TsneMethod::barnes_hut;
  KVLAB_FAIL("{} must be 'exact' or 'barnes_hut', got '{}'", flag, name);
}

TsneInit parse_tsne_init(const std::string& name, const std::string& flag) {
  if (name == "pca") return TsneInit::pca;
  if (name == "random") return TsneInit::random;
  KVLAB_FAIL("{} must be 'pca' or 'random', got '{}'", flag, name);
}

at::Tensor conditional_p(const at::Tensor& sqdist, double perplexity) {
  KVLAB_CHECK(sqdist.dim() == 2 && sqdist.size(1) >= 1, "conditional_p: expected [n, m>=1] distances, got {}",
              sqdist.sizes());
  auto d = sqdist.to(at::kDouble).contiguous();  // [n, m]
  auto p = at::empty_like(d);
  const int64_t n = d.size(0), m = d.size(1);
  for (int64_t i = 0; i < n; ++i) binary_search_row(d.data_ptr<double>() + i * m, m, perplexity, p.data_ptr<double>() + i * m);
  return p;
}

at::Tensor pca_init(const at::Tensor& x) {
  auto xc = x.to(at::kDouble) - x.to(at::kDouble).mean(0, /*keepdim=*/true);  // [n, d]
  auto cov = at::matmul(xc.t(), xc) / double(std::max<int64_t>(1, x.size(0) - 1));  // [d, d]
  auto eig = at::linalg_eigh(cov);
  auto vecs = std::get<1>(eig);                       // [d, d], eigenvalues ascending
  auto top = vecs.slice(1, vecs.size(1) - 2).flip({1});  // [d, 2]: largest first
  // Sign: the loading of largest magnitude of each component is positive.
  auto pick = top.abs().argmax(0);                    // [2]
  auto signs = top.gather(0, pick.unsqueeze(0)).sign();  // [1, 2]
  signs = at::where(signs == 0, at::ones_like(signs), signs);
  auto y = at::matmul(xc, top * signs);               // [n, 2]
  auto sd = y.select(1, 0).std(/*unbiased=*/false).item<double>();
  KVLAB_CHECK(sd > 0, "t-SNE init 'pca': the input has no variance (all points equal)");
  return (y / sd * 1e-4).contiguous();
}

TsneResult tsne(const at::Tensor& x_in, const TsneOptions& opt) {
  KVLAB_CHECK(x_in.dim() == 2, "t-SNE: input must be [n, d], got {} dims", x_in.dim());
  const int64_t n = x_in.size(0);
  KVLAB_CHECK(n >= 4, "t-SNE: needs at least 4 points, got {}", n);
  KVLAB_CHECK(opt.perplexity > 0 && opt.perplexity < double(n),
              "--perplexity must be in (0, n = {}) (the number of points), got {}", n, opt.perplexity);
  KVLAB_CHECK(opt.max_iter >= kExplorationIter, "--max-iter must be at least {}, got {}", kExplorationIter,
              opt.max_iter);
  KVLAB_CHECK(opt.early_exaggeration >= 1, "--early-exaggeration must be at least 1, got {}",
              opt.early_exaggeration);
  KVLAB_CHECK(opt.angle > 0 && opt.angle < 1, "--angle must be in (0, 1), got {}", opt.angle);
  // The exact method holds three dense [n, n] float64 matrices (distances, P, the kernel).
  KVLAB_CHECK(opt.method != TsneMethod::exact || n <= kMaxExact, "--method exact keeps three {} x {} float64 "
              "matrices ({:.1f} GB); use --method barnes_hut or at most {} points (--max-points)", n, n,
              3.0 * 8.0 * double(n) * double(n) / 1e9, kMaxExact);
  auto x = x_in.to(at::kCPU).to(at::kDouble).contiguous();  // [n, d]
  KVLAB_CHECK(at::isfinite(x).all().item<bool>(), "t-SNE: the input holds NaN or Inf");

  TsneResult res;
  res.learning_rate = opt.learning_rate > 0 ? opt.learning_rate : std::max(double(n) / opt.early_exaggeration / 4, 50.0);
  at::Tensor y0 = opt.init == TsneInit::pca ? pca_init(x) : random_init(n, opt.seed);  // [n, 2]
  std::vector<double> y(y0.data_ptr<double>(), y0.data_ptr<double>() + 2 * n);

  std::vector<double> dense;
  SparseP sparse;
  double exaggeration = opt.early_exaggeration;
  Objective objective;
  if (opt.method == TsneMethod::exact) {
    dense = exact_joint_p(x, opt.perplexity);
    objective = [&](const std::vector<double>& yy, std::vector<double>& g, bool e) {
      return tsne_detail::exact_kl_gradient(dense, yy, n, g, e);
    };
  } else {
    sparse = knn_joint_p(x, opt.perplexity);
    objective = [&](const std::vector<double>& yy, std::vector<double>& g, bool e) {
      return tsne_detail::bh_kl_gradient(sparse, yy, n, opt.angle, g, e);
    };
  }
  auto scale_p = [&](double f) {
    for (auto& v : dense) v *= f;
    for (auto& v : sparse.values) v *= f;
  };

  // Phase 1: early exaggeration, momentum 0.5.
  scale_p(exaggeration);
  double error = 0;
  int it = gradient_descent(objective, y, 0, kExplorationIter, 0.5, res.learning_rate, kExplorationIter, error);
  scale_p(1.0 / exaggeration);
  // Phase 2: momentum 0.8 up to max_iter.
  if (it < kExplorationIter || opt.max_iter > kExplorationIter)
    it = gradient_descent(objective, y, it + 1, opt.max_iter, 0.8, res.learning_rate, kIterWithoutProgress, error);

  res.kl_divergence = error;
  res.n_iter = it;
  res.embedding = at::tensor(y, at::kDouble).view({n, 2}).clone();
  return res;
}

}  // namespace kvlab
