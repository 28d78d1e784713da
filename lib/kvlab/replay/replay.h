// The replay protocol (METHODS.md §4, issue 4): for one (sample, layer) of a capture, compress the
// cache of the prefix every captured query may see, attend with the compressed cache, and measure
// the §2 metrics against exact attention.
//
// Regions of one sample's n tokens, for captured queries at positions [n - n_q, n):
//   [0, keep_first)                 exact (sinks; bias 0)
//   [keep_first, n - tail)          the compressible region, compressed once for all queries
//   [n - tail, n)                   exact, causal, with tail = max(keep_last, n_q)
// Every query sits in the exact tail, so each sees the whole compressed region plus the exact
// tail up to its own position: the shared prefix is compressed once, the per-query part is exact.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/attention/metrics.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/io/capture.h"

namespace kvlab {

struct MethodSpec {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  std::shared_ptr<const Compressor> compressor;  // built from name + params
};

struct ReplayProtocol {
  int64_t keep_first = 0;
  int64_t keep_last = 0;
  std::string queries = "all";  // "all" or "last:N" of the captured queries
  std::vector<int> kv_heads;    // empty = all
  std::string device = "cpu";
};

// One (sample, layer) of a capture, loaded and with its exact reference computed once.
struct ReplayUnit {
  int64_t sample = 0;
  int layer = 0;
  int n_layers = 1;
  at::Tensor q, k, v;          // [Hq, n_q, d], [Hkv, n, d] float32 on the device
  std::vector<int> kv_heads;   // original KV head index of each row of k / v
  ExactReference ref;          // double
  at::Tensor probs;            // [Hq, n_q, n] exact probabilities (float32), for mass_recall
};

ReplayUnit load_unit(const CaptureReader& cap, int64_t sample, int layer, const ReplayProtocol& p);

// Compress + attend + measure for every KV head of the unit: one row per KV head.
// Row keys: sample, sample_id, layer, head, method, params, ratio|budget|T, seed, n_tokens,
// region_tokens, budget_entries, kept_entries, kept_fraction, rel_err, bound_ratio_F,
// bound_ratio_op, cosine, rel_err_clamped, mass_recall (selection methods), compress_ms.
nlohmann::json replay_rows(const ReplayUnit& u, const std::string& sample_id, const MethodSpec& m,
                           const Budget& b, uint64_t seed, const ReplayProtocol& p);

// The approximate output for the unit (exposed for tests): z [Hq, n_q, d] and the compressed region.
struct ReplayOutput {
  at::Tensor z;
  CompressedKV region;
  int64_t region_begin = 0, region_end = 0;
  double compress_ms = 0;
};
ReplayOutput replay_attend(const ReplayUnit& u, const Compressor& c, const Budget& b, uint64_t seed,
                           const ReplayProtocol& p);

// Metric columns of a replay row, for aggregation and tables.
const std::vector<std::string>& replay_metric_names();

}  // namespace kvlab
