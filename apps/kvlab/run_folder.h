// The flags of a command that writes one run folder, shared by every such command (issue 49: the
// same four flags were declared again in each cmd_*.cpp): --out, else a new
// <results-dir>/<name>/<UTC stamp>_<sha7>, and --overwrite. An options struct derives from it and
// adds them with run_folder_fields(f); open_run() makes the folder (core/report.h RunDir).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>

#include "kvlab/core/config.h"
#include "kvlab/core/report.h"

namespace kvlab::cli {

struct RunFolderOptions {
  std::string out;
  std::string name;  // the experiment: the results subfolder, the command's name by default
  std::string results_dir = "results";
  bool overwrite = false;

  explicit RunFolderOptions(std::string experiment) : name(std::move(experiment)) {}
  // `resumes`: the same --out picks up an interrupted run (the help says so).
  void run_folder_fields(FieldList& f, bool resumes = false) {
    f.add("out", out, std::string("run directory (default: <results-dir>/<name>/<UTC stamp>_<sha7>)") +
                          (resumes ? "; the same --out resumes" : ""));
    f.add("name", name, "experiment name (the results subfolder)");
    f.add("results_dir", results_dir, "base directory of results");
    f.add("overwrite", overwrite, "replace an --out folder that holds the results of another config");
  }
  RunDir open_run(const nlohmann::json& effective) const {
    return open_run_dir(out, results_dir, name, effective, overwrite);
  }
};

}  // namespace kvlab::cli
