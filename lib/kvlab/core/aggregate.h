// Mean ± std over seeds of per-row metrics: first average each seed's rows within a group, then
// take mean and (sample) std of those per-seed means across seeds.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvlab {

// rows: array of objects. group_keys: columns that define a group (missing key = null).
// Returns one object per group: the group keys, `n_seeds`, `n_rows`, and for each metric m
// `m` (mean over seeds) and `m_std`. Groups come out in first-seen order.
nlohmann::json aggregate_over_seeds(const nlohmann::json& rows, const std::vector<std::string>& group_keys,
                                    const std::vector<std::string>& metrics,
                                    const std::string& seed_key = "seed");

}  // namespace kvlab
