// The replay protocol (docs/methods.md §4): for one (sample, layer) of a capture, compress the cache of
// the prefix every evaluation query may see, attend with the compressed cache, and measure the §2
// metrics against exact attention.
//
// The judge is not the witness. A sample's captured queries sit at its last positions; they are
// split into two windows, every observation position before every evaluation position:
//   evaluation  [n - n_eval, n)                  --eval-queries last:N: the queries the metrics use
//   observation [n - n_eval - n_obs, n - n_eval) --obs-queries N: the only queries a method may score
//                                                keys with (h2o, snapkv, pyramidkv, cam, buzz), as in
//                                                the papers, where prompt queries select and later
//                                                tokens judge
// (`kvlab dump --queries last:512` captures both windows for the defaults 256 + 256.)
//
// Regions of one sample's n tokens:
//   [0, keep_first)                 exact (sinks; bias 0)
//   [keep_first, n - tail)          the compressible region, compressed once for all queries
//   [n - tail, n)                   exact, causal, with tail = max(keep_last, n_eval)
// Every evaluation query sits in the exact tail, so each sees the whole compressed region plus the
// exact tail up to its own position: the shared prefix is compressed once, the per-query part is
// exact. A method's scores are each observation query's attention probabilities over everything
// it sees (sinks + region + tail up to its position), restricted to the region.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/attention/metrics.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/method_spec.h"
#include "kvlab/io/capture.h"

namespace kvlab {

struct ReplayProtocol {
  int64_t keep_first = 0;
  int64_t keep_last = 0;
  std::string eval_queries = "last:256";  // evaluation window: "all" | "last:N" of the captured queries
  int64_t obs_queries = 256;              // observation window: the N captured queries just before it
  std::vector<int> kv_heads;              // empty = all
  std::string device = "cpu";
  // --rerotate (docs/methods.md §1; StreamingLLM's and BUZZ's code): kept keys are re-rotated to their
  // in-cache positions (sinks, then the kept region entries in order, then the tail), the
  // evaluation queries moved with the tail. Selection methods only (a merged key has no position).
  bool rerotate = false;
};

// The two windows for a sample with `n_captured` captured queries; an error naming --eval-queries
// and --obs-queries when they need more queries than were captured (`where` names the sample).
struct QueryWindows {
  int64_t n_eval = 0, n_obs = 0;
};
QueryWindows split_queries(int64_t n_captured, const ReplayProtocol& p, const std::string& where);

// One (sample, layer) of a capture, loaded and with its exact reference computed once.
struct ReplayUnit {
  int64_t sample = 0;
  int layer = 0;
  int n_layers = 1;
  at::Tensor q;                // [Hq, n_eval, d] evaluation queries, positions [n - n_eval, n)
  at::Tensor q_obs;            // [Hq, n_obs, d] observation queries, positions [n - n_eval - n_obs,
                               //   n - n_eval); n_obs may be 0
  at::Tensor k, v;             // [Hkv, n, d] float32 on the device
  std::vector<int> kv_heads;   // original KV head index of each row of k / v
  at::Tensor inv_freq;         // [head_dim / 2] RoPE frequencies of the capture's model (--rerotate)
  ExactReference ref;          // double
  at::Tensor probs;            // [Hq, n_q, n] exact probabilities (float32), for mass_recall
};

ReplayUnit load_unit(const CaptureReader& cap, int64_t sample, int layer, const ReplayProtocol& p);
// [head_dim / 2] the RoPE frequencies the capture's keys and queries were rotated with (its
// rope_theta and rope_scaling): --rerotate, expected_attention and compactor use them.
at::Tensor capture_inv_freq(const CaptureReader& cap);
// The same from that unit as already read (cap.read_layer(sample, layer)), e.g. after checking it
// with find_nonfinite.
ReplayUnit load_unit(const CaptureReader& cap, int64_t sample, int layer, const ReplayProtocol& p,
                     const LayerQKV& qkv);
// The same from tensors: q_all [Hq, n_captured, d] the queries of the last n_captured positions,
// k, v [Hkv, n, d]; split into the two windows, moved to p.device, exact reference computed.
ReplayUnit make_unit(const at::Tensor& q_all, const at::Tensor& k, const at::Tensor& v,
                     const ReplayProtocol& p, const std::string& where = "replay");

// Compress + attend + measure for every KV head of the unit: one row per KV head.
// Row keys: sample, sample_id, layer, head, method, params, ratio|budget|T, seed, n_tokens, n_q
// (evaluation queries), n_obs, eval_queries and obs_queries ([begin, end) positions),
// region_tokens, kept_entries, kept_fraction, rel_err, bound_ratio_F,
// bound_ratio_op, cosine, rel_err_clamped, mass_recall (selection methods), compress_ms, kv_bytes (K and V
// stored per KV head); with a quantizer (m.quant) method is its label ("snapkv+kivi2") and kv_quant its name.
// `kept` (optional): what the layer's cache held, per KV head (--kept-out; replay_kept).
nlohmann::json replay_rows(const ReplayUnit& u, const std::string& sample_id, const MethodSpec& m,
                           const Budget& b, uint64_t seed, const ReplayProtocol& p, nlohmann::json* kept = nullptr);

// The approximate output for the unit (exposed for tests): z [Hq, n_eval, d] and the compressed region.
struct ReplayOutput {
  at::Tensor z;
  CompressedKV region;
  int64_t region_begin = 0, region_end = 0;
  double compress_ms = 0;
  int64_t kv_bytes = 0;  // K and V the layer's cache stores (quantized entries as their quantizer counts them)
};
// A bytes budget (--bytes) is of the whole layer: see entries_for_bytes (quant/quantized_part.h).
// `quant` (optional): what the layer keeps is then stored quantized as a cache holds it right after
// compression (its newest entries, the evaluation queries' own, in full precision as the
// quantizer's window says) before the evaluation queries attend.
ReplayOutput replay_attend(const ReplayUnit& u, const Compressor& c, const Budget& b, uint64_t seed,
                           const ReplayProtocol& p, const KvQuantizer* quant = nullptr);

// What a layer of n tokens held after compression, per KV head: [{"positions": [...], "weights":
// [...]}], the exact sinks and tail (weight 1) around the region's live entries (a merged entry's
// position is -1, its weight e^bias: the tokens it stands for); the --kept-out format of generate.
nlohmann::json replay_kept(const ReplayOutput& out, int64_t n);

// Metric columns of a replay row, for aggregation and tables.
const std::vector<std::string>& replay_metric_names();

}  // namespace kvlab
