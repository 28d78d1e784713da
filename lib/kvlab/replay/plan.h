// Turning replay flags into a plan: methods with their parameters, budgets, seeds, layers,
// shards. Every error names the flag.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/io/capture.h"
#include "kvlab/compress/method_spec.h"
#include "kvlab/replay/replay.h"

namespace kvlab {

// The 10 seeds of docs/methods.md §4 (BalanceKV Fig. 2), in order.
const std::vector<uint64_t>& paper_seeds();

// --seeds N takes the first N of paper_seeds() (then 1000, 1001, ...); --seed-list wins if given.
std::vector<uint64_t> seed_values(int64_t n, const std::vector<int64_t>& explicit_list);

std::pair<int, int> parse_shard(const std::string& spec);  // "i/N" -> (i, N)

// "all" -> the captured layers; else each listed layer must have been captured.
std::vector<int> select_layers(const CaptureMeta& meta, const std::string& spec);

}  // namespace kvlab
