// balancekv-mr's building blocks (balancekv_mr.cpp), exposed so tests can check each rule of
// Algorithms 1–2 on cases computed by hand. See balancekv_mr.cpp for the paper and deviations.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvlab::balancekv_mr {

// A uniform double in [0, 1) from 53 bits of the generator: (gen() >> 11) · 2^-53.
double unit_uniform(std::mt19937_64& gen);

struct MrConfig {
  int T = 2;
  int64_t t = 256;
  double c = 0;          // 30·log(n/δ)
  double epsilon = 0.1;
  double r_fixed = 0;    // 0 = running max key norm
  int64_t horizon = 1;   // n of the erasure rule
  bool dry = false;      // SoftmaxBalance keeps the first ⌊m/2⌋ (memory upper bound), no RNG
};

// c = 30·log(n/δ) of SoftmaxBalance (Algorithm 2), δ = 1/n when `delta` is 0.
double balance_c(int64_t horizon, double delta);

// Algorithm 1, line 4: the value-norm bucket i with 2^(i−1) ≤ ‖v‖ < 2^i (‖v‖ > 0).
int value_bucket(double vnorm);

// Tokens seen so far (rows by token id), float64.
struct TokenStore {
  int64_t d = 0, dv = 0;
  std::vector<double> k, v, knorm, vnorm;  // [N·d], [N·dv], [N], [N]
};

// Algorithm 2 over `items` (token ids, in stream order): the self-balancing walk on φ(k)⊗v,
// η_j = +1 with probability p_j = 1/2 − yᵀη/(2cR²) (clamped to [0, 1]), y_i = e^{⟨k_i,k_j⟩/√d}⟨v_i,v_j⟩
// (all values 1 when `scalar_values`), R = e^{r_key²/(2√d)}·r_value; one unit_uniform draw per
// item in order; returns the smaller sign class (+1 on a tie), in stream order.
std::vector<int64_t> softmax_balance(const std::vector<int64_t>& items, const TokenStore& s, bool scalar_values,
                                     const MrConfig& cfg, std::mt19937_64* gen);

}  // namespace kvlab::balancekv_mr
