// A small hand-written SVG 1.1 writer: shapes and text appended in order, groups with a class
// and data attributes (which the tests and readers select on), XML-escaped text, numbers with
// two decimals. No external dependency; str() is a complete standalone document.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvlab {

class Svg {
 public:
  using Attrs = std::vector<std::pair<std::string, std::string>>;

  Svg(double width, double height);

  // <g class="cls" k="v" ...> ... </g>; groups nest.
  void open_group(const std::string& cls, const Attrs& attrs = {});
  void close_group();

  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& stroke = "none",
            double stroke_width = 1);
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1,
            const std::string& dash = "");
  void circle(double cx, double cy, double r, const std::string& fill, double opacity = 1,
              const std::string& stroke = "none", double stroke_width = 1, const std::string& cls = "");
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke, double width = 1.5,
                const std::string& dash = "", const std::string& cls = "");
  // A bare <circle cx cy r/> (fill and opacity from the enclosing group): compact for big scatters.
  void dot(double cx, double cy, double r);
  // A filled polygon without stroke (e.g. a band between two curves).
  void polygon(const std::vector<std::pair<double, double>>& pts, const std::string& fill, double opacity);
  // A "×" marker of half-size r centred on (cx, cy).
  void cross(double cx, double cy, double r, const std::string& stroke, double width, const std::string& cls = "");
  // anchor: start | middle | end; rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, double size = 12, const std::string& anchor = "start",
            double rotate = 0, const std::string& weight = "normal");

  std::string str() const;  // closes any open groups in the returned copy

 private:
  double width_, height_;
  std::string body_;
  int open_ = 0;
};

std::string xml_escape(const std::string& s);
// A short number for axis ticks: 3 significant digits, no trailing zeros ("-12.5", "0.003").
std::string tick_label(double v);

}  // namespace kvlab
