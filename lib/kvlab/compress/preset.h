// Presets: a named, complete setting of a method (issue 21, docs/methods.md §5 "End-to-end settings").
//
//   default  the method's own parameter defaults, no exact tokens besides the method's own: what
//            replay's single-layer studies use, and what every run used before issue 21.
//   paper    the setting of the method's paper's end-to-end experiments (LongBench, LongEval, ...),
//            from the paper and its official code. Each method's file defines it (paper_preset_*)
//            and says there where every number comes from.
//
// A preset holds the method's parameters and the exact tokens the harness keeps around the
// compressed region (keep_first sinks, keep_last recent); both count inside the budget when a run
// counts memory whole (generate/branches.h). Where a preset needs a file only a calibration makes
// (Chelsea's outlier heads), `required_file` names the parameter holding it, and `make_command`
// the command that writes it; "{model}" in either is replaced by the run's model name.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

struct MethodPreset {
  nlohmann::json params = nlohmann::json::object();
  int64_t keep_first = 0;     // exact positions [0, keep_first) before the region
  int64_t keep_last = 0;      // exact positions [n - keep_last, n) after it
  std::string source;         // one line: where the numbers come from (details in the method's file)
  std::string required_file;  // parameter naming a file the run must have ("" = none)
  std::string make_command;   // the command that writes it
};

// The preset names --preset accepts.
const std::vector<std::string>& preset_names();

// Throws kvlab::Error naming --preset for an unknown name.
void check_preset_name(const std::string& preset);

// "{model}" in `text` replaced by the run's --model value reduced to a file-safe name (a path gives
// its file or folder name without extension: ../shared/models/stories260K -> stories260K).
std::string expand_model(const std::string& text, const std::string& model);

}  // namespace kvlab
