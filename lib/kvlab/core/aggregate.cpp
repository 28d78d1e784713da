#include "kvlab/core/aggregate.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace kvlab {

nlohmann::json aggregate_over_seeds(const nlohmann::json& rows, const std::vector<std::string>& group_keys,
                                    const std::vector<std::string>& metrics, const std::string& seed_key) {
  struct Acc {
    nlohmann::json key;
    // seed -> metric -> (sum, count)
    std::map<std::string, std::map<std::string, std::pair<double, int64_t>>> per_seed;
    int64_t n_rows = 0;
  };
  std::vector<Acc> groups;
  std::map<std::string, size_t> index;
  for (const auto& r : rows) {
    nlohmann::json key = nlohmann::json::object();
    for (const auto& k : group_keys) key[k] = r.contains(k) ? r[k] : nlohmann::json();
    std::string ks = key.dump();
    auto it = index.find(ks);
    if (it == index.end()) {
      it = index.emplace(ks, groups.size()).first;
      groups.push_back(Acc{key, {}, 0});
    }
    auto& g = groups[it->second];
    ++g.n_rows;
    std::string seed = r.contains(seed_key) ? r[seed_key].dump() : "null";
    for (const auto& m : metrics) {
      if (!r.contains(m) || !r[m].is_number()) continue;
      auto& [sum, cnt] = g.per_seed[seed][m];
      sum += r[m].get<double>();
      ++cnt;
    }
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json o = g.key;
    o["n_seeds"] = g.per_seed.size();
    o["n_rows"] = g.n_rows;
    for (const auto& m : metrics) {
      std::vector<double> means;
      for (const auto& [seed, ms] : g.per_seed) {
        auto it = ms.find(m);
        if (it != ms.end() && it->second.second > 0) means.push_back(it->second.first / it->second.second);
      }
      if (means.empty()) continue;
      double mean = 0;
      for (double v : means) mean += v;
      mean /= static_cast<double>(means.size());
      double var = 0;
      for (double v : means) var += (v - mean) * (v - mean);
      double sd = means.size() > 1 ? std::sqrt(var / static_cast<double>(means.size() - 1)) : 0.0;
      o[m] = mean;
      o[m + "_std"] = sd;
    }
    out.push_back(o);
  }
  return out;
}

void mark_off_median(nlohmann::json& rows, const std::string& key,
                     const std::function<std::string(const nlohmann::json&)>& group,
                     const std::function<bool(const nlohmann::json&)>& eligible) {
  auto counts = [&](const nlohmann::json& r) { return eligible(r) && r.contains(key) && r[key].is_number(); };
  std::map<std::string, std::vector<double>> peers;
  for (const auto& r : rows)
    if (counts(r)) peers[group(r)].push_back(r[key].get<double>());
  for (auto& [g, v] : peers) std::sort(v.begin(), v.end());
  for (auto& r : rows) {
    if (!counts(r)) continue;
    const auto& v = peers[group(r)];
    const double median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    r["mem"] = std::abs(r[key].get<double>() - median) > kEqualMemoryTolerance * median ? "*" : "";
  }
}

}  // namespace kvlab
