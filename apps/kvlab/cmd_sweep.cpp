// kvlab sweep FILE.json [--out DIR] [--emit-jobs DIR] [--max-points N] [--overwrite]
// Runs one command (e.g. replay) at every point of a grid (kvlab/core/sweep.h describes the file),
// each point a child process of this binary,
//   /proc/self/exe --threads N <command> --config <out>/points/NNNN.json     (its "out": <out>/points/NNNN)
// into one folder: config.json (the sweep file), sweep.json (every point's config and columns),
// points/NNNN/ (each point's own run) and result.json naming sweep_rows.jsonl: one row per point
// row, each carrying "sweep_point" and the point's axis values.
//
// Resume: a point whose result.json is complete is not run again, and a point cut off midway
// resumes from its own checkpoint (replay's), so an interrupted sweep run again with the same
// --out gives the rows of an uninterrupted one (timing fields aside). --max-points N runs at most N
// points this time and stops with "complete": false.
//
// --emit-jobs DIR writes the point configs (DIR/points/NNNN.json, outputs under --out), one command
// per point (DIR/commands.txt) and a SLURM array job (DIR/sweep.sbatch) instead of running; after
// the jobs, `kvlab merge <--out>` (or this command again with the same --out) gathers the rows.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sweep.h"

namespace kvlab::cli {
namespace {

namespace fs = std::filesystem;

struct SweepOptions {
  std::string file;
  nlohmann::json spec = nlohmann::json();
  std::string out;
  std::string results_dir = "results";
  std::string emit_jobs;
  int64_t max_points = 0;
  bool overwrite = false;
  void fields(FieldList& f) {
    f.add("file", file, "sweep file (.json): command, base config, axes (see kvlab/core/sweep.h)").positional();
    f.add("spec", spec, "config only: the sweep inline (what the file would hold), e.g. in a `kvlab run` step");
    f.add("out", out, "sweep folder (default: <results-dir>/<name>/<UTC stamp>_<sha7>); the same --out resumes");
    f.add("results_dir", results_dir, "base directory of results");
    f.add("emit_jobs", emit_jobs, "write point configs, commands.txt and a SLURM array job (sweep.sbatch) into this "
                                  "folder instead of running (needs --out)");
    f.add("max_points", max_points, "run at most N points now, then stop (the same --out resumes); 0: all");
    f.add("overwrite", overwrite, "replace an --out folder that holds the results of another sweep");
  }
};

// Runs argv (each argument shell-quoted; stdout discarded if `quiet`); returns the exit status,
// 128 + signal if killed.
int run_child(const std::vector<std::string>& argv, bool quiet = false) {
  std::string cmd;
  for (const auto& a : argv) cmd += shell_quote(a) + " ";
  if (quiet) cmd += "> /dev/null";
  const int st = std::system(cmd.c_str());
  if (st == -1) return 127;
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

bool point_done(const std::string& dir) {
  if (!fs::exists(dir + "/result.json")) return false;
  return read_json_file(dir + "/result.json").value("complete", false);
}

void run_sweep(const SweepOptions& o, const nlohmann::json& effective) {
  KVLAB_CHECK(o.file.empty() != o.spec.is_null(), "sweep: give a sweep file or (in a config) an inline \"spec\", "
              "exactly one of them");
  const nlohmann::json raw = o.file.empty() ? o.spec : read_json_file(o.file);
  const std::string source = o.file.empty() ? std::string("the inline spec") : o.file;
  const SweepSpec spec = parse_sweep(raw, source);
  auto points = expand_sweep(spec);
  KVLAB_CHECK(o.max_points >= 0, "--max-points must be >= 0 (0: all), got {}", o.max_points);
  KVLAB_CHECK(o.emit_jobs.empty() || !o.out.empty(), "--emit-jobs {} needs --out: the folder every job writes its "
              "point into (on storage the cluster's nodes share)", o.emit_jobs);
  const std::string self = fs::canonical("/proc/self/exe").string();

  RunDir run = open_run_dir(o.out, o.results_dir, spec.name, raw, o.overwrite);
  const std::string out_abs = fs::absolute(run.path()).lexically_normal().string();
  const std::string cfg_dir = o.emit_jobs.empty() ? out_abs : fs::absolute(o.emit_jobs).lexically_normal().string();
  if (!o.emit_jobs.empty()) {
    // The jobs folder is kvlab's when it holds jobs.json (this sweep's spec, written below) or is
    // empty: a user's sweep.sbatch, commands.txt or points/ are never replaced unasked (issue 26).
    std::error_code ec;
    if (fs::exists(cfg_dir, ec)) {
      KVLAB_CHECK(fs::is_directory(cfg_dir, ec), "--emit-jobs {}: exists and is not a folder", o.emit_jobs);
      const bool empty = fs::directory_iterator(cfg_dir, ec) == fs::directory_iterator();
      nlohmann::json earlier;
      try {
        if (fs::exists(cfg_dir + "/jobs.json", ec)) earlier = nlohmann::json::parse(std::ifstream(cfg_dir + "/jobs.json"));
      } catch (const std::exception&) {
      }
      KVLAB_CHECK(empty || earlier == raw || o.overwrite, "--emit-jobs {}: holds files kvlab did not write for this "
                  "sweep (no jobs.json with this spec); choose a new or empty folder, or pass --overwrite to replace "
                  "them", o.emit_jobs);
    }
  }
  fs::create_directories(cfg_dir + "/points");
  fs::create_directories(out_abs + "/points");
  for (auto& p : points) p.config["out"] = out_abs + "/" + sweep_point_name(p.index);

  // Every point's config is checked by its own command before anything runs.
  for (const auto& p : points) {
    const std::string file = cfg_dir + "/" + sweep_point_name(p.index) + ".json";
    write_json_atomic(file, p.config);
    const int rc = run_child({self, spec.command, "--config", file, "--print-config"}, /*quiet=*/true);
    KVLAB_CHECK(rc == 0, "{}: point {} ({}) is not a valid '{}' config (see the error above)", source, p.index,
                p.columns.dump(), spec.command);
  }
  write_json_atomic(out_abs + "/sweep.json", sweep_manifest(raw, points));

  if (!o.emit_jobs.empty()) {
    fs::create_directories(cfg_dir + "/logs");
    write_json_atomic(cfg_dir + "/jobs.json", raw);
    write_text_atomic(cfg_dir + "/commands.txt", sweep_commands(spec, points, self, cfg_dir));
    write_text_atomic(cfg_dir + "/sweep.sbatch", sweep_slurm_script(spec, points, self, cfg_dir));
    fs::permissions(cfg_dir + "/sweep.sbatch", fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
    fmt::print("{} points of `kvlab {}`:\n  sbatch {}/sweep.sbatch      (or run the lines of {}/commands.txt)\nthen "
               "gather the rows:\n  kvlab merge {} --out <merged folder>\n", points.size(), spec.command, cfg_dir,
               cfg_dir, out_abs);
    return;
  }

  auto context = context_block("cpu", 0, raw);
  context["sweep"] = {{"name", spec.name}, {"command", spec.command}, {"n_points", points.size()}};
  int ran = 0;
  for (const auto& p : points) {
    const std::string pdir = out_abs + "/" + sweep_point_name(p.index);
    if (point_done(pdir)) {
      fmt::print(stderr, "[sweep] point {}/{} {}: done before, kept\n", p.index + 1, points.size(), p.columns.dump());
      continue;
    }
    if (o.max_points > 0 && ran >= o.max_points) break;
    fmt::print(stderr, "[sweep] point {}/{} {}\n", p.index + 1, points.size(), p.columns.dump());
    const int rc = run_child({self, "--threads", std::to_string(threads()), spec.command, "--config",
                              out_abs + "/" + sweep_point_name(p.index) + ".json"});
    KVLAB_CHECK(rc == 0, "sweep point {} ({}) failed with exit status {}; run the same command again to resume from "
                "it", p.index, p.columns.dump(), rc);
    ++ran;
    int done = 0;
    auto rows = gather_sweep_rows(out_abs, false, &done);
    run.write_result_and_rows(context, rows, kSweepRowsFile, {{"complete", false}, {"points_done", done}});
  }
  int done = 0;
  auto rows = gather_sweep_rows(out_abs, false, &done);
  const bool complete = done == int(points.size());
  run.write_result_and_rows(context, rows, kSweepRowsFile, {{"complete", complete}, {"points_done", done}});
  fmt::print(stderr, "[sweep] {} of {} points done, {} rows -> {}{}\n", done, points.size(), rows.size(),
             run.file("result.json"), complete ? "" : " (incomplete: run the same command again to continue)");
}

}  // namespace

void setup_sweep(CLI::App& app) {
  add_command<SweepOptions>(app, "sweep", "Run a command over a grid of parameter values (resumable; SLURM jobs)",
                            run_sweep);
}

}  // namespace kvlab::cli
