// Mean ± std over seeds of per-row metrics: first average each seed's rows within a group, then
// take mean and (sample) std of those per-seed means across seeds.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kvlab {

// Rows compared at equal memory: a row whose memory measure differs from the median of its group by
// more than this (relative) is marked "mem": "*" (replay: kept_fraction; tasks: entries_start).
constexpr double kEqualMemoryTolerance = 0.01;

// Sets "mem" to "*" on every row with a numeric `key` more than kEqualMemoryTolerance (relative)
// from the median of `key` over the rows of its group (`group`; rows that `eligible` rejects take no
// part and are left alone), else "".
void mark_off_median(nlohmann::json& rows, const std::string& key,
                     const std::function<std::string(const nlohmann::json&)>& group,
                     const std::function<bool(const nlohmann::json&)>& eligible);

// rows: array of objects. group_keys: columns that define a group (missing key = null).
// Returns one object per group: the group keys, `n_seeds`, `n_rows`, and for each metric m
// `m` (mean over seeds) and `m_std`. Groups come out in first-seen order.
nlohmann::json aggregate_over_seeds(const nlohmann::json& rows, const std::vector<std::string>& group_keys,
                                    const std::vector<std::string>& metrics,
                                    const std::string& seed_key = "seed");

}  // namespace kvlab
