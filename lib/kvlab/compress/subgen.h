// SubGen's streaming state (Algorithm 1), exposed for generation and for the tests.
// See subgen.cpp for the paper, the estimator and the deviations.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvlab::subgen {

// Online leader clustering (UpdateSoftmaxNormalizer's cluster step): a key joins the nearest
// representative if it is within delta (Euclidean, ≤), else it opens a new cluster and becomes
// its representative. Shared by the state below and by the budget search (which only counts).
class LeaderClustering {
 public:
  LeaderClustering(int64_t d, double delta) : d_(d), delta2_(delta * delta) {}
  // Returns the cluster index of k (a new index == size() - 1 if it opened a cluster).
  int64_t assign(const double* k);
  int64_t size() const { return static_cast<int64_t>(reps_.size()) / d_; }

 private:
  int64_t d_;
  double delta2_;
  std::vector<double> reps_;  // [m·d]
};

struct Cluster {
  int64_t rep = 0;               // token id of the representative x_i
  int64_t count = 0;             // n_i
  std::vector<int64_t> samples;  // S_i: t token ids
};

// One KV head's data structure D, M, µ of Algorithm 1. Token ids are 0, 1, ... in append order.
class SubGenState {
 public:
  // s: value samples; t: samples per cluster; delta: cluster radius.
  SubGenState(int64_t d, double delta, int64_t s, int64_t t, uint64_t seed, uint64_t stream = 0);
  // One step of the stream: UpdateSoftmaxNormalizer, UpdateMatrixProduct, µ += ‖v‖².
  void append(const double* k, const double* v, int64_t dv);

  const std::vector<Cluster>& clusters() const { return clusters_; }
  const std::vector<int64_t>& matrix_samples() const { return m_; }  // M: s ids (-1 = null)
  double mu() const { return mu_; }
  int64_t n_tokens() const { return n_; }
  // QueryStreamAttn's terms as (token id, log-weight):
  //   numerator   z = Σ_{M} µ/(s·‖v‖²) · e^{⟨q,k⟩/√d} v   -> log(µ/(s·‖v‖²)) (−inf if v = 0)
  //   denominator τ = Σ_{D} n_i/t · Σ_{S_i} e^{⟨q,k⟩/√d}   -> log(n_i/t)
  std::vector<std::pair<int64_t, double>> numerator() const;
  std::vector<std::pair<int64_t, double>> denominator() const;

 private:
  double uniform();
  int64_t s_, t_, n_ = 0;
  LeaderClustering lc_;
  std::vector<Cluster> clusters_;
  std::vector<int64_t> m_;
  std::vector<double> m_vnorm2_;  // ‖v‖² of each M entry
  double mu_ = 0;
  std::mt19937_64 gen_;
};

}  // namespace kvlab::subgen
