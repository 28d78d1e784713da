// The method registry: an explicit table, one line per method (no self-registering statics:
// a static library would drop their object files).
#include <functional>

#include "kvlab/check.h"
#include "kvlab/compress/methods.h"
#include "kvlab/config.h"

namespace kvlab {
namespace {

struct Entry {
  const char* name;
  const char* description;
  std::function<std::unique_ptr<Compressor>(const nlohmann::json&)> make;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {"exact", "full cache, no compression (the reference)", make_exact},
      {"uniform", "uniformly random subset per KV head, bias log(1/ratio)", make_uniform},
      {"uniform-halving", "T random halvings (BalanceKV's baseline), bias T log 2", make_uniform_halving},
      {"streaming_llm", "n_sink attention sinks + the most recent tokens (StreamingLLM)", make_streaming_llm},
      {"local", "the most recent tokens only (sliding window)", make_local},
      {"h2o", "recent window + heavy hitters by accumulated attention (H2O)", make_h2o},
      {"snapkv", "observation-window attention, max-pooled, top-k + window (SnapKV)", make_snapkv},
      {"pyramidkv", "SnapKV with budgets shrinking from bottom to top layer (PyramidKV)", make_pyramidkv},
      {"cam", "StreamingLLM eviction, evicted values merged into the next tokens (CaM)", make_cam},
      {"buzz", "sink + interval-sampled old + local-max hives of new tokens + window (BUZZ)", make_buzz},
      {"buzz-interval", "BUZZ with interval sampling for new tokens too (Fig. 8b ablation)", make_buzz_interval},
      {"buzz-logn", "BUZZ with logits scaled by log_512(n) (BUZZ §3.5)", make_buzz_logn},
      {"chelsea", "chunked soft matching: merge similar keys into degree-weighted centroids (Chelsea)", make_chelsea},
      {"balancekv", "T discrepancy halvings by a self-balancing walk, bias log w (BalanceKV, practical)", make_balancekv},
      {"balancekv-mr", "BalanceKV's streaming MergeAndReduce + value-norm buckets, num/den sets (Alg. 1-3)", make_balancekv_mr},
      {"subgen", "online key clusters + l2 value samples, separate num/den sets (SubGen Alg. 1)", make_subgen},
      {"clustergen", "recent window + greedy k-center centres, bias log(cluster size) (ClusterGen)", make_clustergen},
  };
  return t;
}

}  // namespace

std::unique_ptr<Compressor> make_compressor(const std::string& name, const nlohmann::json& params) {
  for (const auto& e : table())
    if (name == e.name) return e.make(params);
  auto names = compressor_names();
  std::string hint = closest_match(name, names);
  KVLAB_FAIL("Unknown compressor '{}'.{} Available: {}", name,
             hint.empty() ? "" : fmt::format(" Did you mean: {}?", hint), fmt::join(names, ", "));
}

std::vector<CompressorInfo> compressor_infos() {
  std::vector<CompressorInfo> out;
  for (const auto& e : table()) out.push_back({e.name, e.description});
  return out;
}

std::vector<std::string> compressor_names() {
  std::vector<std::string> out;
  for (const auto& e : table()) out.push_back(e.name);
  return out;
}

}  // namespace kvlab
