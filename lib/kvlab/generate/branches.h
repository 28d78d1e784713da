// One prefill, many methods (issue 10). For a prompt the exact prefill is the same for every
// method and ratio and dominates CPU time: run it once, keep the exact cache, the last logits and
// each layer's last n_obs queries (the observation window), and branch: each (method, budget,
// seed) compresses every layer of that cache (cache/compressed_cache.h, the calls replay makes)
// and decodes greedily through its own CompressedAttention. The prefill is never modified.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "kvlab/cache/compressed_cache.h"
#include "kvlab/compress/method_spec.h"
#include "kvlab/generate/reconstruction.h"
#include "kvlab/model/model.h"

namespace kvlab {

struct Prefill {
  std::vector<int64_t> prompt;
  at::Tensor last_logits;          // [vocab] float32, the prediction after the prompt
  std::vector<at::Tensor> k, v;    // per layer [Hkv, n, d] post-RoPE, exact
  std::vector<at::Tensor> q_obs;   // per layer [Hq, n_obs, d] the last n_obs prompt queries
  // Per layer: > 0 for a sliding layer every branch holds as an exact window (window_layer:
  // gemma3's local layers), 0 for a layer the branch's method compresses.
  std::vector<int64_t> windows;
  double seconds = 0;
  // K + V of every layer as an exact cache holds them: a window layer only its last window - 1
  // positions (as transformers' sliding cache), every other layer all n.
  int64_t exact_kv_bytes() const;
  // Layer l's per-query-head attention sums over every prompt query ([Hq, n] float64,
  // compress/context.h inputs::attention_sums), computed on first use and then shared by every
  // branch of this prompt that scores with all its queries (h2o/cam with every query, buzz: each
  // recomputed them, ~85 s per branch at 8k tokens on one core). Needs q_obs to hold every prompt
  // query.
  const at::Tensor& attention_sums(int layer) const;
  // KVzip's repeat prompts for this prompt (generate/reconstruction.h), set by the command that
  // tokenized it; a branch whose method reconstructs the context (kvzip) needs them.
  ReconstructionPrompt reconstruction;
  // Where the question begins in `prompt` when it was prefilled with its context (the task commands
  // under --protocol whole: the record's context_len); -1 = not known. Methods read it as
  // compress/context.h inputs::question_start.
  int64_t question_start = -1;
  // [n_layers, Hkv, n] float32: every layer's context-reconstruction scores (NaN rows for window
  // layers), made by one more forward through `model` on first use and shared by every branch
  // asking for the same request; *seconds (if given) = the time that forward took.
  const at::Tensor& reconstruction_scores(const Model& model, const ReconstructionRequest& rq,
                                          double* seconds = nullptr) const;

 private:
  mutable std::vector<at::Tensor> sums_;  // the memo of attention_sums
  mutable std::map<ReconstructionRequest, std::pair<at::Tensor, double>> recon_;  // ... of reconstruction_scores
};

// What a layer's compressions while decoding (--decode-rule compress) may read beyond the held
// entries: the inputs that do not run over positions (W_o; RoPE frequencies for queries_at_newest).
Context decoding_inputs(const Model& model, int layer);

// One exact forward over `prompt`, keeping what every branch needs.
Prefill run_prefill(const Model& model, const std::vector<int64_t>& prompt, int64_t n_obs);

struct BranchSpec {
  MethodSpec method;
  Budget budget;
  uint64_t seed = 0;
  int64_t keep_first = 0;  // positions kept exact before the compressed region
  int64_t keep_last = 0;   // prompt positions kept exact after it
  bool stream = true;      // streaming methods keep compressing while decoding; false = --prefill-only
  // Equal memory counted whole (compressed_cache.h compress_layer): keep_first/keep_last inside the budget.
  bool count_whole = false;
  // Kept keys move to contiguous positions (cache/rerotation.h): a method that compresses once,
  // right after compression (kvpress's KeyRerotationPress); a streaming method, after every token
  // too (needs keep_first 0 and a stream that can move its keys: streaming_llm, local, h2o, buzz).
  // Merged entries cannot move: an error before decoding.
  bool rerotate = false;
  // --decode-rule compress (compress/decoding_stream.h): every method compresses what it holds
  // again every `decoding.every` decoded tokens, to its budget on the tokens seen; every > 0 turns
  // it on for every method but the full cache (its own streaming rule then gives way; `rerotate`
  // must be false).
  DecodingRule decoding{0};
};

struct BranchOptions {
  // Tokens fed through the compressed cache before the first answer token, at the positions after
  // the prefill (--protocol context: the question and the assistant prefix); the first answer token
  // then comes from the compressed cache. Empty = it comes from the prefill's last logits.
  std::vector<int64_t> suffix;
  int64_t max_new_tokens = 64;
  bool stop_at_eos = true;
  std::function<void(int64_t step, const at::Tensor& logits)> on_logits;  // logits [vocab] of each choice
  std::function<void(int64_t id)> on_token;
  std::function<bool(const std::vector<int64_t>& ids)> stop_when;  // after each token: stop here
  QkvTap* tap = nullptr;  // sees every decode step's q/k/v (tests drive the streams offline with them)
  std::function<void(const CompressedAttention&)> on_done;  // the cache as decoding left it
  bool keep_kept = false;  // fill BranchResult::kept
};

// What a compressed cache holds: {"layers": [{"layer", "kv_heads": [{"positions", "weights"}]}]}
// (CompressedLayer::kept), the --kept-out format.
nlohmann::json kept_json(const CompressedAttention& attn);

struct BranchResult {
  std::vector<int64_t> ids;     // generated tokens
  int64_t kv_bytes = 0;         // the compressed cache right after compression
  int64_t kv_bytes_end = 0;     // ... after the last decoded token
  int64_t kv_bytes_peak = 0;    // the most it held (CompressedAttention::peak_bytes)
  int64_t kv_bytes_window = 0;  // the part of kv_bytes in window layers (the same for every method)
  // Live entries per (layer, KV head) (CompressedAttention::live_entries): right after
  // compression, the mean over that moment and every step after it (the suffix, each decoded
  // token), and the peak (a step's new token included before a stream evicts).
  double entries_start = 0, entries_mean = 0, entries_peak = 0;
  double bytes_mean = 0;        // kv bytes, averaged as entries_mean
  nlohmann::json kept;          // BranchOptions::keep_kept: the cache as decoding left it (kept_json)
  double compress_ms = 0;       // every layer's compress() call
  // The second prefill that reconstructs the context (kvzip; 0 for other methods): its wall time,
  // counted for every branch that needs it (a method run alone would pay it), though made once.
  double reconstruction_seconds = 0;
  double decode_seconds = 0;     // run_branches: batched steps' wall time split among their branches
};

// Compresses every layer of `prefill` with the branch's method and decodes greedily.
BranchResult run_branch(const Model& model, const Prefill& prefill, const BranchSpec& spec, const BranchOptions& opt);

// Every branch of one prefill decoded in one batch (issue 25): at each step the live branches'
// tokens go through the dense parts of the forward as one [B, hidden] batch (forward_batch) and
// through attention each over its own compressed cache; a branch that stops (EOS, stop_when,
// max_new_tokens) leaves the batch. The suffix (the same for every batched branch) goes through
// whole, or token by token for streaming caches, as run_branch feeds it. The results are run_branch's
// for each (same ids; logits within float rounding of a GEMM over B rows instead of one), in order.
// decode_seconds: each batched forward's wall time split evenly among the branches in it. A branch
// with a tap, or a suffix unlike the first batched branch's, runs alone through run_branch.
std::vector<BranchResult> run_branches(const Model& model, const Prefill& prefill, const std::vector<BranchSpec>& specs,
                                       const std::vector<BranchOptions>& opts);

// Single-layer attention error inside an end-to-end run (issue 48: does replay's error predict the
// task score?). The tokens after a prefill (--protocol context: the question and the assistant
// prefix) go once through the full cache; each layer's post-RoPE queries, keys and values and the
// exact attention output are kept. A branch is then judged layer by layer as replay judges a
// capture: the same exact queries attend over the branch's compressed context, compressed once as
// its method compresses it, with the question's own keys and values appended exactly (causal), and
// the output is compared with the exact one. Errors do not compound across layers: each layer sees
// the exact model's inputs.
struct QuestionProbe {
  int64_t pos0 = 0;                 // the position of the first probed token (the prefill's length)
  std::vector<at::Tensor> q, k, v;  // per layer: [Hq, s, d], [Hkv, s, d], [Hkv, s, d] post-RoPE, exact
  std::vector<at::Tensor> z;        // per layer [Hq, s, d] the exact attention output
};
// `exact`: the run's full-cache branch (its compression keeps everything).
QuestionProbe probe_question(const Model& model, const Prefill& prefill, const std::vector<int64_t>& tokens,
                             const BranchSpec& exact);

// Per layer, ||z_branch - z_exact||_F / ||z_exact||_F over the probe's queries and query heads; NaN
// for a layer every branch holds as an exact window (gemma3's local layers). A streaming method is
// judged on its cache right after compression (as replay), a quantized one as it stores it; a
// branch that re-rotates its keys is refused (the question's positions would move with them).
std::vector<double> branch_layer_error(const Model& model, const Prefill& prefill, const BranchSpec& spec,
                                       const QuestionProbe& probe);

}  // namespace kvlab
