#include "kvlab/compress/method_spec.h"

#include <algorithm>

#include "kvlab/core/check.h"
#include "kvlab/core/text.h"

namespace kvlab {

std::vector<Budget> budget_settings(const std::vector<double>& ratios, const std::vector<int64_t>& budgets,
                                    const std::vector<int64_t>& halvings) {
  int given = int(!ratios.empty()) + int(!budgets.empty()) + int(!halvings.empty());
  KVLAB_CHECK(given == 1, "give exactly one of --ratio, --budget, --T (got {})", given);
  std::vector<Budget> out;
  for (double r : ratios) out.push_back(Budget::of_ratio(r));
  for (int64_t b : budgets) out.push_back(Budget::of_entries(b));
  for (int64_t t : halvings) out.push_back(Budget::of_halvings(t));
  return out;
}

std::vector<MethodSpec> build_methods(const std::string& spec, const std::vector<std::string>& flag_params,
                                      const nlohmann::json& config_params) {
  std::vector<std::string> names = spec == "all" ? compressor_names() : split(spec, ',');
  KVLAB_CHECK(config_params.is_object(), "'params' in the config must be an object of method -> parameters");
  for (auto it = config_params.begin(); it != config_params.end(); ++it) {
    bool listed = std::find(names.begin(), names.end(), it.key()) != names.end();
    KVLAB_CHECK(listed, "config 'params' names method '{}', which is not in --method ({})", it.key(), spec);
  }
  std::vector<MethodSpec> out;
  for (const auto& name : names) {
    KVLAB_CHECK(!name.empty(), "--method: empty method name in '{}'", spec);
    KVLAB_CHECK(std::count(names.begin(), names.end(), name) == 1, "--method: '{}' is listed more than once in '{}'",
                name, spec);
    nlohmann::json params = config_params.contains(name) ? config_params[name] : nlohmann::json::object();
    for (const auto& kv : flag_params) {
      auto eq = kv.find('=');
      KVLAB_CHECK(eq != std::string::npos && eq > 0, "--param: expected key=value or method.key=value, got '{}'", kv);
      std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
      auto dot = key.find('.');
      if (dot != std::string::npos) {
        std::string scope = key.substr(0, dot);
        bool known = std::find(names.begin(), names.end(), scope) != names.end();
        KVLAB_CHECK(known, "--param {}: method '{}' is not in --method ({})", kv, scope, spec);
        if (scope != name) continue;
        key = key.substr(dot + 1);
      }
      params[key] = value;  // strings; Params parses numbers and booleans with the key's name
    }
    MethodSpec m;
    m.name = name;
    m.params = params;
    m.compressor = make_compressor(name, params);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace kvlab
