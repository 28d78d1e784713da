// The t-SNE figure laid out like SubGen's Fig. 1: one row per kind (keys on top, values below),
// one column per (layer, head); each panel a scatter of the embedded tokens coloured by position,
// with the greedy k-center centres marked "×". SVG structure (for tests and readers):
//   <g class="panel" data-kind="keys|values" data-layer="L" data-head="H"> ... <g class="centres">
//   <path class="centre" .../> × k </g></g>, and one <g class="legend">.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace kvlab {

struct TsnePanel {
  std::string kind;            // "keys" or "values": the row
  int layer = 0, head = 0;     // the column
  at::Tensor embedding;        // [n, 2]
  at::Tensor positions;        // [n] int64 token positions (colour); undefined: row index
  std::vector<int64_t> centres;  // rows of `embedding` chosen as k-center centres
  double trustworthiness = -1;   // shown in the panel when >= 0, as "T(trust_k) = ..."
  int trust_k = 10;
};

std::string tsne_figure_svg(const std::vector<TsnePanel>& panels, const std::string& title);

}  // namespace kvlab
