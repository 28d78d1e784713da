// The method registry: an explicit table, one entry per method holding every fact about it (no
// self-registering statics: a static library would drop their object files). --list-methods,
// the benches and the tests read these entries; nothing outside compress/ keeps a list of methods.
//
// Adding a method: its file (class + factory), one entry here, one line in CMakeLists.txt.
#include <limits>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

namespace kvlab {

// Factories, one per method file.
std::unique_ptr<Compressor> make_exact(const nlohmann::json& params);
std::unique_ptr<Compressor> make_uniform(const nlohmann::json& params);
std::unique_ptr<Compressor> make_uniform_halving(const nlohmann::json& params);
std::unique_ptr<Compressor> make_streaming_llm(const nlohmann::json& params);
std::unique_ptr<Compressor> make_local(const nlohmann::json& params);
std::unique_ptr<Compressor> make_h2o(const nlohmann::json& params);
std::unique_ptr<Compressor> make_snapkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_pyramidkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_cam(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz_interval(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz_logn(const nlohmann::json& params);
std::unique_ptr<Compressor> make_chelsea(const nlohmann::json& params);
std::unique_ptr<Compressor> make_balancekv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_balancekv_mr(const nlohmann::json& params);
std::unique_ptr<Compressor> make_subgen(const nlohmann::json& params);
std::unique_ptr<Compressor> make_clustergen(const nlohmann::json& params);
std::unique_ptr<Compressor> make_knorm(const nlohmann::json& params);
std::unique_ptr<Compressor> make_tova(const nlohmann::json& params);
std::unique_ptr<Compressor> make_keydiff(const nlohmann::json& params);
std::unique_ptr<Compressor> make_lagkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_adakv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_expected_attention(const nlohmann::json& params);
std::unique_ptr<Compressor> make_compactor(const nlohmann::json& params);
std::unique_ptr<Compressor> make_criticalkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_kvzip(const nlohmann::json& params);
std::unique_ptr<Compressor> make_duo_attention(const nlohmann::json& params);
std::unique_ptr<Compressor> make_criticaladakv(const nlohmann::json& params);

// Paper presets, one per method file (preset.h).
MethodPreset paper_preset_exact();
MethodPreset paper_preset_uniform();
MethodPreset paper_preset_uniform_halving();
MethodPreset paper_preset_streaming_llm();
MethodPreset paper_preset_local();
MethodPreset paper_preset_h2o();
MethodPreset paper_preset_snapkv();
MethodPreset paper_preset_pyramidkv();
MethodPreset paper_preset_cam();
MethodPreset paper_preset_buzz();
MethodPreset paper_preset_buzz_interval();
MethodPreset paper_preset_buzz_logn();
MethodPreset paper_preset_chelsea();
MethodPreset paper_preset_balancekv();
MethodPreset paper_preset_balancekv_mr();
MethodPreset paper_preset_subgen();
MethodPreset paper_preset_clustergen();
MethodPreset paper_preset_knorm();
MethodPreset paper_preset_tova();
MethodPreset paper_preset_keydiff();
MethodPreset paper_preset_lagkv();
MethodPreset paper_preset_adakv();
MethodPreset paper_preset_expected_attention();
MethodPreset paper_preset_compactor();
MethodPreset paper_preset_criticalkv();
MethodPreset paper_preset_kvzip();
MethodPreset paper_preset_duo_attention();
MethodPreset paper_preset_criticaladakv();

namespace {

constexpr double kNotStated = std::numeric_limits<double>::quiet_NaN();

// clang-format off
const std::vector<CompressorInfo>& table() {
  static const std::vector<CompressorInfo> t = {
      {"exact", "full cache, no compression (the reference)",
       make_exact, paper_preset_exact, /*halving=*/false, /*streaming=*/false,
       {kNotStated, "no work (keep_all)",
        "not stated: the identity"}},
      {"uniform", "uniformly random subset per KV head, bias log(1/ratio)",
       make_uniform, paper_preset_uniform, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: random subset O(n)",
        "known cost: a random permutation / subset of n tokens, O(n) (docs/methods.md §3)"}},
      {"uniform-halving", "T random halvings (BalanceKV's baseline), bias T log 2",
       make_uniform_halving, paper_preset_uniform_halving, /*halving=*/true, /*streaming=*/false,
       {1.0, "known: T random halvings O(n)",
        "known cost: T rounds of random signs over the survivors, O(n) (BalanceKV §4.1's baseline)"}},
      {"streaming_llm", "n_sink attention sinks + the most recent tokens (StreamingLLM)",
       make_streaming_llm, paper_preset_streaming_llm, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: gather sinks+window O(n)",
        "known cost: a gather of n_sink + window tokens, O(budget) = O(n) at a fixed ratio (StreamingLLM, Xiao et al.)"}},
      {"local", "the most recent tokens only (sliding window)",
       make_local, paper_preset_local, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: gather window O(n)",
        "known cost: a gather of the recent window, O(budget) = O(n) at a fixed ratio"}},
      {"h2o", "recent window + heavy hitters by accumulated attention (H2O)",
       make_h2o, paper_preset_h2o, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: O(n_obs n d) scores + top-k",
        "known cost: accumulated attention of n_obs queries over n keys O(n_obs·n·d), then top-k O(n log n) (H2O, Zhang et al.)"}},
      {"snapkv", "observation-window attention, max-pooled, top-k + window (SnapKV)",
       make_snapkv, paper_preset_snapkv, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: O(w n d) window scores + top-k",
        "known cost: the w-query observation window over n keys O(w·n·d), 1-D pooling O(n), top-k (SnapKV, Li et al.)"}},
      {"knorm", "the keys of smallest L2 norm, query-agnostic (Devoto et al.; kvpress KnormPress)",
       make_knorm, paper_preset_knorm, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: key norms O(n d) + top-k",
        "known cost: one norm per key, O(n·d), and a top-k (Devoto et al. 2024)"}},
      {"tova", "the current query's head-averaged attention, lowest evicted (TOVA; kvpress TOVAPress)",
       make_tova, paper_preset_tova, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: one query's attention O(H n d) per step",
        "known cost: one query's attention over the n held keys per step, O(H·n·d), and a top-k (TOVA, Oren et al. 2024)"}},
      {"keydiff", "the keys least like the average key direction, query-agnostic (KeyDiff; kvpress KeyDiffPress)",
       make_keydiff, paper_preset_keydiff, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: one pass over the keys O(n d) + top-k",
        "known cost: the mean unit key and one cosine per key, O(n·d), and a top-k (KeyDiff, Park et al. 2025)"}},
      {"lagkv", "keys and values scored against the next partition's range, rank per partition (LagKV; kvpress LagKVPress)",
       make_lagkv, paper_preset_lagkv, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: one pass over keys and values O(n d) + top-k",
        "known cost: per partition a min/max, a normalised std and a softmax over keys and values, O(n·d), and a top-k (LagKV, Liang et al. 2025)"}},
      {"expected_attention", "attention expected from a Gaussian of the prompt's pre-RoPE queries moved to future positions, times |v| (kvpress ExpectedAttentionPress)",
       make_expected_attention, paper_preset_expected_attention, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: query statistics O(m d^2) + O(n d^2) scores",
        "known cost: the mean and covariance of m queries O(m·d²) per head, then k·mu and k^T Sigma k for n keys, O(n·d²), and a top-k (Devoto et al. 2025)"}},
      {"compactor", "approximate leverage of the pre-RoPE keys blended with chunked non-causal attention times |v|, query-agnostic (Compactor; kvpress CompactorPress)",
       make_compactor, paper_preset_compactor, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: sketch + Cholesky O(n d k + k^3), chunked attention O(n c d)",
        "known cost: the sketched Gram matrix O(n·d·k) and its Cholesky O(k³), attention within chunks of c positions O(n·c·d), and a top-k (Compactor, Chari & Van Durme 2025)"}},
      {"adakv", "a scorer's budget shared across a layer's KV heads, each head at least alpha of it (Ada-KV; kvpress AdaKVPress)",
       make_adakv, paper_preset_adakv, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: the scorer's cost + a top-k over H n",
        "known cost: the wrapped scorer's, then a per-head top-k and one over the layer's H·n scores (Ada-KV, Feng et al.)"},
       /*wrapper=*/true},
      {"criticalkv", "a scorer's top half kept, the rest by score times |W_o v|_1 (CriticalKV; kvpress CriticalKVPress); needs the model's W_o",
       make_criticalkv, paper_preset_criticalkv, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: the scorer's cost + O(H n d D) projected values",
        "known cost: the wrapped scorer's, then each value through its head's slice of W_o, O(H·n·d·D) for hidden size D, and a top-k (CriticalKV, Feng et al. 2025)"},
       /*wrapper=*/true, /*needs_out_proj=*/true},
      {"criticaladakv", "adakv's budgets across a layer's KV heads, then criticalkv's two stages on each head's own (CriticalAdaKV; kvpress CriticalAdaKVPress); needs the model's W_o",
       make_criticaladakv, paper_preset_criticaladakv, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: the scorer's cost + O(H n d D) projected values",
        "known cost: the wrapped scorer's, a top-k over the layer's H·n scores, each value through its head's slice of W_o, O(H·n·d·D), and per-head top-ks (CriticalKV, Feng et al. 2025)"},
       /*wrapper=*/true, /*needs_out_proj=*/true},
      {"kvzip", "attention each entry gets while the model repeats its context (a second prefill), one cut over all layers and heads, query-agnostic (KVzip; kvpress KVzipPress)",
       make_kvzip, paper_preset_kvzip, /*halving=*/false, /*streaming=*/false,
       {2.0, "known: a second prefill over the cache, O(n^2 d) per layer",
        "known cost: the context fed again (repeat prompt + chunks of c tokens) attending over the n cached entries, O(n·(n + c)·d) per layer plus the dense layers of one more prefill, then a top-k over L·H·n scores (KVzip, Kim et al. 2025: '2-3 times the initial prefilling cost' in kvpress)"},
       /*wrapper=*/false, /*needs_out_proj=*/false, /*needs_reconstruction=*/true},
      {"duo_attention", "retrieval heads keep every entry, streaming heads only 128 sinks + 256 recent, heads ranked by calibrated scores over the model (DuoAttention; kvpress DuoAttentionPress on-the-fly)",
       make_duo_attention, paper_preset_duo_attention, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: a sort of the L·H head scores and an index gather, O(n d)",
        "derived: the scores come from a calibration run made once per model (kvlab calibrate duo); compressing sorts L·H scores and gathers the kept rows"},
       /*wrapper=*/false, /*needs_out_proj=*/false, /*needs_reconstruction=*/false, /*needs_calibration=*/true},
      {"pyramidkv", "SnapKV with budgets shrinking from bottom to top layer (PyramidKV)",
       make_pyramidkv, paper_preset_pyramidkv, /*halving=*/false, /*streaming=*/false,
       {1.0, "known: as SnapKV, O(w n d)",
        "known cost: SnapKV's selection with a per-layer budget, O(w·n·d) (PyramidKV, Cai et al.)"}},
      {"cam", "StreamingLLM eviction, evicted values merged into the next tokens (CaM)",
       make_cam, paper_preset_cam, /*halving=*/false, /*streaming=*/true,
       {1.0, "known: eviction + merges O(n m d)",
        "known cost: StreamingLLM eviction plus merging each evicted value into m kept ones, O(n·m·d) for fixed m (CaM, Zhang et al.)"}},
      {"buzz", "sink + interval-sampled old + local-max hives of new tokens + window (BUZZ)",
       make_buzz, paper_preset_buzz, /*halving=*/false, /*streaming=*/true,
       {1.0, "BUZZ §3.3: O(n) (abstract: 'log n')",
        "BUZZ §3.3 'Time Complexity': O(1) per chunk for chunking and each local heavy hitter, overall O(n), attention scores excluded; the abstract and §5 speak of 'log n time complexity', not derived"}},
      {"buzz-interval", "BUZZ with interval sampling for new tokens too (Fig. 8b ablation)",
       make_buzz_interval, paper_preset_buzz_interval, /*halving=*/false, /*streaming=*/true,
       {1.0, "BUZZ §3.3: O(n)",
        "BUZZ §3.3 (as buzz); interval sampling is O(1) per kept token"}},
      {"buzz-logn", "BUZZ with logits scaled by log_512(n) (BUZZ §3.5)",
       make_buzz_logn, paper_preset_buzz_logn, /*halving=*/false, /*streaming=*/true,
       {1.0, "BUZZ §3.3: O(n)",
        "BUZZ §3.3 (as buzz); §3.5's log n only rescales logits"}},
      {"chelsea", "chunked soft matching: merge similar keys into degree-weighted centroids (Chelsea)",
       make_chelsea, paper_preset_chelsea, /*halving=*/false, /*streaming=*/true,
       {1.0, "Chelsea §5.2 Tab.1: n c d / 4",
        "Chelsea §5.2 Table 1: chunked soft matching's distance matrix costs n·c·d/4 for chunk size c (vs n²d/4 unchunked); c fixed -> O(n)"}},
      {"balancekv", "T discrepancy halvings by a self-balancing walk, bias log w (BalanceKV, practical)",
       make_balancekv, paper_preset_balancekv, /*halving=*/true, /*streaming=*/false,
       {1.0, "BalanceKV §4+Thm 3.2: O(n b d)/halving",
        "BalanceKV §4.1 (SoftmaxBalance run in parallel on blocks of b) with Theorem 3.2 (SoftmaxBalance on m points: O((d+s)m²)): O(n·b·(d+s)) per halving, geometric over T; derived, the paper states no total"}},
      {"balancekv-mr", "BalanceKV's streaming MergeAndReduce + value-norm buckets, num/den sets (Alg. 1-3)",
       make_balancekv_mr, paper_preset_balancekv_mr, /*halving=*/true, /*streaming=*/true,
       {1.0, "BalanceKV Thm 3.1/3.3: O(n t d)",
        "BalanceKV §3.2 proof of Theorem 3.3: O(n/t) SoftmaxBalance calls on batches of <= t points, each O(d·t²), i.e. O*(1/ε²) per stream step (Theorem 3.1) and O(n·t·d) for n tokens with t fixed"}},
      {"subgen", "online key clusters + l2 value samples, separate num/den sets (SubGen Alg. 1)",
       make_subgen, paper_preset_subgen, /*halving=*/false, /*streaming=*/true,
       {1.0, "SubGen Thm 1: O(d(mt+s))/token; =n² if mt+s∝n",
        "SubGen §2.4 Theorem 1: runtime O(d·(m·t + s)) per stream step, so O(n·d·(m·t+s)) for n tokens, sublinear per step when m = n^(1-Ω(1)) (Corollary 1); kvlab sets m·t + s = budget ∝ n at a fixed ratio (and bisects δ), for which the same bound gives n²"}},
      {"clustergen", "recent window + greedy k-center centres, bias log(cluster size) (ClusterGen)",
       make_clustergen, paper_preset_clustergen, /*halving=*/false, /*streaming=*/false,
       {kNotStated, "§4 k-center: not stated (Gonzalez: n k d)",
        "ClusterGen §4: greedy k-center 'applied once to the entire KV cache', cost not stated (Gonzalez: O(n·k·d), k ∝ n at a fixed ratio -> n²); Theorem 2.4's O(d(mt+s)) per step is for Algorithm 1 (kvlab's subgen)"}},
  };
  return t;
}
// clang-format on

}  // namespace

namespace {

// "wrapper:scorer" -> {wrapper, scorer}; a plain name -> {name, ""}. Errors name the method.
std::pair<std::string, std::string> split_composed(const std::string& name) {
  const auto colon = name.find(':');
  if (colon == std::string::npos) return {name, ""};
  const std::string w = name.substr(0, colon), s = name.substr(colon + 1);
  const CompressorInfo* info = nullptr;
  for (const auto& e : table())
    if (e.name == w) info = &e;
  KVLAB_CHECK(info && info->wrapper, "method '{}': '{}' is not a wrapper (wrappers compose as wrapper:scorer, e.g. "
              "adakv:knorm)", name, w);
  KVLAB_CHECK(!s.empty() && s.find(':') == std::string::npos, "method '{}': give one scorer after '{}:'", name, w);
  compressor_info(s);  // a known method, or the error suggesting one
  return {w, s};
}

}  // namespace

std::unique_ptr<Compressor> make_compressor(const std::string& name, const nlohmann::json& params) {
  const auto [w, s] = split_composed(name);
  if (s.empty()) return compressor_info(name).make(params);
  nlohmann::json p = params.is_null() ? nlohmann::json::object() : params;
  KVLAB_CHECK(!p.contains("scorer") || p["scorer"] == s, "method '{}': parameter 'scorer' ({}) contradicts the name",
              name, p["scorer"].dump());
  p["scorer"] = s;
  return compressor_info(w).make(p);
}

const CompressorInfo& compressor_info(const std::string& name) {
  if (name.find(':') != std::string::npos) return compressor_info(split_composed(name).first);
  for (const auto& e : table())
    if (name == e.name) return e;
  auto names = compressor_names();
  std::string hint = closest_match(name, names);
  KVLAB_FAIL("Unknown compressor '{}'.{} Available: {}", name,
             hint.empty() ? "" : fmt::format(" Did you mean: {}?", hint), fmt::join(names, ", "));
}

const std::vector<CompressorInfo>& compressor_infos() { return table(); }

std::vector<std::string> compressor_names() {
  std::vector<std::string> out;
  for (const auto& e : table()) out.push_back(e.name);
  return out;
}

MethodPreset method_preset(const std::string& name, const std::string& preset) {
  check_preset_name(preset);
  auto [w, s] = split_composed(name);
  const CompressorInfo& info = compressor_info(w);
  if (preset != "paper") {
    MethodPreset d;
    d.source = "the method's parameter defaults";
    if (!s.empty()) d.params["scorer"] = s;
    return d;
  }
  if (!info.wrapper) return info.paper();
  // A wrapper's paper setting over its scorer's: the scorer's parameters and exact tokens from the
  // scorer's own preset, the wrapper's own parameters (those its preset sets that its default
  // scorer's preset does not) on top.
  const MethodPreset own = info.paper();
  const std::string default_scorer = own.params.value("scorer", std::string());
  if (s.empty()) s = default_scorer;
  const MethodPreset inner = method_preset(s, "paper"), base = method_preset(default_scorer, "paper");
  MethodPreset out = inner;
  for (auto it = own.params.begin(); it != own.params.end(); ++it)
    if (!base.params.contains(it.key())) out.params[it.key()] = it.value();
  out.params["scorer"] = s;
  out.source = own.source + "; scorer: " + inner.source;
  return out;
}

bool streams_while_decoding(const std::string& name) {
  auto c = make_compressor(name, nlohmann::json::object());
  LayerKV tiny;  // 8 distinct keys, no queries, kept to 4 entries
  tiny.keys = at::sin(at::arange(32, at::kFloat)).view({1, 8, 4});
  tiny.values = at::cos(at::arange(32, at::kFloat)).view({1, 8, 4});
  CompressOptions opt;
  opt.budget = Budget::of_entries(4);
  return c->start_stream(tiny, opt) != nullptr;
}

}  // namespace kvlab
