#include "kvlab/tasks/niah_figure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvlab/core/svg.h"

namespace kvlab {
namespace {

// Red (0) -> yellow (0.5) -> green (1), the diverging scale of the NIAH figures.
std::string score_colour(double s) {
  s = std::clamp(s, 0.0, 1.0);
  const double lo[3] = {215, 48, 39}, mid[3] = {254, 224, 139}, hi[3] = {26, 152, 80};
  const double* a = s < 0.5 ? lo : mid;
  const double* b = s < 0.5 ? mid : hi;
  const double t = s < 0.5 ? s / 0.5 : (s - 0.5) / 0.5;
  int c[3];
  for (int i = 0; i < 3; ++i) c[i] = static_cast<int>(std::lround(a[i] + t * (b[i] - a[i])));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

std::string length_label(int64_t L) { return L % 1024 == 0 ? fmt::format("{}k", L / 1024) : std::to_string(L); }

}  // namespace

std::string niah_heatmap_svg(const std::vector<NiahPanel>& panels, const std::vector<int64_t>& lengths,
                             const std::vector<double>& depths, const std::string& title) {
  const double cell_h = 26, left = 70, top = 56, gap = 30, bottom = 64;
  // Cells wide enough for every panel's title (bold 12 px: ~7.5 px a character).
  double cell_w = 46;
  for (const auto& p : panels)
    cell_w = std::max(cell_w, (7.5 * double(p.branch.size()) + 8) / double(std::max<size_t>(1, lengths.size())));
  const double panel_w = cell_w * double(lengths.size());
  const double legend_w = 11 * 14 + 18 + 6.0 * 48;  // scale + caption
  const double width = std::max({left + double(panels.size()) * (panel_w + gap) + 10,
                                 9.0 * double(title.size()) + 40, left + legend_w + 20});
  const double height = top + cell_h * double(depths.size()) + bottom + 30;
  Svg svg(width, height);
  svg.rect(0, 0, width, height, "white");
  svg.text(width / 2, 22, title, 15, "middle", 0, "bold");
  for (size_t p = 0; p < panels.size(); ++p) {
    const double x0 = left + double(p) * (panel_w + gap);
    svg.open_group("panel", {{"data-branch", panels[p].branch}});
    svg.text(x0 + panel_w / 2, top - 10, panels[p].branch, 12, "middle", 0, "bold");
    for (size_t r = 0; r < depths.size(); ++r) {
      for (size_t c = 0; c < lengths.size(); ++c) {
        const std::string id = fmt::format("len{}_depth{:g}", lengths[c], depths[r]);
        const bool has = panels[p].scores.contains(id) && panels[p].scores[id].is_number();
        const double s = has ? panels[p].scores[id].get<double>() : 0;
        svg.open_group("cell", {{"data-length", std::to_string(lengths[c])},
                                {"data-depth", fmt::format("{:g}", depths[r])},
                                {"data-score", has ? fmt::format("{:g}", s) : "none"}});
        const double x = x0 + double(c) * cell_w, y = top + double(r) * cell_h;
        svg.rect(x, y, cell_w, cell_h, has ? score_colour(s) : "#dddddd", "white", 1);
        svg.text(x + cell_w / 2, y + cell_h / 2 + 4, has ? fmt::format("{:.2g}", s) : "–", 10, "middle");
        svg.close_group();
      }
    }
    // Axes: lengths under the columns, depths beside the first panel's rows.
    for (size_t c = 0; c < lengths.size(); ++c)
      svg.text(x0 + (double(c) + 0.5) * cell_w, top + cell_h * double(depths.size()) + 16,
               length_label(lengths[c]), 10, "middle");
    svg.close_group();
  }
  svg.text(left + (double(panels.size()) * (panel_w + gap) - gap) / 2, top + cell_h * double(depths.size()) + 34,
           "context length (tokens)", 11, "middle");
  for (size_t r = 0; r < depths.size(); ++r)
    svg.text(left - 6, top + (double(r) + 0.5) * cell_h + 4, fmt::format("{:g}%", depths[r]), 10, "end");
  svg.text(18, top + cell_h * double(depths.size()) / 2, "needle depth", 11, "middle", -90);
  // Legend: the colour scale from 0 to 1.
  svg.open_group("legend");
  const double ly = height - 22, lx = left;
  for (int i = 0; i <= 10; ++i) svg.rect(lx + i * 14, ly - 10, 14, 10, score_colour(i / 10.0));
  svg.text(lx - 4, ly - 1, "0", 10, "end");
  svg.text(lx + 11 * 14 + 4, ly - 1, "1", 10, "start");
  svg.text(lx + 11 * 14 + 18, ly - 1, "score: the output holds the needle's key phrase", 10, "start");
  svg.close_group();
  return svg.str();
}

}  // namespace kvlab
