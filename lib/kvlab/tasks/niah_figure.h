// NIAH heat maps as in gkamradt's figures and BalanceKV / kvpress: one panel per branch, needle
// depth (rows, top = 0%) by context length (columns), each cell coloured by its score (red 0,
// yellow 0.5, green 1) with the value written in it. SVG structure for readers and tests:
// <g class="panel" data-branch="..."> holding one <g class="cell" data-length data-depth
// data-score> per cell, and one <g class="legend">.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

struct NiahPanel {
  std::string branch;           // "exact", "snapkv_ratio0.2", ...
  nlohmann::json scores;        // {"len<L>_depth<D>": score in [0, 1]}; a missing cell is drawn grey
};

std::string niah_heatmap_svg(const std::vector<NiahPanel>& panels, const std::vector<int64_t>& lengths,
                             const std::vector<double>& depths, const std::string& title);

}  // namespace kvlab
