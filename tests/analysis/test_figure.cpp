// The t-SNE figure's structure, read back by an independent XML parser (python3's xml.etree):
// well-formed, one panel per (kind, layer) with the keys row above the values row, every centre
// marked, axis labels and a legend present; and the query-norm statistics against hand values.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "kvlab/analysis/curve_figure.h"
#include "kvlab/analysis/query_norms.h"
#include "kvlab/core/svg.h"
#include "kvlab/analysis/tsne_figure.h"
#include "test_util.h"

using namespace kvlab;

TEST_CASE("t-SNE figure: valid XML, one panel per layer and kind, centres marked") {
  at::manual_seed(0);
  std::vector<TsnePanel> panels;
  const std::vector<int> layers = {0, 14, 29};
  for (const char* kind : {"values", "keys"})  // given values first: keys must still be the top row
    for (int l : layers) {
      TsnePanel p;
      p.kind = kind;
      p.layer = l;
      p.embedding = at::randn({50, 2}, at::kDouble) * 7;  // [50, 2]
      p.centres = {0, 7, 9, 31};
      p.trustworthiness = 0.93;
      panels.push_back(p);
    }
  const std::string svg = tsne_figure_svg(panels, "keys & values <test>");
  const std::string dir = test::temp_dir("tsne_fig");
  {
    std::ofstream(dir + "/f.svg") << svg;
  }
  const std::string py =
      "import sys, xml.etree.ElementTree as ET\n"
      "ns = {'s': 'http://www.w3.org/2000/svg'}\n"
      "root = ET.parse(sys.argv[1]).getroot()\n"
      "assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag\n"
      "panels = root.findall('.//s:g[@class=\"panel\"]', ns)\n"
      "print('panels', len(panels))\n"
      "for p in panels:\n"
      "    frame = p.find('s:rect', ns)\n"
      "    print('panel', p.get('data-kind'), p.get('data-layer'), float(frame.get('x')), float(frame.get('y')),\n"
      "          len(p.findall('.//s:g[@class=\"points\"]//s:circle', ns)),\n"
      "          len(p.findall('.//s:g[@class=\"centres\"]/s:path[@class=\"centre\"]', ns)))\n"
      "texts = [t.text for t in root.iter('{http://www.w3.org/2000/svg}text')]\n"
      "print('xlabels', texts.count('t-SNE 1'), 'ylabels', texts.count('t-SNE 2'))\n"
      "print('legend', len(root.findall('.//s:g[@class=\"legend\"]', ns)), 'title', texts[0])\n";
  {
    std::ofstream(dir + "/check.py") << py;
  }
  std::string out;
  REQUIRE(test::run_command("python3 " + dir + "/check.py " + dir + "/f.svg", &out) == 0);
  MESSAGE(out);
  std::istringstream in(out);
  std::string word;
  int n = 0;
  in >> word >> n;
  CHECK(n == 6);
  double keys_y = -1, values_y = -1;
  std::vector<double> key_x;
  for (int i = 0; i < 6; ++i) {
    std::string kind;
    int layer = 0, points = 0, centres = 0;
    double x = 0, y = 0;
    in >> word >> kind >> layer >> x >> y >> points >> centres;
    CHECK(word == "panel");
    CHECK(points == 50);
    CHECK(centres == 4);
    (kind == "keys" ? keys_y : values_y) = y;
    if (kind == "keys") key_x.push_back(x);
  }
  CHECK(keys_y < values_y);  // keys row on top
  REQUIRE(key_x.size() == 3);
  CHECK(key_x[0] < key_x[1]);  // one column per layer, left to right
  CHECK(key_x[1] < key_x[2]);
  int xl = 0, yl = 0, legend = 0;
  in >> word >> xl >> word >> yl >> word >> legend >> word;
  CHECK(xl == 6);
  CHECK(yl == 6);
  CHECK(legend == 1);
  std::string title;
  std::getline(in, title);
  CHECK(title == " keys & values <test>");  // escaped in the file, read back intact
}

TEST_CASE("xml_escape and tick labels") {
  CHECK(xml_escape("a<b & \"c\"") == "a&lt;b &amp; &quot;c&quot;");
  CHECK(tick_label(12.3456) == "12.3");
  CHECK(tick_label(-0.0) == "0");
}

TEST_CASE("query norms: per-position norm, t-interval, trend") {
  // Two heads, three positions: norms (3, 5), (0, 0), (1, 1) -> means 4, 0, 1.
  auto q = at::zeros({2, 3, 2}, at::kFloat);
  q[0][0][0] = 3;
  q[1][0][0] = 3;
  q[1][0][1] = 4;
  q[0][2][1] = 1;
  q[1][2][0] = -1;
  auto n = query_norm_per_position(q);
  CHECK(n[0].item<double>() == doctest::Approx(4.0));
  CHECK(n[1].item<double>() == doctest::Approx(0.0));
  CHECK(n[2].item<double>() == doctest::Approx(1.0));
  // mean of {1, 2, 3, 4} = 2.5, sd = 1.29099, t(3) = 3.182: half-width 2.0540
  auto ci = mean_ci95({1, 2, 3, 4});
  CHECK(ci.mean == doctest::Approx(2.5));
  CHECK(ci.sd == doctest::Approx(1.2909944));
  CHECK(ci.high - ci.mean == doctest::Approx(3.182 * 1.2909944 / 2));
  CHECK(mean_ci95({7}).low == 7);
  CHECK(t_critical_95(1000) == doctest::Approx(1.96));
  // norms = 10 + 0.002 · position exactly: slope 2 per 1k tokens, r = 1.
  std::vector<int64_t> pos;
  std::vector<double> v;
  for (int64_t p = 0; p < 1000; p += 10) pos.push_back(p), v.push_back(10 + 0.002 * double(p));
  auto t = norm_trend(pos, v, 256);
  CHECK(t.slope_per_1k == doctest::Approx(2.0));
  CHECK(t.pearson_r == doctest::Approx(1.0));
  CHECK(t.bin_start == std::vector<int64_t>{0, 256, 512, 768});
  CHECK(t.bin_count == std::vector<int64_t>{26, 26, 25, 23});
}

TEST_CASE("curve figure: valid XML, one panel per layer, one series per kind") {
  std::vector<CurvePanel> panels;
  for (int l : {0, 7, 29}) {
    CurvePanel p{"layer " + std::to_string(l), {}};
    std::vector<double> k = {1, 2, 4, 8, 16}, y = {1, 0.8, 0.6, 0.5, 0.4};
    p.series.push_back({"keys", k, y, {}, {}, "#1f77b4", false});
    p.series.push_back({"values", k, y, y, y, "#ff7f0e", true});
    panels.push_back(p);
  }
  const std::string dir = test::temp_dir("curve_fig");
  {
    std::ofstream(dir + "/c.svg") << curve_figure_svg(panels, {"k", "r(k) / r(1)", true, 0, 1}, "radii & <k>");
  }
  std::string out;
  REQUIRE(test::run_command("python3 -c \"import sys, xml.etree.ElementTree as ET; r = ET.parse(sys.argv[1]).getroot(); "
                            "ns = {'s': 'http://www.w3.org/2000/svg'}; "
                            "print(len(r.findall('.//s:g[@class=\\\"panel\\\"]', ns)), "
                            "len(r.findall('.//s:g[@class=\\\"series\\\"]/s:polyline', ns)), "
                            "len(r.findall('.//s:polygon', ns)))\" " + dir + "/c.svg", &out) == 0);
  CHECK(out == "3 6 3\n");  // 3 panels, 2 series each, a band for each values series
}
