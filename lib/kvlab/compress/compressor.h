// The one interface every KV-cache compressor implements (docs/methods.md §1).
//
// A compressor sees one layer's compressible region (all KV heads) and returns, per KV head,
// kept or merged entries with an additive log-weight bias. Replay calls `compress` once per
// (sample, layer). Streaming methods are built on a state object that `compress` drives over the
// region (H2OCache in h2o.h, CaMCache in cam.h, BuzzCache in buzz.h, ChelseaCache in chelsea.h,
// SubGenState in subgen.h), so token-by-token generation can reuse the same code.
//
// Vocabulary: `ratio` is the fraction of the region kept (entries after / tokens before);
// `budget` is the same as an absolute count of entries per KV head.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kvlab/attention/attention.h"
#include "kvlab/compress/budget.h"
#include "kvlab/compress/context.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/stream.h"

namespace kvlab {

// One layer's compressible region. Keys are post-RoPE at their original positions.
struct LayerKV {
  at::Tensor keys;       // [n_kv_heads, n, head_dim]
  at::Tensor values;     // [n_kv_heads, n, head_dim]
  at::Tensor queries;    // [n_q_heads, n_obs, head_dim] queries a method may score with; n_obs may be 0
  at::Tensor query_pos;  // [n_obs] int64 absolute positions of `queries`
  int64_t pos0 = 0;      // absolute position of keys[:, 0]; key i sits at pos0 + i
  // The rest of the cache the queries see, kept exact outside the region: scores are attention
  // probabilities over everything a query can see (prefix + region + suffix up to its position),
  // restricted to the region afterwards. Undefined = nothing outside the region.
  at::Tensor prefix_keys;  // [n_kv_heads, pos0, head_dim] at positions 0 .. pos0-1 (the sinks)
  at::Tensor suffix_keys;  // [n_kv_heads, m, head_dim] at positions pos0+n .. pos0+n+m-1
  int layer = 0;         // 0-based layer index (PyramidKV's per-layer budgets)
  int n_layers = 1;
  // What the method may read beyond the region (context.h: attention sums, RoPE frequencies, W_o,
  // reconstruction scores, ...), each made on first use; its registry entry says which it reads.
  Context context;

  int64_t n_tokens() const { return keys.size(1); }
  int64_t n_kv_heads() const { return keys.size(0); }
  int64_t n_q_heads() const { return queries.defined() ? queries.size(0) : n_kv_heads(); }
  int64_t n_prefix() const { return prefix_keys.defined() ? prefix_keys.size(1) : 0; }
  int64_t n_suffix() const { return suffix_keys.defined() ? suffix_keys.size(1) : 0; }
  // The prompt's tokens: the positions before the region, the region and the suffix.
  int64_t n_prompt() const { return pos0 + n_tokens() + n_suffix(); }
};

// Every key the queries can see, in position order: prefix, region, suffix (in the region's dtype).
at::Tensor visible_keys(const LayerKV& kv);  // -> [Hkv, n_prefix + n + n_suffix, d]

// What a compressor returns. Heads may keep different counts: pad with bias = -inf.
struct CompressedKV {
  at::Tensor keys;      // [n_kv_heads, n_kept, head_dim]
  at::Tensor values;    // [n_kv_heads, n_kept, head_dim]
  at::Tensor bias;      // [n_kv_heads, n_kept] log-weights (0 for exact entries, -inf = padding)
  at::Tensor kept_idx;  // [n_kv_heads, n_kept] int64 index into the region, -1 for merged/padding;
                        // undefined when the method merges (no 1:1 correspondence)
  // Separate denominator set (SubGen, BalanceKV theory version); undefined = same as numerator.
  at::Tensor den_keys;  // [n_kv_heads, n_den, head_dim]
  at::Tensor den_bias;  // [n_kv_heads, n_den]
  // Multiplies every logit q·k/√d of the whole cache (BUZZ log n scaling, Eq. 7–8); 1 = none.
  double logit_scale = 1.0;
  // Key channels zeroed in every returned key (ThinK's key-channel pruning): [n_kv_heads, head_dim]
  // bool, true = pruned; undefined = none. Such keys are stored narrower: head_dim - p channels
  // each, plus a head_dim-bit mask per head.
  at::Tensor pruned_channels;

  bool has_separate_den() const { return den_keys.defined(); }
  // Entries per KV head that are not padding, averaged over heads (numerator set).
  double mean_entries() const;
  // Entries of memory per head: numerator entries plus separate denominator entries.
  double mean_memory_entries() const;
  // The bytes the narrower keys save over the whole numerator set (pruned_channels): per KV head its
  // live entries (bias > -inf) times its pruned channels times the key's element size, less the
  // masks; 0 without pruning.
  int64_t key_bytes_saved() const;
};

// What a method needs from a second forward of its context after the prefill. kvzip: the model
// repeats the context chunk by chunk after a repeat prompt (chunk_size context tokens per forward,
// the first n_sink positions in its softmax); kvcompose (repeat_context): the context fed again, whole,
// right after itself. Nothing (the default): no second forward.
struct ReconstructionRequest {
  int64_t chunk_size = 0;
  int64_t n_sink = 0;
  // The scores of each entry per KV head: the most attention a query of the second forward gives it,
  // reduced over the KV group's query heads by max (kvzip: the max over heads and queries together)
  // or, with repeat_context, by mean (KVCompose: per query head the max over queries, then the mean).
  bool repeat_context = false;
  bool any() const { return chunk_size > 0 || repeat_context; }
  bool operator<(const ReconstructionRequest& o) const {
    return std::tie(repeat_context, chunk_size, n_sink) < std::tie(o.repeat_context, o.chunk_size, o.n_sink);
  }
};

// How much to keep (budget.h: a ratio, an entry count or T halvings, resolved on the region by
// Budget::entries_for) and the seed of any randomness.
struct CompressOptions {
  Budget budget;
  uint64_t seed = 0;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual std::string name() const = 0;
  // Every parameter with its effective value, echoed into result.json.
  virtual nlohmann::json params() const = 0;
  // Pure: same input, options and seed -> bitwise-identical output on CPU. No hidden state.
  virtual CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const = 0;
  // How many of the prompt's last queries the method scores keys with (its observation window):
  // 0 = none, k > 0 = the last k, -1 = every prompt query. Generation and the task commands keep at
  // least that many (check_observation_queries); a method never silently gets fewer.
  virtual int64_t observation_queries() const { return 0; }
  // Methods that keep, per KV head, the top-scoring region positions (knorm, keydiff, lagkv,
  // snapkv, expected_attention, compactor): those scores, [n_kv_heads, n] float64 on CPU, higher =
  // keep, +inf = always kept (SnapKV's window). Undefined for every other method. adakv.cpp ranks
  // them across heads. `opt` as for compress (compactor's blend and sketch depend on the budget and seed).
  virtual at::Tensor keep_scores(const LayerKV& /*kv*/, const CompressOptions& /*opt*/) const { return at::Tensor(); }
  // Methods scoring by a second forward of the context (kvzip, kvcompose): what the context input
  // reconstruction_scores must be made with. Generation and the task commands run it once per
  // prompt for every such branch.
  virtual ReconstructionRequest reconstruction() const { return {}; }
  // Streaming methods (CompressorInfo::streaming): compresses the region as `compress` does and
  // returns the state that keeps compressing the tokens decoded after it (stream.h), holding the
  // budget against the tokens seen. kv may be empty (n = 0: a cache streamed from the first
  // token). nullptr: the method compresses once, after prefill, and decoded tokens stay exact.
  virtual std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const {
    (void)kv, (void)opt;
    return nullptr;
  }
};

// Checks that `obs_queries` (the flag --obs-queries: the last prompt queries kept per layer, -1 =
// every one) covers what every method scores with; the error names the method's parameter and the
// flag. Returns the number of queries the prefill must keep: obs_queries, or -1 when a method
// wants every prompt query (H2O's h2o_queries=all).
int64_t check_observation_queries(const std::vector<const Compressor*>& methods, int64_t obs_queries);

// The entry count a call asks for on a region of n tokens (opt.budget.entries_for(n)).
int64_t resolve_budget(const CompressOptions& opt, int64_t n);
// The fraction of a region of n tokens a call keeps, as kvpress's presses read it (1 − their
// compression_ratio): --ratio's value itself, else resolve_budget / n.
double resolve_kept_fraction(const CompressOptions& opt, int64_t n);

// Building blocks for methods.
// A CompressedKV that keeps the given indices exactly. idx [n_kv_heads, m] int64 (sorted or not;
// -1 entries become padding).
CompressedKV gather_kept(const LayerKV& kv, const at::Tensor& idx);
// The identity: every entry kept, bias 0.
CompressedKV keep_all(const LayerKV& kv);
// Attention scores the query heads of each KV group put on each region key: post-softmax
// probabilities over every key a query sees (prefix_keys + region + suffix_keys, causal against
// query_pos when given), restricted to the region: [n_kv_heads, n_obs, n], reduced over the group
// by `reduce` ("mean" | "max" | "sum"). Rows need not sum to 1 (mass on the sinks and tail is left out).
at::Tensor group_attention_probs(const LayerKV& kv, const std::string& reduce);

// Parameter parsing with the parameter's name in every error.
class Params {
 public:
  explicit Params(nlohmann::json given, std::string method);
  // Typed getters record the effective value; unknown keys are reported by `finish()`.
  double get_double(const std::string& key, double def);
  int64_t get_int(const std::string& key, int64_t def);
  bool get_bool(const std::string& key, bool def);
  // A JSON array of numbers, or a string "0.1,0.2" (the command line's --param), or `def`.
  std::vector<double> get_double_list(const std::string& key, const std::vector<double>& def);
  std::string get_string(const std::string& key, const std::string& def,
                         const std::vector<std::string>& allowed = {});
  // Throws kvlab::Error naming any given key that no getter asked for.
  void finish() const;
  const nlohmann::json& effective() const { return effective_; }

 private:
  nlohmann::json given_, effective_;
  std::string method_;
};

// Registry (registry.cpp): a list of methods, each stating its own facts in its file as a function
// `CompressorInfo method_<id>()` (snapkv.cpp: method_snapkv).
//
// What a method's paper says its compression costs, as an exponent of n (the time of compressing
// or streaming n tokens under the paper's own parameters held fixed); NaN = the source states none.
struct CostClaim {
  double exponent;
  std::string note;    // short, for tables
  std::string source;  // where it is stated (or how it is derived)
};

struct CompressorInfo {
  std::string name;
  std::string description;  // one line, for --list-methods
  std::unique_ptr<Compressor> (*make)(const nlohmann::json& params) = nullptr;
  // The setting of the paper's end-to-end experiments, with its sources (preset.h; defined and
  // cited in the method's file).
  MethodPreset (*paper)() = nullptr;
  CostClaim cost{std::numeric_limits<double>::quiet_NaN(), "", ""};
  // Reaches a budget by T halvings (keeps ⌊n/2^T⌋): compared at a T, not at an arbitrary budget.
  bool halving = false;
  // kvlab compresses the tokens decoded after the prefill too (Compressor::start_stream gives a
  // stream; test_contract checks the two agree); false = prefill only: decoded tokens are appended
  // exactly, as the papers and peer tools do for such methods.
  bool streaming = false;
  // Wraps a per-head scorer (adakv): `--method adakv:expected_attention` composes it with one; the
  // bare name uses the scorer of its paper preset. The wrapper's own parameters are `scorer` and
  // those its paper preset sets besides the scorer's.
  bool wrapper = false;
  // The context inputs it reads (context.h `inputs::`), e.g. {inputs::out_proj}. Only generation
  // and the task commands, where the model is loaded, give out_proj and reconstruction_scores: replay
  // refuses a method reading them (captures hold no weights).
  std::vector<std::string> inputs;
  // Compresses only with a calibration file its parameters name (duo_attention's head scores from
  // `kvlab calibrate duo`; its paper preset's required_file): without one it refuses, so the
  // every-method tests and --method all leave it to its own.
  bool calibration = false;
  // Keeps what a threshold of its own decides, not the run's budget (simlayerkv's lazy layers,
  // dms's score threshold): one branch whatever the budgets of a run, labelled without one, its
  // rows reporting the entries it held; an equal-memory comparison pairs it with branches at those
  // entries. Refused by --decode-rule compress and bench generate.
  bool own_memory = false;

  bool reads(const std::string& input) const { return std::find(inputs.begin(), inputs.end(), input) != inputs.end(); }
  // Runs only where the model is loaded (generation, ppl, the task commands), not on a capture.
  bool needs_model() const { return reads(inputs::out_proj) || reads(inputs::reconstruction_scores); }
};

// `name` may compose a wrapper with a scorer, "adakv:knorm" (the scorer given as the wrapper's
// `scorer` parameter).
std::unique_ptr<Compressor> make_compressor(const std::string& name, const nlohmann::json& params);
// The entry of `name` (of its wrapper for a composed name); an unknown name is an error suggesting
// the closest.
const CompressorInfo& compressor_info(const std::string& name);
const std::vector<CompressorInfo>& compressor_infos();
// Adds a method whose file is outside the library (a test's, or a researcher's own) to the list,
// after kvlab's; a name already listed is an error. Not thread-safe: call before compressing.
void add_compressor(CompressorInfo info);
std::vector<std::string> compressor_names();
// The named preset (preset.h: "default" | "paper") of a method.
MethodPreset method_preset(const std::string& name, const std::string& preset);

}  // namespace kvlab
