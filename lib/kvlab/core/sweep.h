// A sweep: one command (e.g. replay) run at every point of a grid of parameter values. The sweep
// file describes it completely:
//
//   {"name": "buzz_tableA", "paper_ref": "...", "version": 1, "description": "...",
//    "command": "replay",
//    "base": {...the command's config...},
//    "axes": [
//      {"key": "budget", "values": [[100], [200]]},                   // one config key (dotted path
//      {"key": "params.buzz.stride", "values": [3, 5]},                //   into nested objects)
//      {"name": "layout", "values": [                                  // several keys together
//         {"params.buzz.window": 78, "params.buzz.threshold": 118, "label.T_over_w": 1.5}, ...]}
//    ]}
//
// Points are the Cartesian product of the axes. A value of a "name" axis is an object whose keys
// are config paths set together (zipped), except "label.X", which only adds column X to the
// point's rows. Every point's rows carry "sweep_point" (its index) and one column per axis: the
// key's value for a "key" axis (named by the key), the labels and paths for a "name" axis.
//
// Order, cheapest reloads first: axes whose key is one of kReloadKeys (capture, model, dataset,
// text: each change reloads a file or a model) vary slowest, so consecutive points share what they
// load; the other axes keep their declared order, the last varying fastest. Point indices follow
// that order.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvlab {

struct SweepAxis {
  std::string key;    // a "key" axis: the config path it sets
  std::string name;   // a "name" axis: its name
  std::vector<nlohmann::json> values;
};

struct SweepSpec {
  std::string name, paper_ref, description, command;
  int version = 1;
  nlohmann::json base;  // the command's config shared by every point
  std::vector<SweepAxis> axes;
};

struct SweepPoint {
  int index = 0;
  nlohmann::json config;   // base with this point's values set
  nlohmann::json columns;  // added to each of its rows: {"sweep_point": i, axis columns...}
};

// Config keys whose change reloads a file or model (the outermost axes).
extern const std::vector<std::string> kReloadKeys;

// Validates the sweep file's structure (unknown keys, empty axes, a "key" and a "name" axis
// together, a "name" axis value that is not an object); errors name `source` and the key.
SweepSpec parse_sweep(const nlohmann::json& j, const std::string& source);

// Every point, in run order (see above).
std::vector<SweepPoint> expand_sweep(const SweepSpec& spec);

// Sets `path` ("a.b.c") in j to v, creating objects on the way; a non-object in the way is an error.
void set_json_path(nlohmann::json& j, const std::string& path, const nlohmann::json& v);

// "points/0007": a point's folder (and, with ".json", its config file) inside a sweep folder.
std::string sweep_point_name(int index);

// The rows of one finished point read from its result.json (inline "rows" or a "rows_file"),
// each with the point's columns added. Errors name the file when it is missing or incomplete.
nlohmann::json sweep_point_rows(const std::string& point_dir, const SweepPoint& point);

// A sweep folder's sweep.json: {"spec": the sweep file, "points": [{"index", "columns", "config"}]}.
nlohmann::json sweep_manifest(const nlohmann::json& spec_json, const std::vector<SweepPoint>& points);
std::vector<SweepPoint> manifest_points(const nlohmann::json& manifest, const std::string& source);

// The rows of every finished point of the sweep folder `dir` (read from dir/sweep.json), in point
// order; `done` gets the number of finished points. With `require_all`, an unfinished point is an
// error naming it.
nlohmann::json gather_sweep_rows(const std::string& dir, bool require_all, int* done);

// A sweep's result.json keeps its rows in this file beside it, one compact row per line (a grid's
// rows outgrow an indented result.json: BUZZ Table A's 2,100 rows were 2.3 MB). Committed with a
// finished sweep (.gitignore leaves out the points' own result.json, not this), unlike replay's
// optional rows.jsonl dumps.
inline constexpr const char* kSweepRowsFile = "sweep_rows.jsonl";

// A SLURM array-job script running point $SLURM_ARRAY_TASK_ID of `n_points`: a `case` over the
// indices, each line `"$KVLAB" <command> --config <jobs_dir>/points/NNNN.json` (KVLAB defaults to
// `kvlab_bin`, overridable from the environment; --threads from $KVLAB_THREADS or
// $SLURM_CPUS_PER_TASK when set). Logs go to <jobs_dir>/logs/.
std::string sweep_slurm_script(const SweepSpec& spec, const std::vector<SweepPoint>& points,
                               const std::string& kvlab_bin, const std::string& jobs_dir);

// The same commands, one per line (for any other scheduler or a plain loop).
std::string sweep_commands(const SweepSpec& spec, const std::vector<SweepPoint>& points,
                           const std::string& kvlab_bin, const std::string& jobs_dir);

// POSIX shell single-quoting: 'it'\''s'.
std::string shell_quote(const std::string& s);

}  // namespace kvlab
