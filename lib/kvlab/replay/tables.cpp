#include "kvlab/replay/tables.h"

#include "kvlab/core/aggregate.h"
#include "kvlab/replay/replay.h"

namespace kvlab {

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
