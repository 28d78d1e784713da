// A method as a run names it: its registry name, the parameters given, and the compressor built
// from them; and the lists of budgets and methods a command's flags ask for. Shared by replay,
// generation and the benchmarks.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/compress/budget.h"
#include "kvlab/compress/compressor.h"

namespace kvlab {

struct MethodSpec {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  std::shared_ptr<const Compressor> compressor;  // built from name + params
};

// Exactly one of the lists must be non-empty; each value validated by Budget with the flag's name.
std::vector<Budget> budget_settings(const std::vector<double>& ratios, const std::vector<int64_t>& budgets,
                                    const std::vector<int64_t>& halvings);

// `spec`: "a,b" or "all". `flag_params`: "key=value" (every method) or "method.key=value";
// `config_params`: {"method": {"key": value}}. Unknown methods and parameters are errors.
std::vector<MethodSpec> build_methods(const std::string& spec, const std::vector<std::string>& flag_params,
                                      const nlohmann::json& config_params);

}  // namespace kvlab
