// The SVG writer: string building with fmt, attributes escaped.
#include "kvlab/core/svg.h"

#include <fmt/format.h>

#include <cmath>

namespace kvlab {

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double v) {
  if (v == 0 || !std::isfinite(v)) return "0";
  std::string s = fmt::format("{:.3g}", v);
  return s == "-0" ? "0" : s;
}

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::open_group(const std::string& cls, const Attrs& attrs) {
  body_ += fmt::format("<g class=\"{}\"", xml_escape(cls));
  for (const auto& [k, v] : attrs) body_ += fmt::format(" {}=\"{}\"", k, xml_escape(v));
  body_ += ">\n";
  ++open_;
}

void Svg::close_group() {
  if (open_ == 0) return;
  body_ += "</g>\n";
  --open_;
}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& stroke,
               double stroke_width) {
  body_ += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" stroke=\"{}\" "
                       "stroke-width=\"{:.2f}\"/>\n", x, y, w, h, fill, stroke, stroke_width);
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
               const std::string& dash) {
  body_ += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" "
                       "stroke-width=\"{:.2f}\"{}/>\n", x1, y1, x2, y2, stroke, width,
                       dash.empty() ? "" : fmt::format(" stroke-dasharray=\"{}\"", dash));
}

void Svg::circle(double cx, double cy, double r, const std::string& fill, double opacity, const std::string& stroke,
                 double stroke_width, const std::string& cls) {
  body_ += fmt::format("<circle{} cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{:.2f}\" fill=\"{}\" fill-opacity=\"{:.2f}\" "
                       "stroke=\"{}\" stroke-width=\"{:.2f}\"/>\n", cls.empty() ? "" : " class=\"" + cls + "\"",
                       cx, cy, r, fill, opacity, stroke, stroke_width);
}

void Svg::dot(double cx, double cy, double r) {
  body_ += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:g}\"/>\n", cx, cy, r);
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke, double width,
                   const std::string& dash, const std::string& cls) {
  std::string p;
  for (const auto& [x, y] : pts) p += fmt::format("{:.2f},{:.2f} ", x, y);
  body_ += fmt::format("<polyline{} points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{:.2f}\"{}/>\n",
                       cls.empty() ? "" : " class=\"" + cls + "\"", p, stroke, width,
                       dash.empty() ? "" : fmt::format(" stroke-dasharray=\"{}\"", dash));
}

void Svg::polygon(const std::vector<std::pair<double, double>>& pts, const std::string& fill, double opacity) {
  std::string p;
  for (const auto& [x, y] : pts) p += fmt::format("{:.1f},{:.1f} ", x, y);
  body_ += fmt::format("<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"{:.2f}\" stroke=\"none\"/>\n", p, fill,
                       opacity);
}

void Svg::cross(double cx, double cy, double r, const std::string& stroke, double width, const std::string& cls) {
  body_ += fmt::format("<path{} d=\"M{:.2f},{:.2f}L{:.2f},{:.2f}M{:.2f},{:.2f}L{:.2f},{:.2f}\" stroke=\"{}\" "
                       "stroke-width=\"{:.2f}\" fill=\"none\"/>\n", cls.empty() ? "" : " class=\"" + cls + "\"",
                       cx - r, cy - r, cx + r, cy + r, cx - r, cy + r, cx + r, cy - r, stroke, width);
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor, double rotate,
               const std::string& weight) {
  body_ += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" font-size=\"{:.1f}\" text-anchor=\"{}\"{}{}>{}</text>\n", x, y,
                       size, anchor, weight == "normal" ? "" : " font-weight=\"" + weight + "\"",
                       rotate == 0 ? "" : fmt::format(" transform=\"rotate({:.1f} {:.2f} {:.2f})\"", rotate, x, y),
                       xml_escape(s));
}

std::string Svg::str() const {
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
      width_, height_, width_, height_);
  out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"white\"/>\n", width_, height_);
  out += body_;
  for (int i = 0; i < open_; ++i) out += "</g>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace kvlab
