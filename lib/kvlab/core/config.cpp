#include "kvlab/core/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <sstream>

#include "kvlab/core/check.h"

namespace kvlab {

std::string FieldList::Field::flag() const {
  std::string f = key;
  std::replace(f.begin(), f.end(), '_', '-');
  return "--" + f;
}

namespace {

const char* type_name(const FieldList::Target& t) {
  return std::visit(Overloaded{[](int*) { return "an integer"; },
                               [](int64_t*) { return "an integer"; },
                               [](uint64_t*) { return "a non-negative integer"; },
                               [](double*) { return "a number"; },
                               [](bool*) { return "true or false"; },
                               [](std::string*) { return "a string"; },
                               [](std::vector<std::string>*) { return "a list of strings"; },
                               [](std::vector<double>*) { return "a list of numbers"; },
                               [](std::vector<int64_t>*) { return "a list of integers"; },
                               [](nlohmann::json*) { return "a JSON value"; }},
                    t);
}

}  // namespace

nlohmann::json FieldList::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : fields_) std::visit([&](auto* p) { j[f.key] = *p; }, f.target);
  return j;
}

void FieldList::from_json(const nlohmann::json& j, const std::string& source,
                          bool skip_given_on_cli) {
  KVLAB_CHECK(j.is_object(), "{}: expected a JSON object at the top level, found {}", source,
              j.type_name());
  std::vector<std::string> keys;
  for (const auto& f : fields_) keys.push_back(f.key);
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto pos = std::find(keys.begin(), keys.end(), it.key());
    if (pos == keys.end()) {
      std::string hint = closest_match(it.key(), keys);
      KVLAB_FAIL("{}: unknown key '{}'{}", source, it.key(),
                 hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint));
    }
    size_t i = static_cast<size_t>(pos - keys.begin());
    if (skip_given_on_cli && i < given_on_cli_.size() && given_on_cli_[i]) continue;
    const auto& f = fields_[i];
    try {
      std::visit(
          Overloaded{
              [&](double* p) {
                KVLAB_CHECK(it->is_number(), "x");
                *p = it->get<double>();
              },
              [&](bool* p) {
                KVLAB_CHECK(it->is_boolean(), "x");
                *p = it->get<bool>();
              },
              [&](std::string* p) {
                KVLAB_CHECK(it->is_string(), "x");
                *p = it->get<std::string>();
              },
              [&](nlohmann::json* p) { *p = *it; },
              [&](auto* p) {
                using T = std::remove_pointer_t<decltype(p)>;
                if constexpr (std::is_integral_v<T>) {
                  KVLAB_CHECK(it->is_number_integer() || it->is_number_unsigned(), "x");
                }
                *p = it->get<T>();
              }},
          f.target);
    } catch (const std::exception&) {
      KVLAB_FAIL("{}: key '{}' must be {}, found {}", source, f.key, type_name(f.target),
                 it->dump());
    }
    if (!f.allowed.empty()) {
      const auto* s = std::get_if<std::string*>(&f.target);
      if (s) {
        bool ok = std::find(f.allowed.begin(), f.allowed.end(), **s) != f.allowed.end();
        KVLAB_CHECK(ok, "{}: key '{}' must be one of {}, found '{}'", source, f.key,
                    fmt::join(f.allowed, ", "), **s);
      }
    }
  }
}

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  KVLAB_CHECK(std::filesystem::is_regular_file(path, ec), "{} {}: not a readable file", flag, path);
  std::ifstream f(path, std::ios::binary);
  KVLAB_CHECK(f.good(), "{} {}: cannot open", flag, path);
  std::stringstream ss;
  ss << f.rdbuf();
  KVLAB_CHECK(!f.bad(), "{} {}: read failed", flag, path);
  return ss.str();
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  KVLAB_CHECK(in.good(), "cannot open JSON file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  // A key given twice in one object would silently keep the last value: refuse it. A value nested
  // deeper than kMaxJsonDepth is refused as it opens (issue 50: 100,000 nested arrays in a --config
  // overflowed the stack; 50,000 gave a 100 KB error line).
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto check_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
      KVLAB_FAIL("{}: nested deeper than {} levels of arrays and objects (kvlab's JSON files need a few)", path,
                 kMaxJsonDepth);
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == E::key && !open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str(), check_keys);
  } catch (const nlohmann::json::parse_error& e) {
    KVLAB_FAIL("{}: invalid JSON at byte {}: {}", path, e.byte, e.what());
  }
  KVLAB_CHECK(duplicate.empty(), "{}: key '{}' is given twice in one object", path, duplicate);
  return j;
}

namespace {

template <class T>
void check_each_once(const std::string& flag, const std::vector<T>& values, const char* spec) {
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      KVLAB_CHECK(!(values[i] == values[j]), "{}: {} is listed twice (each value is one run: give it once)", flag,
                  fmt::format(fmt::runtime(spec), values[i]));
}

}  // namespace

void check_listed_once(const std::string& flag, const std::vector<double>& values) {
  check_each_once(flag, values, "{:g}");
}
void check_listed_once(const std::string& flag, const std::vector<int64_t>& values) {
  check_each_once(flag, values, "{}");
}
void check_listed_once(const std::string& flag, const std::vector<std::string>& values) {
  check_each_once(flag, values, "'{}'");
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  auto dist = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = dist(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace kvlab
