#include "kvlab/core/text.h"

#include <algorithm>

#include "kvlab/core/check.h"

namespace kvlab {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::optional<int64_t> parse_int64(const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (s.empty() || used != s.size()) return std::nullopt;
  return v;
}

std::vector<int64_t> parse_id_list(const std::string& s, const std::string& flag) {
  std::vector<int64_t> ids;
  for (const auto& item : split(s, ',')) {
    const std::optional<int64_t> v = parse_int64(item);
    KVLAB_CHECK(v && *v >= 0, "{} '{}': expected comma-separated non-negative integers, bad item '{}'", flag, s, item);
    ids.push_back(*v);
  }
  return ids;
}

namespace {
int parse_int(const std::string& s, const std::string& flag, const std::string& spec) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVLAB_CHECK(!s.empty() && used == s.size(), "{}: expected 'all' or a list like 0,1,4 or 0-3, got '{}'",
              flag, spec);
  return v;
}
}  // namespace

std::vector<int> parse_index_list(const std::string& spec, int n, const std::string& flag) {
  std::vector<int> out;
  if (spec == "all") {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (const auto& part : split(spec, ',')) {
    auto dash = part.find('-', 1);
    int lo, hi;
    if (dash != std::string::npos) {
      lo = parse_int(part.substr(0, dash), flag, spec);
      hi = parse_int(part.substr(dash + 1), flag, spec);
    } else {
      lo = hi = parse_int(part, flag, spec);
    }
    KVLAB_CHECK(lo <= hi, "{}: range '{}' is empty", flag, part);
    for (int i = lo; i <= hi; ++i) {
      KVLAB_CHECK(i >= 0 && i < n, "{}: index {} out of range: expected 0..{}", flag, i, n - 1);
      out.push_back(i);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void check_queries_spec(const std::string& spec, const std::string& flag) {
  if (spec == "all") return;
  KVLAB_CHECK(spec.rfind("last:", 0) == 0, "{}: expected 'all' or 'last:N', got '{}'", flag, spec);
  const std::optional<int64_t> v = parse_int64(spec.substr(5));
  KVLAB_CHECK(v && *v > 0, "{}: expected 'all' or 'last:N' with N > 0, got '{}'", flag, spec);
}

int64_t parse_queries_spec(const std::string& spec, int64_t n, const std::string& flag) {
  check_queries_spec(spec, flag);
  if (spec == "all") return n;
  return std::min<int64_t>(n, std::stoll(spec.substr(5)));
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t i = 0;
  for (size_t p; (p = s.find(from, i)) != std::string_view::npos; i = p + from.size()) {
    out.append(s.substr(i, p - i));
    out.append(to);
  }
  out.append(s.substr(i));
  return out;
}

}  // namespace kvlab
