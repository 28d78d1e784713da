// finch — SnapKV's window attention with the question as the window: each prompt key is scored by
// the attention the question's queries give it, each query's row weighted by its position.
//
// Paper: Giulio Corallo, Paolo Papotti, "FINCH: Prompt-guided Key-Value Cache Compression for Large
//   Language Models", TACL 12 (2024). Defined as NVIDIA kvpress 0.5.5 `FinchPress`
//   (kvpress/presses/finch_press.py): the prompt is context + delimiter + question, and the window is
//   every token after the delimiter.
//
// Summary. With the window W = the question's w tokens at the prompt's end (`window` [0: where the
// run says the question starts, compress/context.h inputs::question_start], else the last `window`
// tokens), per KV head h and region key i before the window:
//
//   p[hq, j, i] = softmax over every key query j sees (causal) of q_j · k_i / √d,  j ∈ W
//   s[h, i]     = mean over h's query heads and j ∈ W of pos(j) · p[hq, j, i]   (normalize_scores:
//                 pos(j), the query's 0-based position = the keys before it; false: 1)
//
// Keys inside the window score +inf (kvpress: the layer's max + 1), so the question is always kept;
// each head keeps its b best (ties to the lower index).
//
//   queries  [Hq, ≥ w, d] post-RoPE, the prompt's last ones (observation_queries: every one when the
//            window is the question's, its length known only per prompt)
//   scores   [Hkv, n] float64 (keep_scores: finch can be adakv's scorer)
//
// Parameters: window [0 = the question], normalize_scores [true].
//
// Deviations and notes:
//   - kvpress re-rotates the kept keys to contiguous positions by default (rerotate_keys=True); in
//     kvlab that is the run's choice, `--rerotate` (kvpress's KeyRerotationPress), for every method.
//   - kvpress's chunk_length (each chunk keeps its own share) is not in kvlab (its default is None).
//   - A delimiter token is not needed: kvlab knows where the question starts from the task's
//     context/question split (--protocol whole); under --protocol context the question is not in the
//     prefill and finch needs `window`.
#include <ATen/ATen.h>

#include <limits>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Finch final : public Compressor {
 public:
  explicit Finch(Params p) {
    window_ = p.get_int("window", 0);
    normalize_ = p.get_bool("normalize_scores", true);
    KVLAB_CHECK(window_ >= 0, "finch: parameter 'window' must be >= 0 (0 = the question's tokens), got {}", window_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "finch"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return window_ > 0 ? window_ : -1; }

  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& /*opt*/) const override {
    detail::require_queries(kv, "finch");
    const int64_t n = kv.n_tokens(), w = window_of(kv);
    KVLAB_CHECK(kv.queries.size(1) >= w, "finch: the window's {} queries are needed, but the region came with {} "
                "(--obs-queries)", w, kv.queries.size(1));
    const LayerKV sub = detail::last_queries(kv, w);
    at::Tensor p = group_attention_probs(sub, "mean").to(at::kCPU, at::kDouble);  // [Hkv, w, n]
    if (normalize_) p = p * sub.query_pos.to(at::kCPU, at::kDouble).view({1, w, 1});
    at::Tensor s = p.mean(1).contiguous();                                          // [Hkv, n]
    // Keys from the window's first query on are the window (replay's tail after the observation
    // queries included).
    const int64_t window_from = sub.query_pos.min().item<int64_t>();
    for (int64_t i = std::max<int64_t>(0, window_from - kv.pos0); i < n; ++i)
      s.select(1, i).fill_(std::numeric_limits<double>::infinity());
    return s;
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);
  }

 private:
  // The window's length: `window`, or the prompt's tokens from the question's start.
  int64_t window_of(const LayerKV& kv) const {
    if (window_ > 0) return window_;
    KVLAB_CHECK(kv.context.has(inputs::question_start),
                "finch: scores with the question's queries, but this prompt came without its question: run a task "
                "command under --protocol whole, or give --param finch.window=N (the prompt's last N tokens)");
    const int64_t start = kv.context.get(inputs::question_start).item<int64_t>(), w = kv.n_prompt() - start;
    KVLAB_CHECK(start >= 0 && w > 0, "finch: the question starts at {}, outside the prompt's {} tokens", start,
                kv.n_prompt());
    return w;
  }

  int64_t window_ = 0;
  bool normalize_ = true;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_finch(const nlohmann::json& params) {
  return std::make_unique<Finch>(Params(params, "finch"));
}

// Preset "paper": FINCH's window is the question, position-weighted (kvpress FinchPress's defaults);
// give --rerotate for kvpress's re-rotated keys.
MethodPreset paper_preset_finch() {
  return {{{"window", 0}, {"normalize_scores", true}},
          0,
          0,
          "Corallo & Papotti (FINCH, TACL 2024) / kvpress FinchPress: the question as the window, rows weighted by "
          "position",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_finch() {
  CompressorInfo m;
  m.name = "finch";
  m.description =
      "the question's attention on each prompt key, rows weighted by position, top-k + the question (FINCH; "
      "kvpress FinchPress)";
  m.make = make_finch;
  m.paper = paper_preset_finch;
  m.inputs = {inputs::question_start};
  m.cost = {1.0, "known: O(w n d) question scores + top-k",
            "known cost: the w question queries over n keys O(w·n·d) and a top-k (FINCH, Corallo & Papotti; SnapKV's "
            "scoring)"};
  return m;
}

}  // namespace kvlab
