// kvlab clusterability --capture F.h5 [--layers ...] [--heads all] [--samples 0] [--max-points 4096]
//                      [--k-max 256] [--silhouette-k 16] [--delta-fractions 0.5,0.75,1] --out DIR | --name N
// The clusterability numbers of the keys and the values of every chosen (sample, layer, KV head)
// (analysis/clusterability.h): r(k)/diameter for k = 1..k_max, m(δ, n) and its growth exponent,
// the silhouette of the k-center partition; and the query norms of ClusterGen Table 1 (mean ‖q‖₂
// per prompt, its mean over prompts with a 95% CI, its trend with position). Writes result.json
// (rows per (sample, layer, head, keys|values); "query_norms"; "keys_vs_values" per layer),
// radius_curve.csv (r(k)/diameter and r(k)/r(1) per layer and kind: mean, min, max over samples and
// heads), the same curves as radius_over_diameter.svg and radius_over_r1.svg, and summary.txt.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <algorithm>
#include <cmath>
#include <map>

#include "command.h"
#include "commands.h"
#include "kvlab/analysis/clusterability.h"
#include "kvlab/analysis/curve_figure.h"
#include "kvlab/analysis/points.h"
#include "kvlab/analysis/query_norms.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/text.h"
#include "kvlab/io/capture.h"
#include "kvlab/replay/plan.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct ClusterabilityCmdOptions : RunFolderOptions {
  ClusterabilityCmdOptions() : RunFolderOptions("clusterability") {}
  std::string capture;
  std::string layers = "all";
  std::string heads = "all";
  std::string samples = "0";
  int64_t max_points = 4096;
  int64_t skip_first = 0;
  int64_t last = 0;
  int64_t k_max = 256;
  int64_t silhouette_k = 16;
  std::vector<double> delta_fractions = {0.5, 0.75, 1.0};
  int64_t position_bin = 256;

  void fields(FieldList& f) {
    f.add("capture", capture, "capture file (.h5) from 'kvlab dump' or 'kvlab synth'").required();
    f.add("layers", layers, "layers: all (captured) | 0,14,29 | 0-3");
    f.add("heads", heads, "KV heads: all | 0,2");
    f.add("samples", samples, "samples: all | 0,1 (query norms use every chosen sample as one prompt)");
    f.add("max_points", max_points, "at most this many tokens per set, every stride-th, in stream order (0: all)");
    f.add("skip_first", skip_first, "leave out the first N tokens (e.g. the attention sink)");
    f.add("last", last, "only the last N tokens of each sample (e.g. the N a dump generated, dump --generate N); "
                      "0: all");
    f.add("k_max", k_max, "r(k)/diameter for k = 1 .. k_max");
    f.add("silhouette_k", silhouette_k, "k-center centres of the partition scored by silhouette");
    f.add("delta_fractions", delta_fractions, "δ of the δ-clusters as fractions of the set's rms spread");
    f.add("position_bin", position_bin, "tokens per bin of the query-norm trend");
    run_folder_fields(f);
  }
  void check() const {
    KVLAB_CHECK(k_max >= 1, "--k-max must be >= 1, got {}", k_max);
    KVLAB_CHECK(silhouette_k >= 2, "--silhouette-k must be >= 2, got {}", silhouette_k);
    KVLAB_CHECK(!delta_fractions.empty(), "--delta-fractions: give at least one fraction, e.g. 0.5,1");
  }
};

const std::vector<int64_t> kReportK = {1, 2, 4, 8, 16, 32, 64, 128, 256};

std::string fkey(double f) { return fmt::format("{:g}", f); }

// Six significant digits: enough for every figure and table, and result.json stays small.
double sig6(double v) { return std::isfinite(v) ? std::stod(fmt::format("{:.6g}", v)) : v; }

nlohmann::json cluster_row(const Clusterability& c) {
  nlohmann::json r = {{"n_points", c.n}, {"dim", c.dim}, {"diameter", sig6(c.diameter)},
                      {"rms_spread", sig6(c.rms_spread)}, {"silhouette", sig6(c.silhouette)}};
  for (int64_t k : kReportK)
    if (k <= int64_t(c.radius_ratio.size())) {
      r[fmt::format("r{}_over_diam", k)] = sig6(c.radius_ratio[k - 1]);
      // The same radius over r(1), the one-centre radius: free of the diameter's single farthest pair.
      if (k > 1 && c.radius[0] > 0) r[fmt::format("r{}_over_r1", k)] = sig6(c.radius[k - 1] / c.radius[0]);
    }
  nlohmann::json curves = nlohmann::json::array();
  for (const auto& d : c.delta) {
    r["m_final_delta" + fkey(d.fraction)] = d.m.back();
    r["m_exponent_delta" + fkey(d.fraction)] = d.fit.n_points >= 2 ? nlohmann::json(sig6(d.fit.exponent)) : nlohmann::json();
    curves.push_back({{"fraction", d.fraction}, {"delta", sig6(d.delta)}, {"n", d.n}, {"m", d.m},
                      {"exponent", sig6(d.fit.exponent)}, {"r2", sig6(d.fit.r2)}, {"fit_points", d.fit.n_points}});
  }
  r["delta_curves"] = curves;
  return r;
}

void run_clusterability(const ClusterabilityCmdOptions& o, const nlohmann::json& effective) {
  CaptureReader cap(o.capture);
  const auto& meta = cap.meta();
  const auto layers = select_layers(meta, o.layers);
  const auto heads = parse_index_list(o.heads, meta.n_kv_heads, "--heads");
  const auto samples = parse_index_list(o.samples, int(cap.n_samples()), "--samples");
  ClusterabilityOptions copt;
  copt.k_max = o.k_max;
  copt.silhouette_k = o.silhouette_k;
  copt.delta_fractions = o.delta_fractions;
  // k centres of n points with k >= n are n singletons: a silhouette of 0 that says nothing.
  for (int s : samples) {
    const int64_t n_points = strided_positions(cap.sample(s).n_tokens, o.skip_first, o.max_points, o.last).numel();
    KVLAB_CHECK(o.silhouette_k < n_points, "--silhouette-k {} must be below the points scored per head ({} in "
                "sample {}; see --max-points and --skip-first)", o.silhouette_k, n_points, s);
  }

  RunDir run = o.open_run(effective);
  nlohmann::json rows = nlohmann::json::array(), qnorms = nlohmann::json::array();
  // r(k)/diameter curves per (layer, kind): mean, min and max over samples and KV heads.
  std::map<std::pair<int, std::string>, std::vector<std::vector<double>>> curves, curves_r1;
  for (int layer : layers) {
    std::vector<double> per_prompt;
    std::vector<int64_t> pos_all;
    std::vector<double> norm_all;
    for (int s : samples) {
      const LayerQKV qkv = cap.read_layer(s, layer);
      check_finite(cap, s, layer, qkv);
      const auto positions = strided_positions(cap.sample(s).n_tokens, o.skip_first, o.max_points, o.last);  // [n]
      for (int head : heads)
        for (const char* kind : {"keys", "values"}) {
          const at::Tensor& src = std::string(kind) == "keys" ? qkv.k : qkv.v;  // [n_kv_heads, n_tokens, head_dim]
          auto c = clusterability(src[head].index_select(0, positions), copt);
          nlohmann::json r = {{"sample", s}, {"layer", layer}, {"kv_head", head}, {"kind", kind}};
          r.update(cluster_row(c));
          rows.push_back(r);
          curves[{layer, kind}].push_back(c.radius_ratio);
          std::vector<double> over_r1;
          for (double rk : c.radius) over_r1.push_back(c.radius[0] > 0 ? rk / c.radius[0] : 0.0);
          curves_r1[{layer, kind}].push_back(over_r1);
          fmt::print(stderr, "[clusterability] sample {} layer {} head {} {}: r(16)/D {:.3f}, silhouette {:.3f}, "
                     "m exponent {:.3f}\n", s, layer, head, kind,
                     c.radius_ratio[std::min<size_t>(15, c.radius_ratio.size() - 1)], c.silhouette,
                     c.delta.front().fit.exponent);
        }
      auto norms = query_norm_per_position(qkv.q);  // [n_q]
      const int64_t q_start = cap.sample(s).q_start;
      per_prompt.push_back(norms.mean().item<double>());
      for (int64_t i = 0; i < norms.size(0); ++i) {
        pos_all.push_back(q_start + i);
        norm_all.push_back(norms[i].item<double>());
      }
    }
    const MeanCI ci = mean_ci95(per_prompt);
    const NormTrend tr = norm_trend(pos_all, norm_all, o.position_bin);
    qnorms.push_back({{"layer", layer}, {"n_prompts", ci.n}, {"mean", ci.mean}, {"ci95_low", ci.low},
                      {"ci95_high", ci.high}, {"sd", ci.sd}, {"per_prompt", per_prompt},
                      {"trend", {{"bin_start", tr.bin_start}, {"bin_end", tr.bin_end}, {"mean", tr.bin_mean},
                                 {"count", tr.bin_count}, {"slope_per_1k_tokens", tr.slope_per_1k},
                                 {"pearson_r", tr.pearson_r}}}});
  }

  // Keys vs values per layer: means over samples and heads of the scale-free numbers.
  const std::vector<std::string> scalars = {"r4_over_diam", "r16_over_diam", "r64_over_diam", "r16_over_r1",
                                            "r64_over_r1", "silhouette",
                                            "m_exponent_delta" + fkey(o.delta_fractions.front()),
                                            "m_exponent_delta" + fkey(o.delta_fractions.back())};
  nlohmann::json kv = nlohmann::json::array();
  for (int layer : layers)
    for (const char* kind : {"keys", "values"}) {
      nlohmann::json agg = {{"layer", layer}, {"kind", kind}};
      for (const auto& key : scalars) {
        double sum = 0;
        int cnt = 0;
        for (const auto& r : rows)
          if (r["layer"] == layer && r["kind"] == kind && r.contains(key) && r[key].is_number())
            sum += r[key].get<double>(), ++cnt;
        agg[key] = cnt ? nlohmann::json(sum / cnt) : nlohmann::json();
      }
      kv.push_back(agg);
    }
  std::vector<std::string> cols = {"layer", "kind"};
  cols.insert(cols.end(), scalars.begin(), scalars.end());
  const std::string table = render_table(kv, cols);
  std::string qtable;
  for (const auto& q : qnorms)
    qtable += fmt::format("layer {:>2}: mean |q| = {:.3f}  95% CI [{:.3f}, {:.3f}] over {} prompt(s); slope {:+.4f} per "
                          "1k tokens (r = {:+.3f})\n", q["layer"].get<int>(), q["mean"].get<double>(),
                          q["ci95_low"].get<double>(), q["ci95_high"].get<double>(), q["n_prompts"].get<int64_t>(),
                          q["trend"]["slope_per_1k_tokens"].get<double>(), q["trend"]["pearson_r"].get<double>());
  // Mean, min and max over the sets of each (layer, kind) of one curve family, k = 1 .. common length.
  struct Band {
    std::vector<double> k, mean, lo, hi;
  };
  auto band = [](const std::vector<std::vector<double>>& sets) {
    Band b;
    size_t kmax = SIZE_MAX;
    for (const auto& c : sets) kmax = std::min(kmax, c.size());
    for (size_t k = 0; k < kmax; ++k) {
      double sum = 0, lo = INFINITY, hi = -INFINITY;
      for (const auto& c : sets) sum += c[k], lo = std::min(lo, c[k]), hi = std::max(hi, c[k]);
      b.k.push_back(double(k + 1));
      b.mean.push_back(sum / double(sets.size()));
      b.lo.push_back(lo);
      b.hi.push_back(hi);
    }
    return b;
  };
  std::string curve_csv = "layer,kind,k,r_over_diam_mean,r_over_diam_min,r_over_diam_max,r_over_r1_mean,r_over_r1_min,"
                          "r_over_r1_max,sets\n";
  std::vector<CurvePanel> fig_diam, fig_r1;
  for (int layer : layers) {
    CurvePanel pd{fmt::format("layer {}", layer), {}}, pr{fmt::format("layer {}", layer), {}};
    for (const char* kind : {"keys", "values"}) {
      const Band d = band(curves[{layer, kind}]), r1 = band(curves_r1[{layer, kind}]);
      for (size_t k = 0; k < d.k.size(); ++k)
        curve_csv += fmt::format("{},{},{},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{}\n", layer, kind, k + 1, d.mean[k],
                                 d.lo[k], d.hi[k], r1.mean[k], r1.lo[k], r1.hi[k], curves[{layer, kind}].size());
      const bool keys = std::string(kind) == "keys";
      const std::string colour = keys ? "#1f77b4" : "#ff7f0e";
      pd.series.push_back({kind, d.k, d.mean, d.lo, d.hi, colour, !keys});
      pr.series.push_back({kind, r1.k, r1.mean, r1.lo, r1.hi, colour, !keys});
    }
    fig_diam.push_back(pd);
    fig_r1.push_back(pr);
  }
  write_text_atomic(run.file("radius_curve.csv"), curve_csv);
  const std::string who = fmt::format("{}, {} prompt(s) x {} KV head(s): mean, band = min..max", meta.model_id,
                                      samples.size(), heads.size());
  write_text_atomic(run.file("radius_over_diameter.svg"),
                    curve_figure_svg(fig_diam, {"k (greedy k-center centres)", "r(k) / diameter", true, 0, 1},
                                     "k-center radius over the diameter, keys vs values (" + who + ")"));
  write_text_atomic(run.file("radius_over_r1.svg"),
                    curve_figure_svg(fig_r1, {"k (greedy k-center centres)", "r(k) / r(1)", true, 0, 1},
                                     "k-center radius over the one-centre radius, keys vs values (" + who + ")"));
  write_text_atomic(run.file("summary.txt"), "keys vs values (means over samples and KV heads)\n" + table +
                                                 "\nquery norms (ClusterGen Table 1)\n" + qtable);
  auto context = context_block("cpu", 0, effective);
  context["capture"] = {{"file", o.capture}, {"model_id", meta.model_id}, {"source_dataset", meta.source_dataset},
                        {"git_sha", meta.git_sha}};
  run.write_result(context, rows, {{"complete", true}, {"keys_vs_values", kv}, {"query_norms", qnorms},
                                   {"files", {"radius_curve.csv", "radius_over_diameter.svg", "radius_over_r1.svg", "summary.txt"}}});
  std::cout << table << "\n" << qtable;
  fmt::print(stderr, "[clusterability] wrote {}\n", run.path());
}

}  // namespace

void setup_clusterability(CLI::App& app) {
  add_command<ClusterabilityCmdOptions>(app, "clusterability",
                                        "k-center radii, δ-cluster growth and silhouette of keys vs values; query norms",
                                        run_clusterability);
}

}  // namespace kvlab::cli
