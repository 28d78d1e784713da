// Sweeps: parsing, grid expansion in reload order, point rows, and job scripts.
#include "kvlab/core/sweep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/report.h"

namespace kvlab {

const std::vector<std::string> kReloadKeys = {"capture", "model", "dataset", "text"};

namespace {

const std::vector<std::string> kTopKeys = {"name", "paper_ref", "version", "description", "command", "base", "axes"};

void check_known(const nlohmann::json& j, const std::vector<std::string>& allowed, const std::string& where) {
  KVLAB_CHECK(j.is_object(), "{}: expected a JSON object, found {}", where, j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it)
    KVLAB_CHECK(std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end(),
                "{}: unknown key '{}' (known: {})", where, it.key(), fmt::join(allowed, ", "));
}

bool is_reload_axis(const SweepAxis& a) {
  return !a.key.empty() && std::find(kReloadKeys.begin(), kReloadKeys.end(), a.key) != kReloadKeys.end();
}

}  // namespace

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void set_json_path(nlohmann::json& j, const std::string& path, const nlohmann::json& v) {
  KVLAB_CHECK(!path.empty(), "sweep: an empty config path");
  nlohmann::json* cur = &j;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    KVLAB_CHECK(!part.empty(), "sweep: config path '{}' has an empty part", path);
    if (cur->is_null()) *cur = nlohmann::json::object();
    KVLAB_CHECK(cur->is_object(), "sweep: config path '{}': '{}' is inside a {}, not an object", path, part,
                cur->type_name());
    if (dot == std::string::npos) {
      (*cur)[part] = v;
      return;
    }
    cur = &(*cur)[part];
    start = dot + 1;
  }
}

SweepSpec parse_sweep(const nlohmann::json& j, const std::string& source) {
  check_known(j, kTopKeys, source);
  SweepSpec s;
  KVLAB_CHECK(j.contains("command") && j["command"].is_string(), "{}: 'command' (e.g. \"replay\") is required", source);
  KVLAB_CHECK(j.contains("name") && j["name"].is_string(), "{}: 'name' (the results subfolder) is required", source);
  s.command = j["command"];
  s.name = j["name"];
  s.paper_ref = j.value("paper_ref", "");
  s.description = j.value("description", "");
  s.version = j.value("version", 1);
  s.base = j.value("base", nlohmann::json::object());
  KVLAB_CHECK(s.base.is_object(), "{}: 'base' must be an object (the {} config), found {}", source, s.command,
              s.base.type_name());
  KVLAB_CHECK(j.contains("axes") && j["axes"].is_array() && !j["axes"].empty(),
              "{}: 'axes' must be a non-empty list of {{\"key\": ..., \"values\": [...]}} or {{\"name\": ..., "
              "\"values\": [{{...}}]}}", source);
  std::map<std::string, size_t> set_by;  // config path or label column -> the axis that sets it
  auto claim = [&](const std::string& path, size_t i) {
    const auto [it, fresh] = set_by.emplace(path, i);
    KVLAB_CHECK(fresh || it->second == i, "{}: axes[{}] and axes[{}] both set '{}' (the later would silently "
                "win; put the values in one axis)", source, it->second, i, path);
  };
  for (size_t i = 0; i < j["axes"].size(); ++i) {
    const auto& a = j["axes"][i];
    const std::string where = fmt::format("{}: axes[{}]", source, i);
    check_known(a, {"key", "name", "values"}, where);
    SweepAxis axis;
    axis.key = a.value("key", "");
    axis.name = a.value("name", "");
    KVLAB_CHECK(axis.key.empty() != axis.name.empty(), "{}: give exactly one of 'key' (one config path) or 'name' "
                "(values are objects of paths set together)", where);
    KVLAB_CHECK(a.contains("values") && a["values"].is_array() && !a["values"].empty(),
                "{}: 'values' must be a non-empty list", where);
    for (const auto& v : a["values"]) {
      if (!axis.name.empty()) {
        KVLAB_CHECK(v.is_object() && !v.empty(), "{}: each value of a 'name' axis is an object of config paths "
                    "(and label.X columns), found {}", where, v.dump());
        for (const auto& [path, _] : v.items()) claim(path, i);
      }
      axis.values.push_back(v);
    }
    if (!axis.key.empty()) claim(axis.key, i);
    else claim("name:" + axis.name, i);  // two axes of one name would give one column
    s.axes.push_back(std::move(axis));
  }
  return s;
}

std::vector<SweepPoint> expand_sweep(const SweepSpec& spec) {
  std::vector<SweepAxis> axes;
  for (const auto& a : spec.axes)
    if (is_reload_axis(a)) axes.push_back(a);
  for (const auto& a : spec.axes)
    if (!is_reload_axis(a)) axes.push_back(a);
  size_t total = 1;
  for (const auto& a : axes) total *= a.values.size();
  std::vector<SweepPoint> points;
  for (size_t flat = 0; flat < total; ++flat) {
    SweepPoint p;
    p.index = int(flat);
    p.config = spec.base;
    p.columns = {{"sweep_point", p.index}};
    size_t rest = flat;
    std::vector<size_t> pick(axes.size());
    for (size_t a = axes.size(); a-- > 0;) {  // the last axis varies fastest
      pick[a] = rest % axes[a].values.size();
      rest /= axes[a].values.size();
    }
    for (size_t a = 0; a < axes.size(); ++a) {
      const auto& v = axes[a].values[pick[a]];
      if (!axes[a].key.empty()) {
        set_json_path(p.config, axes[a].key, v);
        p.columns[axes[a].key] = v;
        continue;
      }
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it.key().rfind("label.", 0) == 0) {
          p.columns[it.key().substr(6)] = it.value();
        } else {
          set_json_path(p.config, it.key(), it.value());
          p.columns[it.key()] = it.value();
        }
      }
    }
    points.push_back(std::move(p));
  }
  return points;
}

std::string sweep_point_name(int index) { return fmt::format("points/{:04d}", index); }

nlohmann::json sweep_point_rows(const std::string& point_dir, const SweepPoint& point) {
  const std::string file = point_dir + "/result.json";
  std::ifstream probe(file);
  KVLAB_CHECK(probe.good(), "sweep point {}: no {} (the point has not run)", point.index, file);
  const nlohmann::json result = read_json_file(file);
  KVLAB_CHECK(result.value("complete", false), "sweep point {}: {} is incomplete (its run did not finish)", point.index,
              file);
  nlohmann::json rows = read_result_rows(result, file);
  for (auto& r : rows) r.update(point.columns);
  return rows;
}

nlohmann::json sweep_manifest(const nlohmann::json& spec_json, const std::vector<SweepPoint>& points) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : points) pts.push_back({{"index", p.index}, {"columns", p.columns}, {"config", p.config}});
  return {{"spec", spec_json}, {"points", pts}};
}

std::vector<SweepPoint> manifest_points(const nlohmann::json& manifest, const std::string& source) {
  KVLAB_CHECK(manifest.is_object() && manifest.contains("points") && manifest["points"].is_array(),
              "{}: not a kvlab sweep manifest (no \"points\" list)", source);
  std::vector<SweepPoint> points;
  for (const auto& p : manifest["points"]) {
    SweepPoint sp;
    sp.index = p.at("index").get<int>();
    sp.columns = p.at("columns");
    sp.config = p.at("config");
    points.push_back(std::move(sp));
  }
  return points;
}

nlohmann::json gather_sweep_rows(const std::string& dir, bool require_all, int* done) {
  const auto points = manifest_points(read_json_file(dir + "/sweep.json"), dir + "/sweep.json");
  nlohmann::json rows = nlohmann::json::array();
  int n = 0;
  for (const auto& p : points) {
    const std::string pdir = dir + "/" + sweep_point_name(p.index);
    std::ifstream probe(pdir + "/result.json");
    if (!probe.good() || !read_json_file(pdir + "/result.json").value("complete", false)) {
      KVLAB_CHECK(!require_all, "sweep {}: point {} has not finished ({}/result.json missing or incomplete); run its "
                  "job (or `kvlab sweep` with the same --out) first", dir, p.index, pdir);
      continue;
    }
    for (auto& r : sweep_point_rows(pdir, p)) rows.push_back(std::move(r));
    ++n;
  }
  if (done) *done = n;
  return rows;
}

std::string sweep_commands(const SweepSpec& spec, const std::vector<SweepPoint>& points,
                           const std::string& kvlab_bin, const std::string& jobs_dir) {
  std::string out;
  for (const auto& p : points)
    out += fmt::format("{} {} --config {}\n", shell_quote(kvlab_bin), spec.command,
                       shell_quote(jobs_dir + "/" + sweep_point_name(p.index) + ".json"));
  return out;
}

std::string sweep_slurm_script(const SweepSpec& spec, const std::vector<SweepPoint>& points,
                               const std::string& kvlab_bin, const std::string& jobs_dir) {
  std::string s = fmt::format(
      "#!/bin/bash\n"
      "# kvlab sweep '{}' ({} points of `kvlab {}`) as a SLURM array job: one point per task.\n"
      "#   sbatch {}/sweep.sbatch       then, when every task is done:\n"
      "#   kvlab merge <the sweep's --out> --out <merged folder>   (or rerun `kvlab sweep` with the same --out)\n"
      "# Locally: SLURM_ARRAY_TASK_ID=3 bash {}/sweep.sbatch\n"
      "#SBATCH --job-name=kvlab-{}\n"
      "#SBATCH --array=0-{}\n"
      "#SBATCH --output={}/logs/%A_%a.out\n"
      "#SBATCH --error={}/logs/%A_%a.err\n"
      "set -euo pipefail\n"
      "KVLAB=\"${{KVLAB:-{}}}\"\n"
      "# LibTorch threads: $KVLAB_THREADS, else the CPUs SLURM gave the task, else kvlab's default (the core count)\n"
      "threads=\"${{KVLAB_THREADS:-${{SLURM_CPUS_PER_TASK:-}}}}\"\n"
      "task=\"${{SLURM_ARRAY_TASK_ID:?SLURM_ARRAY_TASK_ID is not set (sbatch sets it; set it to run one point "
      "locally)}}\"\n"
      "case \"$task\" in\n",
      spec.name, points.size(), spec.command, jobs_dir, jobs_dir, spec.name, points.size() - 1, jobs_dir, jobs_dir,
      kvlab_bin);
  for (const auto& p : points)
    s += fmt::format("  {}) exec \"$KVLAB\" ${{threads:+--threads \"$threads\"}} {} --config {} ;;\n", p.index,
                     spec.command,
                     shell_quote(jobs_dir + "/" + sweep_point_name(p.index) + ".json"));
  s += fmt::format("  *) echo \"kvlab sweep '{}': no point $task (0..{})\" >&2; exit 2 ;;\nesac\n", spec.name,
                   points.size() - 1);
  return s;
}

}  // namespace kvlab
