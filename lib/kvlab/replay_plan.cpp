#include "kvlab/replay_plan.h"

#include <ATen/Context.h>

#include <algorithm>

#include "kvlab/aggregate.h"
#include "kvlab/check.h"
#include "kvlab/text.h"

namespace kvlab {

const std::vector<uint64_t>& paper_seeds() {
  static const std::vector<uint64_t> s = {42, 7, 8, 17, 98, 64, 27, 32, 81, 44};
  return s;
}

std::vector<BudgetSetting> budget_settings(const std::vector<double>& ratios, const std::vector<int64_t>& budgets,
                                           const std::vector<int64_t>& halvings) {
  int given = int(!ratios.empty()) + int(!budgets.empty()) + int(!halvings.empty());
  KVLAB_CHECK(given == 1, "give exactly one of --ratio, --budget, --T (got {})", given);
  std::vector<BudgetSetting> out;
  for (double r : ratios) {
    KVLAB_CHECK(r > 0 && r <= 1, "--ratio must be in (0, 1], got {}", r);
    out.push_back({r, -1, -1});
  }
  for (int64_t b : budgets) {
    KVLAB_CHECK(b >= 1, "--budget must be >= 1 entries, got {}", b);
    out.push_back({-1, b, -1});
  }
  for (int64_t t : halvings) {
    KVLAB_CHECK(t >= 0 && t <= 30, "--T (halvings) must be in [0, 30], got {}", t);
    out.push_back({-1, -1, int(t)});
  }
  return out;
}

std::string setting_label(const BudgetSetting& b) {
  if (b.ratio >= 0) return fmt::format("ratio={}", b.ratio);
  if (b.budget >= 0) return fmt::format("budget={}", b.budget);
  return fmt::format("T={}", b.halvings);
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

void check_device(const std::string& device) {
  if (device == "cpu") return;
  KVLAB_CHECK(device.rfind("cuda", 0) == 0, "--device: expected cpu, cuda or cuda:N, got '{}'", device);
  KVLAB_CHECK(at::hasCUDA(), "--device {}: CUDA is not available (this LibTorch has no CUDA, or no GPU is visible; kvlab --version shows which)", device);
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

nlohmann::json replay_aggregates(const nlohmann::json& rows) {
  const auto& metrics = replay_metric_names();
  return {{"per_layer", aggregate_over_seeds(rows, {"method", "setting", "params", "layer"}, metrics)},
          {"overall", aggregate_over_seeds(rows, {"method", "setting", "params"}, metrics)}};
}

namespace {
const std::vector<std::string>& table_columns(bool per_layer) {
  static const std::vector<std::string> overall = {"method", "setting", "kept_fraction", "rel_err", "rel_err_std",
                                                   "bound_ratio_F", "cosine", "mass_recall", "n_seeds"};
  static const std::vector<std::string> layer = {"method", "setting", "layer", "kept_fraction", "rel_err",
                                                 "rel_err_std", "bound_ratio_F", "cosine", "mass_recall", "n_seeds"};
  return per_layer ? layer : overall;
}
}  // namespace

void write_replay_tables(const RunDir& run, const nlohmann::json& aggregates) {
  write_text_atomic(run.file("aggregate_overall.csv"), render_csv(aggregates["overall"], table_columns(false)));
  write_text_atomic(run.file("aggregate_per_layer.csv"), render_csv(aggregates["per_layer"], table_columns(true)));
  write_text_atomic(run.file("summary.txt"), render_table(aggregates["overall"], table_columns(false)) + "\n" +
                                                 render_table(aggregates["per_layer"], table_columns(true)));
}

std::string render_replay_table(const nlohmann::json& overall) { return render_table(overall, table_columns(false)); }

}  // namespace kvlab
