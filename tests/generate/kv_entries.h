// Test helpers shared by the generation tests.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/method_spec.h"

namespace kvlab::test {

// A method by name with its parameters (no preset, no quantizer), as build_methods makes one.
inline MethodSpec method_spec(const std::string& name, const nlohmann::json& params = nlohmann::json::object()) {
  MethodSpec s;
  s.name = name;
  s.params = params;
  s.compressor = make_compressor(name, params);
  return s;
}

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
