#include "kvlab/compress/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvlab/core/check.h"

namespace kvlab {

Budget Budget::of_ratio(double ratio) {
  KVLAB_CHECK(ratio > 0 && ratio <= 1, "--ratio must be in (0, 1], got {}", ratio);
  Budget b;
  b.kind = Kind::ratio;
  b.ratio = ratio;
  return b;
}

Budget Budget::of_entries(int64_t entries) {
  KVLAB_CHECK(entries >= 1, "--budget must be >= 1 entries, got {}", entries);
  Budget b;
  b.kind = Kind::entries;
  b.entries = entries;
  return b;
}

Budget Budget::of_halvings(int64_t halvings) {
  KVLAB_CHECK(halvings >= 0 && halvings <= kMaxHalvings, "--T (halvings) must be in [0, {}], got {}",
              kMaxHalvings, halvings);
  Budget b;
  b.kind = Kind::halvings;
  b.halvings = static_cast<int>(halvings);
  return b;
}

Budget Budget::of_bytes(double fraction) {
  KVLAB_CHECK(fraction > 0 && fraction <= 1, "--bytes must be in (0, 1] (a fraction of the full-precision cache's "
              "bytes), got {}", fraction);
  Budget b;
  b.kind = Kind::bytes;
  b.bytes = fraction;
  return b;
}

int64_t Budget::entries_for(int64_t n) const {
  int64_t e = 0;
  switch (kind) {
    case Kind::ratio: e = std::llround(ratio * static_cast<double>(n)); break;
    case Kind::entries: e = entries; break;
    case Kind::halvings: e = n >> halvings; break;
    case Kind::bytes: e = static_cast<int64_t>(std::floor(bytes * static_cast<double>(n) * (1 + 1e-12))); break;
    case Kind::unset: KVLAB_FAIL("compress: no budget was given (a ratio, a number of entries or T halvings)");
  }
  return std::min<int64_t>(n, std::max<int64_t>(n > 0 ? 1 : 0, e));
}

std::string Budget::label() const {
  switch (kind) {
    case Kind::ratio: return fmt::format("ratio={}", ratio);
    case Kind::entries: return fmt::format("budget={}", entries);
    case Kind::halvings: return fmt::format("T={}", halvings);
    case Kind::bytes: return fmt::format("bytes={}", bytes);
    case Kind::unset: break;
  }
  return "unset";
}

nlohmann::json Budget::to_json() const {
  switch (kind) {
    case Kind::ratio: return {{"ratio", ratio}};
    case Kind::entries: return {{"budget", entries}};
    case Kind::halvings: return {{"T", halvings}};
    case Kind::bytes: return {{"bytes", bytes}};
    case Kind::unset: break;
  }
  return nlohmann::json::object();
}

}  // namespace kvlab
