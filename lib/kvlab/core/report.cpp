#include "kvlab/core/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"

namespace kvlab {

void write_text_atomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KVLAB_CHECK(out.good(), "cannot write '{}'", tmp);
    out << text;
    out.flush();
    KVLAB_CHECK(out.good(), "write to '{}' failed (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KVLAB_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

void write_json_atomic(const std::string& path, const nlohmann::json& j) {
  write_text_atomic(path, j.dump(2) + "\n");
}

RunDir::RunDir(const std::string& base, const std::string& experiment, const nlohmann::json& config,
               bool exact) {
  namespace fs = std::filesystem;
  if (exact) {
    path_ = base;
  } else {
    std::string sha = git_sha().substr(0, 7);
    path_ = fmt::format("{}/{}/{}_{}{}", base, experiment, utc_stamp(), sha, git_dirty() ? "-dirty" : "");
  }
  std::error_code ec;
  fs::create_directories(path_, ec);
  KVLAB_CHECK(!ec, "cannot create results directory '{}': {}", path_, ec.message());
  write_json_atomic(file("config.json"), config);
}

void RunDir::write_result(const nlohmann::json& context, const nlohmann::json& rows,
                          const nlohmann::json& extra) const {
  nlohmann::json j = {{"context", context}, {"rows", rows}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  write_json_atomic(file("result.json"), j);
}

namespace {
std::string cell(const nlohmann::json& v, int precision) {
  if (v.is_null()) return "";
  if (v.is_number_float()) return fmt::format("{:.{}g}", v.get<double>(), precision);
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}
}  // namespace

std::string render_table(const nlohmann::json& rows, const std::vector<std::string>& columns,
                         int precision) {
  std::vector<size_t> width(columns.size());
  std::vector<std::vector<std::string>> cells;
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].size();
  for (const auto& r : rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < columns.size(); ++c) {
      line.push_back(r.contains(columns[c]) ? cell(r[columns[c]], precision) : "");
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  std::string out;
  for (size_t c = 0; c < columns.size(); ++c) out += fmt::format("{:<{}}  ", columns[c], width[c]);
  out += "\n";
  for (const auto& line : cells) {
    for (size_t c = 0; c < columns.size(); ++c) out += fmt::format("{:<{}}  ", line[c], width[c]);
    out += "\n";
  }
  return out;
}

std::string render_csv(const nlohmann::json& rows, const std::vector<std::string>& columns) {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  std::string out = fmt::format("{}\n", fmt::join(columns, ","));
  for (const auto& r : rows) {
    std::vector<std::string> line;
    for (const auto& c : columns) line.push_back(quote(r.contains(c) ? cell(r[c], 10) : ""));
    out += fmt::format("{}\n", fmt::join(line, ","));
  }
  return out;
}

}  // namespace kvlab
