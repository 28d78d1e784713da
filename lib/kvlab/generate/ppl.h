// Perplexity through compressed caches streamed from the first token, and fidelity to the full
// cache (issue 10; BUZZ Table 3's protocol). The text is read token by token: each method's cache
// holds at most `cache_size` entries per KV head and layer between steps (its stream evicts after
// every token), and predicts the next token. The full cache reads the same text in chunks
// (ExactAttention) and is the reference: beside each method's perplexity, the mean
// KL(full ‖ method) of the next-token distributions and how often the two agree on the top-1 token
// (teacher-forced: both always see the true text).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/compress/method_spec.h"
#include "kvlab/model/model.h"

namespace kvlab {

struct PplBranch {
  MethodSpec method;
  int64_t cache_size = 0;  // entries per KV head and layer
  uint64_t seed = 0;
  // Held keys re-rotated to contiguous positions after every step (cache/rerotation.h), as
  // StreamingLLM's and BUZZ's code do; false = keys keep the positions they were cached at.
  bool rerotate = false;
  // > 0: the method compresses what it holds every N tokens to cache_size (compress/decoding_stream.h,
  // kvpress's DecodingPress) instead of streaming by its own rule; it then holds cache_size to
  // cache_size + N entries. Any method that keeps tokens, not only the streaming ones.
  int64_t compress_every = 0;
};

struct PplRow {
  std::string method;
  int64_t cache_size = 0;
  bool rerotate = false;
  int64_t compress_every = 0;
  int64_t n_predicted = 0;  // tokens 1 .. n-1
  double nll = 0;           // mean negative log-likelihood (nats)
  double ppl = 0;           // exp(nll)
  double kl = 0;            // mean KL(full ‖ method), nats
  double top1 = 0;          // fraction of positions whose argmax equals the full cache's
  int64_t kv_bytes_peak = 0;
  double seconds = 0;
};

struct PplResult {
  int64_t n_tokens = 0;
  PplRow full;               // the full cache (kl = 0, top1 = 1)
  std::vector<PplRow> rows;  // one per branch, in order
};

struct PplOptions {
  int64_t chunk = 256;  // the full cache's forward chunk
  // Every branch's token in one batch (forward_batch; issue 25); false: one branch after another.
  // The same rows up to float rounding (one GEMM over B rows instead of B matrix-vector products).
  bool batch = true;
  std::function<void(int64_t position, int64_t n_tokens)> progress;
};

// Every branch's method must stream while decoding (Compressor::start_stream), or compress every N
// tokens (PplBranch::compress_every), except `exact`
// (the full cache again, token by token). Every branch's caches are made before any token is read,
// so a method that does not stream or a cache size below a method's minimum (BUZZ: n_sink +
// window + 1) is one error before any work.
PplResult run_ppl(const Model& model, const std::vector<int64_t>& tokens, const std::vector<PplBranch>& branches,
                  const PplOptions& opt = {});
// The same checks alone (makes every branch's empty cache), for a command to run before it writes anything.
void check_ppl_branches(const Model& model, const std::vector<PplBranch>& branches);

}  // namespace kvlab
