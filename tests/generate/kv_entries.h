// Test helper shared by the generation tests.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace kvlab::test {

// Per-head real entries of a set (bias > -inf), as (key row, bias), sorted: compares two sets
// whatever the order of their entries.
inline std::vector<std::pair<std::vector<double>, double>> real_entries(const at::Tensor& keys, const at::Tensor& bias,
                                                                       int64_t h) {
  std::vector<std::pair<std::vector<double>, double>> out;
  auto k = keys[h].to(at::kDouble).contiguous();
  for (int64_t j = 0; j < keys.size(1); ++j) {
    const double b = bias[h][j].item<double>();
    if (std::isinf(b)) continue;
    out.emplace_back(std::vector<double>(k[j].data_ptr<double>(), k[j].data_ptr<double>() + k.size(1)), b);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kvlab::test
