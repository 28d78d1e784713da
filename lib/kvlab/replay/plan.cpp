#include "kvlab/replay/plan.h"

#include <algorithm>

#include "kvlab/core/check.h"
#include "kvlab/core/text.h"

namespace kvlab {

const std::vector<uint64_t>& paper_seeds() {
  static const std::vector<uint64_t> s = {42, 7, 8, 17, 98, 64, 27, 32, 81, 44};
  return s;
}

std::vector<uint64_t> seed_values(int64_t n, const std::vector<int64_t>& explicit_list) {
  if (!explicit_list.empty()) {
    std::vector<uint64_t> out;
    for (int64_t s : explicit_list) {
      KVLAB_CHECK(s >= 0, "--seed-list: seeds must be >= 0, got {}", s);
      out.push_back(uint64_t(s));
    }
    return out;
  }
  KVLAB_CHECK(n >= 1 && n <= 10000, "--seeds must be in [1, 10000], got {}", n);
  std::vector<uint64_t> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(i < int64_t(paper_seeds().size()) ? paper_seeds()[size_t(i)] : uint64_t(1000 + i));
  return out;
}

std::pair<int, int> parse_shard(const std::string& spec) {
  auto parts = split(spec, '/');
  int i = -1, n = 0;
  try {
    if (parts.size() == 2) i = std::stoi(parts[0]), n = std::stoi(parts[1]);
  } catch (const std::exception&) {
  }
  KVLAB_CHECK(parts.size() == 2 && n >= 1 && i >= 0 && i < n, "--shard: expected i/N with 0 <= i < N, got '{}'", spec);
  return {i, n};
}

std::vector<int> select_layers(const CaptureMeta& meta, const std::string& spec) {
  if (spec == "all") return meta.layers;
  auto wanted = parse_index_list(spec, meta.n_layers, "--layers");
  for (int l : wanted) {
    bool captured = std::find(meta.layers.begin(), meta.layers.end(), l) != meta.layers.end();
    KVLAB_CHECK(captured, "--layers: layer {} was not captured (captured: {})", l, fmt::join(meta.layers, ","));
  }
  return wanted;
}

}  // namespace kvlab
