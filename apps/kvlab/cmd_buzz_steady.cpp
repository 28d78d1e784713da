// kvlab buzz-steady [--cache-size 200] [--stride 5] [--n-sink 4] [--t-over-w 1.5,2.5,...]
//                   --out DIR | --name N
// BUZZ Table A / Fig. 4's other half: for each T/w, the layout (w, T) of a cache of C entries and
// the simulated steady-state size of BUZZ's sampled region (old samples after each eviction,
// streamed token by token through BuzzCache), beside Theorem 3.1's ρ and the recurrence's fixed
// point (T + 1)/ρ. Writes result.json (one row per T/w) and prints the table.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/analysis/buzz_steady.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct BuzzSteadyOptions : RunFolderOptions {
  BuzzSteadyOptions() : RunFolderOptions("buzz_steady") {}
  int64_t cache_size = 200;
  int64_t stride = 5;
  int64_t n_sink = 4;
  std::vector<double> t_over_w = {1.5, 2.5, 3.5, 4.5, 5.5, 6.5};
  int64_t evictions = 200;
  int64_t warmup = 50;
  void fields(FieldList& f) {
    f.add("cache_size", cache_size, "cache entries C = k + w + T");
    f.add("stride", stride, "BUZZ stride s (>= 3)");
    f.add("n_sink", n_sink, "sink entries k");
    f.add("t_over_w", t_over_w, "T/w values; w = round((C - k)/(1 + T/w)), T = C - k - w");
    f.add("evictions", evictions, "evictions streamed per T/w");
    f.add("warmup", warmup, "first evictions left out of the steady-state statistics");
    run_folder_fields(f);
  }
};

void run_buzz_steady(const BuzzSteadyOptions& o, const nlohmann::json& effective) {
  KVLAB_CHECK(!o.t_over_w.empty(), "--t-over-w: give at least one ratio, e.g. 1.5,4.33");
  nlohmann::json rows = nlohmann::json::array();
  for (double r : o.t_over_w) {
    const auto s = buzz_steady_state(o.cache_size, o.n_sink, o.stride, r, o.evictions, o.warmup);
    rows.push_back({{"t_over_w_asked", s.t_over_w_asked}, {"window", s.window}, {"threshold", s.threshold},
                    {"n_sink", s.n_sink}, {"stride", s.stride}, {"t_over_w", s.t_over_w},
                    {"theorem_ratio", s.theorem_ratio}, {"fixed_point", s.fixed_point},
                    {"sampled_mean", s.sampled_mean}, {"sampled_min", s.sampled_min}, {"sampled_max", s.sampled_max},
                    {"sampled_over_window", s.sampled_over_window}, {"evictions", s.evictions},
                    {"peak_size", s.peak_size}});
  }
  RunDir run = o.open_run(effective);
  run.write_result(context_block("cpu", 0, effective), rows, {{"complete", true}});
  std::cout << render_table(rows, {"t_over_w_asked", "window", "threshold", "t_over_w", "sampled_mean", "sampled_min",
                                   "sampled_max", "sampled_over_window", "fixed_point", "theorem_ratio", "peak_size"});
  fmt::print(stderr, "[buzz-steady] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_buzz_steady(CLI::App& app) {
  add_command<BuzzSteadyOptions>(app, "buzz-steady",
                                 "BUZZ's steady-state sampled region per T/w vs Theorem 3.1 (Table A / Fig. 4)",
                                 run_buzz_steady);
}

}  // namespace kvlab::cli
