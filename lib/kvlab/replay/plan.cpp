#include "kvlab/replay/plan.h"

#include <algorithm>

#include "kvlab/core/check.h"
#include "kvlab/core/text.h"

namespace kvlab {

const std::vector<uint64_t>& paper_seeds() {
  static const std::vector<uint64_t> s = {42, 7, 8, 17, 98, 64, 27, 32, 81, 44};
  return s;
}

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

std::vector<uint64_t> seed_values(int64_t n, const std::vector<int64_t>& explicit_list) {
  if (!explicit_list.empty()) {
    std::vector<uint64_t> out;
    for (int64_t s : explicit_list) {
      KVLAB_CHECK(s >= 0, "--seed-list: seeds must be >= 0, got {}", s);
      out.push_back(uint64_t(s));
    }
    return out;
  }
  KVLAB_CHECK(n >= 1 && n <= 10000, "--seeds must be in [1, 10000], got {}", n);
  std::vector<uint64_t> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(i < int64_t(paper_seeds().size()) ? paper_seeds()[size_t(i)] : uint64_t(1000 + i));
  return out;
}

std::pair<int, int> parse_shard(const std::string& spec) {
  auto parts = split(spec, '/');
  int i = -1, n = 0;
  try {
    if (parts.size() == 2) i = std::stoi(parts[0]), n = std::stoi(parts[1]);
  } catch (const std::exception&) {
  }
  KVLAB_CHECK(parts.size() == 2 && n >= 1 && i >= 0 && i < n, "--shard: expected i/N with 0 <= i < N, got '{}'", spec);
  return {i, n};
}

std::vector<int> select_layers(const CaptureMeta& meta, const std::string& spec) {
  if (spec == "all") return meta.layers;
  auto wanted = parse_index_list(spec, meta.n_layers, "--layers");
  for (int l : wanted) {
    bool captured = std::find(meta.layers.begin(), meta.layers.end(), l) != meta.layers.end();
    KVLAB_CHECK(captured, "--layers: layer {} was not captured (captured: {})", l, fmt::join(meta.layers, ","));
  }
  return wanted;
}

}  // namespace kvlab
