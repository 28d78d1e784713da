// Panels of line plots with shared axes ranges, ticks, a legend and optional min–max bands.
#include "kvlab/analysis/curve_figure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvlab/core/svg.h"
#include "kvlab/core/check.h"

namespace kvlab {

std::string curve_figure_svg(const std::vector<CurvePanel>& panels, const CurveAxes& axes, const std::string& title) {
  KVLAB_CHECK(!panels.empty(), "curve_figure_svg: no panels");
  constexpr double kW = 220, kH = 200, kLeft = 80, kTop = 84, kGap = 50, kBottom = 60, kRight = 24;
  double x_lo = INFINITY, x_hi = -INFINITY;
  for (const auto& p : panels)
    for (const auto& s : p.series) {
      KVLAB_CHECK(s.x.size() == s.y.size() && !s.x.empty(), "curve_figure_svg: series '{}' has {} x and {} y",
                  s.label, s.x.size(), s.y.size());
      for (double x : s.x) x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
    }
  auto tx = [&](double x) { return axes.log2_x ? std::log2(x) : x; };
  const double a = tx(x_lo), b = std::max(tx(x_hi), tx(x_lo) + 1e-9);
  const double grid = kLeft + panels.size() * kW + (panels.size() - 1) * kGap + kRight;
  const double width = std::max(grid, 640.0), height = kTop + kH + kBottom;
  Svg svg(width, height);
  svg.text(width / 2, 24, title, 15, "middle", 0, "bold");
  // Legend from the first panel's series.
  svg.open_group("legend");
  double lx = kLeft;
  for (const auto& s : panels.front().series) {
    svg.line(lx, 48, lx + 28, 48, s.colour, 2.5, s.dashed ? "6,4" : "");
    svg.text(lx + 34, 53, s.label, 13);
    lx += 60 + 8.0 * double(s.label.size());
  }
  svg.close_group();
  for (size_t c = 0; c < panels.size(); ++c) {
    const double x0 = kLeft + c * (kW + kGap), y0 = kTop;
    auto X = [&](double x) { return x0 + (tx(x) - a) / (b - a) * kW; };
    auto Y = [&](double y) { return y0 + kH - (y - axes.y_min) / (axes.y_max - axes.y_min) * kH; };
    svg.open_group("panel", {{"data-title", panels[c].title}});
    svg.rect(x0, y0, kW, kH, "#fbfbfb", "#444444", 1);
    svg.text(x0 + kW / 2, y0 - 8, panels[c].title, 14, "middle", 0, "bold");
    for (int t = 0; t <= 4; ++t) {  // y ticks and grid
      const double v = axes.y_min + t * (axes.y_max - axes.y_min) / 4;
      svg.line(x0, Y(v), x0 + kW, Y(v), "#e4e4e4", 0.8);
      svg.line(x0 - 5, Y(v), x0, Y(v), "#444444");
      if (c == 0) svg.text(x0 - 8, Y(v) + 4, tick_label(v), 11, "end");
    }
    if (axes.log2_x) {
      for (double x = std::exp2(std::ceil(a)); tx(x) <= b + 1e-9; x *= 4) {  // every second power of two
        svg.line(X(x), y0 + kH, X(x), y0 + kH + 5, "#444444");
        svg.text(X(x), y0 + kH + 18, tick_label(x), 11, "middle");
      }
    } else {
      for (int t = 0; t <= 4; ++t) {
        const double v = x_lo + t * (x_hi - x_lo) / 4;
        svg.line(X(v), y0 + kH, X(v), y0 + kH + 5, "#444444");
        svg.text(X(v), y0 + kH + 18, tick_label(v), 11, "middle");
      }
    }
    svg.text(x0 + kW / 2, y0 + kH + 38, axes.x_label, 13, "middle");
    if (c == 0) svg.text(x0 - 50, y0 + kH / 2, axes.y_label, 13, "middle", -90);
    for (const auto& s : panels[c].series) {
      if (s.y_lo.size() == s.y.size() && s.y_hi.size() == s.y.size()) {
        std::vector<std::pair<double, double>> band;
        for (size_t i = 0; i < s.x.size(); ++i) band.emplace_back(X(s.x[i]), Y(s.y_hi[i]));
        for (size_t i = s.x.size(); i-- > 0;) band.emplace_back(X(s.x[i]), Y(s.y_lo[i]));
        svg.polygon(band, s.colour, 0.15);
      }
      std::vector<std::pair<double, double>> pts;
      for (size_t i = 0; i < s.x.size(); ++i) pts.emplace_back(X(s.x[i]), Y(std::clamp(s.y[i], axes.y_min, axes.y_max)));
      svg.open_group("series", {{"data-label", s.label}});
      svg.polyline(pts, s.colour, 2.2, s.dashed ? "6,4" : "");
      svg.close_group();
    }
    svg.close_group();
  }
  return svg.str();
}

}  // namespace kvlab
