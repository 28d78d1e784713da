#include "kvlab/tasks/task_merge.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/write_check.h"
#include "kvlab/tasks/task_runner.h"

namespace kvlab {

namespace fs = std::filesystem;
using nlohmann::json;

json merge_task_rows(const std::vector<json>& shard_rows) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<json>> groups;
  for (const auto& rows : shard_rows)
    for (const auto& r : rows) {
      const std::string key = r.at("branch").get<std::string>() + "\n" + r.at("dataset").get<std::string>();
      if (!groups.count(key)) order.push_back(key);
      groups[key].push_back(r);
    }
  json out = json::array();
  for (const auto& key : order) {
    // A shard that drew none of a dataset's records has a row with n = 0 and no memory columns:
    // it adds nothing (when every shard's row is empty, the first stands).
    std::vector<json> parts;
    for (const auto& r : groups[key])
      if (r.at("n").get<double>() > 0) parts.push_back(r);
    if (parts.empty()) parts.push_back(groups[key].front());
    double n = 0;
    for (const auto& r : parts) n += r.at("n").get<double>();
    json m = parts.front();
    m["n"] = int64_t(n);
    m["record_scores"] = json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.key() == "n" || it.key() == "record_scores" || it.key() == "mem") continue;  // mem: marked again below
      const bool same_integer =
          it.value().is_number_integer() &&
          std::all_of(parts.begin(), parts.end(), [&](const json& r) { return r.value(it.key(), json()) == it.value(); });
      if (same_integer) continue;  // a setting (keep_first): stays an integer
      if (it.value().is_number()) {
        double s = 0;
        for (const auto& r : parts) s += r.at(it.key()).get<double>() * r.at("n").get<double>();
        it.value() = n > 0 ? s / n : 0.0;
      } else {
        for (const auto& r : parts)
          KVLAB_CHECK(r.value(it.key(), json()) == it.value(), "merge: shards disagree on '{}' of {} ({} vs {})",
                      it.key(), key, r.value(it.key(), json()).dump(), it.value().dump());
      }
    }
    for (const auto& r : parts)
      for (auto it = r["record_scores"].begin(); it != r["record_scores"].end(); ++it) {
        KVLAB_CHECK(!m["record_scores"].contains(it.key()), "merge: record '{}' of {} is in two shards", it.key(), key);
        m["record_scores"][it.key()] = it.value();
      }
    out.push_back(m);
  }
  mark_unequal_memory(out);
  return out;
}

void check_task_shard_preds(const std::vector<std::string>& shard_dirs, const std::vector<json>& shard_rows) {
  KVLAB_CHECK(shard_dirs.size() == shard_rows.size(), "merge: {} shard folders but {} row sets", shard_dirs.size(),
              shard_rows.size());
  for (size_t s = 0; s < shard_dirs.size(); ++s) {
    const fs::path pred = fs::path(shard_dirs[s]) / "pred";
    std::set<std::string> expected;  // <branch>/<dataset>.jsonl
    for (const auto& row : shard_rows[s]) {
      const std::string rel = row.at("branch").get<std::string>() + "/" + row.at("dataset").get<std::string>() + ".jsonl";
      expected.insert(rel);
      const fs::path file = pred / rel;
      const json& scores = row.at("record_scores");
      if (scores.empty() && !fs::exists(file)) continue;  // a shard that got no records of this dataset
      KVLAB_CHECK(fs::is_regular_file(file), "merge: {} is missing; {}/result.json counts {} records of it",
                  file.string(), shard_dirs[s], scores.size());
      std::ifstream in(file);
      std::set<std::string> seen;
      int64_t n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        if (line.empty()) continue;
        json j;
        try {
          j = json::parse(line);
        } catch (const json::parse_error&) {
          KVLAB_FAIL("merge: {}: line {} is not JSON (cut by an interruption?); run that shard again to finish it",
                     file.string(), n);
        }
        KVLAB_CHECK(j.is_object() && j.contains("id") && j["id"].is_string(), "merge: {}: line {} has no string \"id\"",
                    file.string(), n);
        const std::string id = j["id"].get<std::string>();
        KVLAB_CHECK(seen.insert(id).second, "merge: {}: line {} repeats record '{}'", file.string(), n, id);
        KVLAB_CHECK(scores.contains(id), "merge: {}: line {} holds record '{}', which {}/result.json does not count",
                    file.string(), n, id, shard_dirs[s]);
      }
      for (auto it = scores.begin(); it != scores.end(); ++it)
        KVLAB_CHECK(seen.count(it.key()), "merge: {} lacks record '{}' ({} of the {} records {}/result.json counts)",
                    file.string(), it.key(), seen.size(), scores.size(), shard_dirs[s]);
    }
    if (!fs::is_directory(pred)) continue;
    for (const auto& e : fs::recursive_directory_iterator(pred))
      if (e.is_regular_file() && e.path().extension() == ".jsonl")
        KVLAB_CHECK(expected.count(fs::relative(e.path(), pred).generic_string()),
                    "merge: {} has no row in {}/result.json (a file from another run?)", e.path().string(), shard_dirs[s]);
  }
}

int merge_task_preds(const std::vector<std::string>& shard_dirs, const std::string& out_dir) {
  std::set<std::string> rel;  // <branch>/<dataset>.jsonl
  for (const auto& d : shard_dirs) {
    const fs::path pred = fs::path(d) / "pred";
    if (!fs::is_directory(pred)) continue;
    for (const auto& e : fs::recursive_directory_iterator(pred))
      if (e.is_regular_file() && e.path().extension() == ".jsonl")
        rel.insert(fs::relative(e.path(), pred).generic_string());
  }
  for (const auto& r : rel) {
    std::vector<std::vector<std::string>> lines(shard_dirs.size());
    for (size_t s = 0; s < shard_dirs.size(); ++s) {
      std::ifstream in(fs::path(shard_dirs[s]) / "pred" / r);
      for (std::string l; std::getline(in, l);)
        if (!l.empty()) lines[s].push_back(l);
    }
    const fs::path dst = fs::path(out_dir) / "pred" / r;
    fs::create_directories(dst.parent_path());
    std::ofstream out(dst, std::ios::trunc);
    for (size_t j = 0;; ++j) {
      bool any = false;
      for (const auto& l : lines)
        if (j < l.size()) out << l[j] << "\n", any = true;
      if (!any) break;
    }
    check_written(out, dst.string());
  }
  return int(rel.size());
}

void refresh_task_fidelity(const std::string& run_dir, json& rows) {
  for (auto& row : rows) {
    const std::string dataset = row.at("dataset").get<std::string>(), branch = row.at("branch").get<std::string>();
    const fs::path exact_file = fs::path(run_dir) / "pred" / "exact" / (dataset + ".jsonl");
    const fs::path file = fs::path(run_dir) / "pred" / branch / (dataset + ".jsonl");
    std::map<std::string, std::string> exact;
    for (const auto& l : read_json_lines(exact_file.string())) exact[l.at("id").get<std::string>()] = l.at("output").get<std::string>();
    auto lines = read_json_lines(file.string());
    double same = 0, rouge = 0;
    for (auto& l : lines) {
      auto it = exact.find(l.at("id").get<std::string>());
      KVLAB_CHECK(it != exact.end(), "{}: record '{}' has no full-cache output in {}", file.string(),
                  l.at("id").get<std::string>(), exact_file.string());
      const std::string out = l.at("output").get<std::string>();
      l["same_as_exact"] = out == it->second;
      l["rougeL_vs_exact"] = fidelity_rouge_l(it->second, out);
      same += out == it->second ? 1.0 : 0.0;
      rouge += l["rougeL_vs_exact"].get<double>();
    }
    std::ofstream f(file, std::ios::trunc);
    for (const auto& l : lines) f << l.dump() << "\n";
    check_written(f, file.string());
    const double n = std::max<double>(1.0, double(lines.size()));
    row["same_as_exact"] = same / n;
    row["rougeL_vs_exact"] = rouge / n;
  }
}

}  // namespace kvlab
