// t-SNE (van der Maaten & Hinton 2008; Barnes-Hut: van der Maaten 2014) on LibTorch tensors,
// reimplementing scikit-learn's sklearn.manifold.TSNE (1.x) step for step, so that its figures
// and scikit-learn's can be compared:
//
//   P      exact: conditional p_{j|i} over all j != i from squared Euclidean distances, the
//          precision of each row found by binary search on the entropy (100 steps, tol 1e-5,
//          target log(perplexity)), then P = (C + Cᵀ) / sum, floored at machine epsilon.
//          barnes_hut: the same over each point's k = min(n-1, floor(3·perplexity + 1)) nearest
//          neighbours only, symmetrised and normalised as a sparse matrix.
//   Y0     init "pca": the first two principal components, scaled so that column 0 has standard
//          deviation 1e-4; init "random": N(0, 1e-4²) from `seed`.
//   Q      Student t with one degree of freedom: q_ij ∝ 1 / (1 + |y_i − y_j|²).
//   grad   4 Σ_j (p_ij − q_ij)(1 + |y_i − y_j|²)⁻¹ (y_i − y_j); Barnes-Hut: the repulsive part from
//          a quadtree, a cell summarised by its centre of mass when width² / dist² < angle²
//          (self-interactions skipped, as sklearn's _QuadTree.summarize does).
//   descent  gradient descent with momentum and per-coordinate gains (+0.2 where the update and
//          gradient disagree in sign, ×0.8 otherwise, floored at 0.01): 250 iterations with P ×
//          early_exaggeration and momentum 0.5, then momentum 0.8 up to max_iter; stop early when
//          the KL divergence (checked every 50 iterations) made no progress for 300 iterations
//          (250 in the first phase) or the gradient norm falls to 1e-7.
//   learning rate  "auto" (learning_rate <= 0): max(n / early_exaggeration / 4, 50).
//
// Deviations: computed in float64 throughout (sklearn: float32 distances in the binary search,
// float32 Barnes-Hut); nearest neighbours are exact (sklearn: also exact, via its trees); PCA is
// the exact eigendecomposition of the covariance (sklearn: randomized SVD), signs fixed so the
// largest-magnitude loading is positive. So embeddings match sklearn's in quality, not bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace kvlab {

enum class TsneMethod { exact, barnes_hut };
enum class TsneInit { pca, random };

struct TsneOptions {
  double perplexity = 30;
  int max_iter = 1000;              // >= 250 (the exploration phase), as sklearn requires
  double learning_rate = 0;         // <= 0: "auto"
  double early_exaggeration = 12;   // >= 1
  double angle = 0.5;               // Barnes-Hut θ
  TsneMethod method = TsneMethod::barnes_hut;
  TsneInit init = TsneInit::pca;
  uint64_t seed = 0;                // init "random" only
};

struct TsneResult {
  at::Tensor embedding;   // [n, 2] float64
  double kl_divergence = 0;  // at the last checked iteration (sklearn's kl_divergence_)
  int n_iter = 0;            // index of the last iteration run (sklearn's n_iter_)
  double learning_rate = 0;  // the one used ("auto" resolved)
};

// "exact" / "barnes_hut"; "pca" / "random". Unknown names are errors naming `flag`.
TsneMethod parse_tsne_method(const std::string& name, const std::string& flag);
TsneInit parse_tsne_init(const std::string& name, const std::string& flag);

// x [n, d], any floating dtype, n >= 4 and perplexity < n (errors name the option).
TsneResult tsne(const at::Tensor& x, const TsneOptions& opt);

// ---- pieces, exposed for tests ----

// Row-wise binary search of sklearn's _binary_search_perplexity. sqdist [n, m] float64 (row i's
// squared distances to its m candidates, self excluded); returns conditional P [n, m] float64, each
// row summing to 1 with entropy log(perplexity) (to tol 1e-5 nats where 100 steps suffice).
at::Tensor conditional_p(const at::Tensor& sqdist, double perplexity);

// The first two principal components of x [n, d], scaled so column 0 has std 1e-4: [n, 2] float64.
at::Tensor pca_init(const at::Tensor& x);

}  // namespace kvlab
