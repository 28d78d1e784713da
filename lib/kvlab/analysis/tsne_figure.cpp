// The t-SNE figure: a grid of scatter panels with axes, column and row labels, a legend and a
// position colour bar, sized to stay readable at a paper's column width.
#include "kvlab/analysis/tsne_figure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kvlab/core/svg.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

constexpr double kPanel = 240, kLeft = 120, kTop = 96, kGapX = 84, kGapY = 74, kBottom = 30, kRight = 24;

// Viridis, five stops, linearly interpolated: t in [0, 1].
std::string viridis(double t) {
  static const double stops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, int(t));
  const double f = t - i;
  int c[3];
  for (int a = 0; a < 3; ++a) c[a] = int(std::lround(stops[i][a] + f * (stops[i + 1][a] - stops[i][a])));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

}  // namespace

std::string tsne_figure_svg(const std::vector<TsnePanel>& panels, const std::string& title) {
  KVLAB_CHECK(!panels.empty(), "tsne_figure_svg: no panels");
  std::vector<std::string> kinds;
  std::set<std::pair<int, int>> cols_set;
  for (const auto& p : panels) {
    if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
    cols_set.insert({p.layer, p.head});
  }
  std::stable_sort(kinds.begin(), kinds.end(), [](const std::string& a, const std::string& b) {
    return (a == "keys" ? 0 : 1) < (b == "keys" ? 0 : 1);
  });
  std::vector<std::pair<int, int>> cols(cols_set.begin(), cols_set.end());
  // The legend and title need about 980 px; fewer columns are centred in that width.
  const double grid = kLeft + cols.size() * kPanel + (cols.size() - 1) * kGapX + kRight;
  const double width = std::max(grid, 980.0);
  const double left = kLeft + (width - grid) / 2;
  const double height = kTop + kinds.size() * kPanel + (kinds.size() - 1) * kGapY + kGapY - 20 + kBottom;
  Svg svg(width, height);
  svg.text(width / 2, 26, title, 15, "middle", 0, "bold");

  // Legend: token dot, centre cross, position colour bar.
  svg.open_group("legend");
  double lx = 40;
  svg.circle(lx + 5, 52, 4, viridis(0.5), 0.8);
  svg.text(lx + 14, 57, "token (colour: position in the prompt)", 13);
  lx += 300;
  svg.cross(lx + 5, 52, 5, "#d62728", 2.4, "legend-centre");
  svg.text(lx + 16, 57, "greedy k-center centre", 13);
  lx += 230;
  const double bar_w = std::min(160.0, std::max(60.0, width - lx - 80));
  for (int s = 0; s < 32; ++s) svg.rect(lx + s * bar_w / 32, 46, bar_w / 32 + 0.5, 12, viridis(s / 31.0));
  svg.text(lx - 4, 57, "first", 12, "end");
  svg.text(lx + bar_w + 4, 57, "last", 12, "start");
  svg.close_group();

  for (size_t c = 0; c < cols.size(); ++c) {
    const double x0 = left + c * (kPanel + kGapX);
    svg.text(x0 + kPanel / 2, kTop - 12, fmt::format("layer {}, KV head {}", cols[c].first, cols[c].second), 15,
             "middle", 0, "bold");
  }
  for (size_t r = 0; r < kinds.size(); ++r) {
    const double y0 = kTop + r * (kPanel + kGapY);
    svg.text(left - 96, y0 + kPanel / 2, kinds[r], 16, "middle", -90, "bold");
  }

  for (const auto& p : panels) {
    const size_t c = std::find(cols.begin(), cols.end(), std::make_pair(p.layer, p.head)) - cols.begin();
    const size_t r = std::find(kinds.begin(), kinds.end(), p.kind) - kinds.begin();
    const double x0 = left + c * (kPanel + kGapX), y0 = kTop + r * (kPanel + kGapY);
    auto e = p.embedding.to(at::kCPU).to(at::kDouble).contiguous();  // [n, 2]
    const int64_t n = e.size(0);
    KVLAB_CHECK(e.dim() == 2 && e.size(1) == 2 && n > 0, "tsne_figure_svg: embedding must be [n > 0, 2], got {}",
                e.sizes());
    const double* pe = e.data_ptr<double>();
    double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
    for (int64_t i = 0; i < n; ++i)
      for (int a = 0; a < 2; ++a) lo[a] = std::min(lo[a], pe[2 * i + a]), hi[a] = std::max(hi[a], pe[2 * i + a]);
    for (int a = 0; a < 2; ++a) {
      const double pad = 0.05 * std::max(hi[a] - lo[a], 1e-9);
      lo[a] -= pad;
      hi[a] += pad;
    }
    auto X = [&](double v) { return x0 + (v - lo[0]) / (hi[0] - lo[0]) * kPanel; };
    auto Y = [&](double v) { return y0 + kPanel - (v - lo[1]) / (hi[1] - lo[1]) * kPanel; };

    svg.open_group("panel", {{"data-kind", p.kind}, {"data-layer", std::to_string(p.layer)},
                             {"data-head", std::to_string(p.head)}, {"data-points", std::to_string(n)}});
    svg.rect(x0, y0, kPanel, kPanel, "#fbfbfb", "#444444", 1);
    // Ticks at the ends and middle of each axis.
    for (int t = 0; t < 3; ++t) {
      const double f = 0.1 + 0.4 * t;
      const double vx = lo[0] + f * (hi[0] - lo[0]), vy = lo[1] + f * (hi[1] - lo[1]);
      svg.line(X(vx), y0 + kPanel, X(vx), y0 + kPanel + 5, "#444444");
      svg.text(X(vx), y0 + kPanel + 18, tick_label(vx), 11, "middle");
      svg.line(x0 - 5, Y(vy), x0, Y(vy), "#444444");
      svg.text(x0 - 8, Y(vy) + 4, tick_label(vy), 11, "end");
    }
    svg.text(x0 + kPanel / 2, y0 + kPanel + 36, "t-SNE 1", 13, "middle");
    svg.text(x0 - 58, y0 + kPanel / 2, "t-SNE 2", 13, "middle", -90);
    // Points, oldest first so recent tokens are drawn on top.
    at::Tensor pos = p.positions.defined() ? p.positions.to(at::kLong).contiguous() : at::arange(n, at::kLong);
    const int64_t* pp = pos.data_ptr<int64_t>();
    const double pmax = std::max<double>(1, double(pos.max().item<int64_t>()));
    // Colour buckets by position, each one group (the file stays small), oldest bucket first.
    constexpr int kBuckets = 24;
    std::vector<std::vector<int64_t>> bucket(kBuckets);
    for (int64_t i = 0; i < n; ++i)
      bucket[std::min<int64_t>(kBuckets - 1, int64_t(double(pp[i]) / pmax * kBuckets))].push_back(i);
    svg.open_group("points", {{"fill-opacity", "0.7"}, {"stroke", "none"}});
    for (int b = 0; b < kBuckets; ++b) {
      if (bucket[b].empty()) continue;
      svg.open_group("bucket", {{"fill", viridis((b + 0.5) / kBuckets)}});
      for (int64_t i : bucket[b]) svg.dot(X(pe[2 * i]), Y(pe[2 * i + 1]), 2.0);
      svg.close_group();
    }
    svg.close_group();
    svg.open_group("centres", {{"data-k", std::to_string(p.centres.size())}});
    for (int64_t c2 : p.centres) {
      KVLAB_CHECK(c2 >= 0 && c2 < n, "tsne_figure_svg: centre {} outside [0, {})", c2, n);
      svg.cross(X(pe[2 * c2]), Y(pe[2 * c2 + 1]), 5.5, "white", 4.2);
      svg.cross(X(pe[2 * c2]), Y(pe[2 * c2 + 1]), 5.5, "#d62728", 2.4, "centre");
    }
    svg.close_group();
    if (p.trustworthiness >= 0)
      svg.text(x0 + kPanel, y0 + kPanel + 36, fmt::format("T({}) = {:.3f}", p.trust_k, p.trustworthiness), 11, "end");
    svg.close_group();
  }
  return svg.str();
}

}  // namespace kvlab
