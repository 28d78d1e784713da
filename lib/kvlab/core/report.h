// result.json: a google/benchmark-style `context` block plus self-describing `rows`, shared by
// every subcommand. Written atomically (temp file, fsync, rename, fsync of the directory).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kvlab {

// Writes `j` to `path` via "<path>.partial": written, fsync'd, renamed over `path`, and the
// directory fsync'd, so a reader (or a machine that lost power) sees the old file or the new one,
// never half of one. A failed write (a full disk: "No space left on device") is one kvlab::Error
// naming the file and the system's reason; the partial file is removed and `path` left as it was.
void write_json_atomic(const std::string& path, const nlohmann::json& j);
void write_text_atomic(const std::string& path, const std::string& text);

// A command killed before it finished leaves "<path>.partial" behind (its writer never got to
// remove it). Removes that file; returns whether there was one, for the command to say so.
bool remove_stale_partial(const std::string& path);

// Before a command writes the file `path` (given by `flag`): refuses, with one line naming the
// flag, a path that is one of `inputs` (a file, or any file inside an input directory: e.g. the
// model being read) whatever `overwrite` says; a path that exists and is not a regular file; and
// an existing file unless `overwrite`.
void check_output_file(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs,
                       bool overwrite);

// A run directory: results/<experiment>/<UTC yyyymmdd-HHMMSS>_<sha7>[-dirty]/ holding
// config.json at creation and result.json at the end. Locked while any copy of it lives
// (<dir>/.kvlab.lock, flock(2), holding the writer's pid): a second run into the same folder is
// refused with one line; the kernel drops the lock of a process that dies, and a run that finds
// a pid left by one that did not finish says it takes over.
// Whether two configs compute the same results: equal but for the keys that say how a run goes
// (out, quiet, overwrite, no_batch) and for a key added to kvlab after one of them was written,
// absent there and at the value that behaves as before in the other (ratio_of = "prompt",
// layer_error = false).
bool same_run_config(nlohmann::json a, nlohmann::json b);

class RunDir {
 public:
  // base: e.g. "results"; an explicit `--out` dir is used as is when `exact` is true. An exact
  // dir holding the config.json of another config is refused unless `overwrite`.
  RunDir(const std::string& base, const std::string& experiment, const nlohmann::json& config,
         bool exact = false, bool overwrite = false);
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes result.json = {"context": ..., "rows": rows, ...extra} as result_json_text lays it out.
  void write_result(const nlohmann::json& context, const nlohmann::json& rows,
                    const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with the rows in the file `rows_file` beside it, one compact row per line, and
  // result.json holding "rows": [], "rows_file" and "n_rows" (for runs whose rows outgrow an
  // indented JSON file). The rows file is written first: result.json never names rows not there.
  void write_result_and_rows(const nlohmann::json& context, const nlohmann::json& rows, const std::string& rows_file,
                             nlohmann::json extra = nlohmann::json::object()) const;

 private:
  std::string path_;
  std::shared_ptr<int> lock_;  // the lock file's descriptor, shared by copies; released by the last
};

// The pid of a live kvlab run writing into `dir` (one holding its .kvlab.lock), or "" when none is:
// for readers of a run folder (ruler eval) that must not score one still being written.
std::string run_dir_writer(const std::string& dir);

// result.json's layout: `j` as dump(2) writes it, except that each of "rows" is one compact line
// (a grid's rows stay diffable row by row, at a third of the indented size: 1,606 RULER rows with
// 20 per-record scores each were 2.4 MB indented, 1.7 MB so). Parses back to `j`.
std::string result_json_text(const nlohmann::json& j);

// The rows of a result.json (`path`): its "rows", or the lines of the "rows_file" it names (which
// must hold "n_rows" of them: a file cut short is an error naming both files).
// A missing rows file or a line that is not JSON is an error naming the file (and line).
nlohmann::json read_result_rows(const std::string& path);
// The same for a result.json already read (`result`, from the file `path`).
nlohmann::json read_result_rows(const nlohmann::json& result, const std::string& path);

// A command's run folder from its --out / --results-dir / --name / --overwrite flags: --out as
// given (the same --out resumes), else <results_dir>/<name>/<UTC stamp>_<sha7>.
RunDir open_run_dir(const std::string& out, const std::string& results_dir, const std::string& name,
                    const nlohmann::json& config, bool overwrite);

// Renders rows as an aligned text table over the given columns (numbers with `precision`).
std::string render_table(const nlohmann::json& rows, const std::vector<std::string>& columns,
                         int precision = 4);
// CSV of the given columns.
std::string render_csv(const nlohmann::json& rows, const std::vector<std::string>& columns);

}  // namespace kvlab
