#include "kvlab/replay/tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "kvlab/core/aggregate.h"
#include "kvlab/replay/replay.h"

namespace kvlab {

namespace {

// Marks every aggregate row whose kept_fraction differs by more than 1% (relative) from the
// median kept_fraction of the rows of its setting (and layer): "mem" = "*", else "". At a bytes
// setting ("bytes=f", issue 52) the branches keep different counts by design: a row is marked when
// it holds more than f of the full-precision bytes (a quantizer alone, which cannot evict).
void mark_unequal_memory(nlohmann::json& agg, bool per_layer) {
  for (auto& r : agg) r["mem"] = "";  // rows without kept_fraction too
  auto bytes_setting = [](const nlohmann::json& r) { return r.value("setting", "").rfind("bytes=", 0) == 0; };
  mark_off_median(
      agg, "kept_fraction",
      [per_layer](const nlohmann::json& r) {
        return r.value("setting", "") + (per_layer ? "|" + r.value("layer", nlohmann::json()).dump() : "");
      },
      [&](const nlohmann::json& r) { return !bytes_setting(r); });
  for (auto& r : agg) {
    if (!bytes_setting(r) || !r.contains("bytes_fraction") || !r["bytes_fraction"].is_number()) continue;
    const double f = std::stod(r["setting"].get<std::string>().substr(6));
    if (r["bytes_fraction"].get<double>() > f * (1 + 1e-9)) r["mem"] = "*";
  }
}

// Every aggregate row's compress time against uniform's in the same setting (and layer):
// "ms_vs_uniform" (issue 13: how much dearer each method is than random sampling).
void add_time_vs_uniform(nlohmann::json& agg, bool per_layer) {
  auto group = [&](const nlohmann::json& r) {
    return r.value("setting", "") + (per_layer ? "|" + r.value("layer", nlohmann::json()).dump() : "");
  };
  std::map<std::string, double> uniform_ms;
  for (const auto& r : agg)
    if (r.value("method", "") == "uniform" && r.contains("compress_ms") && r["compress_ms"].is_number())
      uniform_ms[group(r)] = r["compress_ms"].get<double>();
  for (auto& r : agg) {
    auto u = uniform_ms.find(group(r));
    if (u != uniform_ms.end() && u->second > 0 && r.contains("compress_ms") && r["compress_ms"].is_number())
      r["ms_vs_uniform"] = r["compress_ms"].get<double>() / u->second;
  }
}

}  // namespace

nlohmann::json replay_aggregates(const nlohmann::json& rows) {
  const auto& metrics = replay_metric_names();
  auto per_layer = aggregate_over_seeds(rows, {"method", "setting", "params", "layer"}, metrics);
  auto overall = aggregate_over_seeds(rows, {"method", "setting", "params"}, metrics);
  mark_unequal_memory(per_layer, true);
  mark_unequal_memory(overall, false);
  add_time_vs_uniform(per_layer, true);
  add_time_vs_uniform(overall, false);
  return {{"per_layer", per_layer}, {"overall", overall}};
}

namespace {
// The printed table adds each method's compress time per (layer, KV head) and its ratio to
// uniform's; the CSVs leave timings out so that reruns and merged shards compare equal.
const std::vector<std::string>& printed_columns() {
  static const std::vector<std::string> cols = {"method", "setting", "kept_fraction", "bytes_fraction", "mem", "rel_err", "rel_err_std",
                                                "bound_ratio_F", "cosine", "mass_recall", "n_seeds", "compress_ms",
                                                "ms_vs_uniform"};
  return cols;
}

const std::vector<std::string>& table_columns(bool per_layer) {
  static const std::vector<std::string> overall = {"method", "setting", "kept_fraction", "mem", "rel_err", "rel_err_std",
                                                   "bound_ratio_F", "cosine", "mass_recall", "n_seeds"};
  static const std::vector<std::string> layer = {"method", "setting", "layer", "kept_fraction", "mem", "rel_err",
                                                 "rel_err_std", "bound_ratio_F", "cosine", "mass_recall", "n_seeds"};
  return per_layer ? layer : overall;
}

// The footnote of every table that has a marked row.
std::string memory_note(const nlohmann::json& agg) {
  for (const auto& r : agg)
    if (r.value("mem", "") == "*")
      return fmt::format("mem *: kept_fraction differs by more than {:.0f}% from the median of its setting "
                         "(at a bytes=f setting: bytes_fraction is above f): not at equal memory with the other "
                         "rows\n", 100 * kEqualMemoryTolerance);
  return "";
}

}  // namespace

void write_replay_tables(const RunDir& run, const nlohmann::json& aggregates) {
  write_text_atomic(run.file("aggregate_overall.csv"), render_csv(aggregates["overall"], table_columns(false)));
  write_text_atomic(run.file("aggregate_per_layer.csv"), render_csv(aggregates["per_layer"], table_columns(true)));
  write_text_atomic(run.file("summary.txt"), render_replay_table(aggregates["overall"]) + "\n" +
                                                 render_table(aggregates["per_layer"], table_columns(true)) +
                                                 memory_note(aggregates["per_layer"]));
}

std::string render_replay_table(const nlohmann::json& overall) {
  return render_table(overall, printed_columns()) + memory_note(overall) +
         "compress_ms: mean time of the method's compress() per (layer, KV head); ms_vs_uniform: against uniform's\n";
}

}  // namespace kvlab
