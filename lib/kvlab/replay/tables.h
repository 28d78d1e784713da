// Replay rows into aggregate tables: mean ± std over seeds per (method, setting, params[, layer]),
// written as CSV and aligned text. Shared by `kvlab replay` and `kvlab merge`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "kvlab/core/aggregate.h"
#include "kvlab/core/report.h"

namespace kvlab {

// Rows whose kept_fraction differs from the median of their setting by more than
// kEqualMemoryTolerance (core/aggregate.h) are marked "mem": "*" in the aggregates and the tables:
// not compared at equal memory.

// {"per_layer": [...], "overall": [...]}: mean ± std over seeds of every metric.
nlohmann::json replay_aggregates(const nlohmann::json& rows);
void write_replay_tables(const RunDir& run, const nlohmann::json& aggregates);
std::string render_replay_table(const nlohmann::json& overall);

}  // namespace kvlab
