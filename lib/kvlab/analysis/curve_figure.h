// Line plots in panels side by side (one per layer): e.g. the k-center radius r(k)/r(1) of keys
// and of values against k on a log₂ axis. SVG structure: <g class="panel" data-title="...">
// holding one <polyline class="series" data-label="..."> per series, and one <g class="legend">.
#pragma once

#include <string>
#include <vector>

namespace kvlab {

struct CurveSeries {
  std::string label;           // legend entry, e.g. "keys"
  std::vector<double> x, y;    // same length; x > 0 on a log axis
  std::vector<double> y_lo, y_hi;  // optional band (same length as y), drawn shaded
  std::string colour = "#1f77b4";
  bool dashed = false;
};

struct CurvePanel {
  std::string title;           // e.g. "layer 7"
  std::vector<CurveSeries> series;
};

struct CurveAxes {
  std::string x_label, y_label;
  bool log2_x = true;
  double y_min = 0, y_max = 1;
};

std::string curve_figure_svg(const std::vector<CurvePanel>& panels, const CurveAxes& axes, const std::string& title);

}  // namespace kvlab
