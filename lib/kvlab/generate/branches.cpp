#include "kvlab/generate/branches.h"

#include "kvlab/cache/rerotation.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvlab/attention/exact_cache.h"
#include "kvlab/cache/compressed_cache.h"
#include "kvlab/compress/layout.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"
#include "kvlab/quant/quantized_part.h"

namespace kvlab {

Context decoding_inputs(const Model& model, int layer) {
  Context fixed;  // what does not run over positions: the held entries are not the prompt's
  const LayerWeights& lw = model.weights.layers[layer];
  fixed.provide(inputs::out_proj, [&lw] { return dense_weight(lw.wo, lw.wo_s); });  // [hidden, Hq*d]
  fixed.provide(inputs::rope_inv_freq, model.layer_inv_freq(layer));  // for the stream (queries_at_newest)
  return fixed;
}

namespace {

// Keeps each layer's last n_obs queries of the prefill.
struct ObsTap : QkvTap {
  int64_t n_obs = 0;
  std::vector<at::Tensor>* q_obs = nullptr;
  void on_qkv(int layer, const at::Tensor& q, const at::Tensor&, const at::Tensor&) override {
    const int64_t t = q.size(1), m = std::min(n_obs, t);
    (*q_obs)[layer] = q.narrow(1, t - m, m).clone();  // [Hq, m, d]
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t Prefill::exact_kv_bytes() const {
  int64_t b = 0;
  for (size_t l = 0; l < k.size(); ++l) {
    const int64_t n = k[l].size(1), held = window_held(n, l < windows.size() ? windows[l] : 0);
    b += n > 0 ? (k[l].nbytes() + v[l].nbytes()) / n * held : 0;
  }
  return b;
}

const at::Tensor& Prefill::attention_sums(int layer) const {
  const int64_t n = k.at(layer).size(1);
  KVLAB_CHECK(q_obs.at(layer).defined() && q_obs[layer].size(1) == n,
              "attention sums need every prompt query kept by the prefill ({} of {})",
              q_obs[layer].defined() ? q_obs[layer].size(1) : 0, n);
  if (sums_.size() != k.size()) sums_.resize(k.size());
  if (!sums_[layer].defined()) {
    LayerKV whole = region_of(k[layer], v[layer], 0, n, q_obs[layer], at::arange(n, k[layer].options().dtype(at::kLong)),
                              layer, int(k.size()));
    sums_[layer] = detail::attention_sums_per_query_head(whole);  // [Hq, n] float64
  }
  return sums_[layer];
}

const at::Tensor& Prefill::reconstruction_scores(const Model& model, const ReconstructionRequest& rq,
                                                 double* seconds) const {
  auto it = recon_.find(rq);
  if (it == recon_.end()) {
    KVLAB_CHECK(rq.repeat_context || reconstruction.defined(),
                "kvzip: no repeat prompt for its context reconstruction: it needs the model's tokenizer (a model "
                "without one, or a command that does not tokenize, cannot run kvzip)");
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor scores =
        kvlab::reconstruction_scores(model, k, v, windows, prompt, reconstruction, rq);
    it = recon_.emplace(rq, std::make_pair(scores, seconds_since(t0))).first;  // [L, Hkv, n]
  }
  if (seconds) *seconds = it->second.second;
  return it->second.first;
}

Prefill run_prefill(const Model& model, const std::vector<int64_t>& prompt, int64_t n_obs) {
  c10::InferenceMode guard;
  KVLAB_CHECK(!prompt.empty(), "generate: the prompt has no tokens (give --prompt or --prompt-ids)");
  KVLAB_CHECK(n_obs >= 0, "--obs-queries must be >= 0, got {}", n_obs);
  const int64_t n_layers = model.config.n_layers;
  auto t0 = std::chrono::steady_clock::now();
  Prefill p;
  p.prompt = prompt;
  p.q_obs.resize(n_layers);
  ObsTap tap;
  tap.n_obs = n_obs;
  tap.q_obs = &p.q_obs;
  ExactAttention attn(n_layers);
  ForwardOptions fo;
  fo.tap = n_obs > 0 ? &tap : nullptr;
  p.last_logits = forward(model, at::tensor(prompt, at::kLong), 0, attn, fo).select(0, 0);  // [vocab]
  for (int64_t l = 0; l < n_layers; ++l) {
    p.k.push_back(attn.keys(l).clone());    // [Hkv, n, d]
    p.v.push_back(attn.values(l).clone());  // [Hkv, n, d]
    p.windows.push_back(model.config.held_window(l));
  }
  p.seconds = seconds_since(t0);
  return p;
}

namespace {

// The compressed cache of one branch: every layer of the prefill through the branch's method
// (a window layer held as its exact window).
std::vector<CompressedLayer> compress_branch(const Model& model, const Prefill& prefill, const BranchSpec& spec,
                                             double* compress_ms, double* reconstruction_seconds) {
  KVLAB_CHECK(spec.keep_first >= 0 && spec.keep_last >= 0, "--keep-first and --keep-last must be >= 0");
  CompressOptions co;
  co.budget = spec.budget;
  co.seed = spec.seed;
  std::vector<CompressedLayer> layers;
  const int n_layers = static_cast<int>(model.config.n_layers);
  // A method scoring with every prompt query shares the prefill's attention sums (see Prefill).
  const bool all_queries = spec.method.compressor->observation_queries() < 0;
  // kvzip, kvcompose: the scores of every layer from a second forward of the context (shared by branches).
  const ReconstructionRequest rq = spec.method.compressor->reconstruction();
  // --decode-rule compress: every method but the full cache compresses again while decoding.
  const bool decodes = spec.decoding.every > 0 && spec.method.name != "exact";
  if (decodes) check_decoding_compressible(spec.method.name, *spec.method.compressor, spec.decoding.every);
  // The reconstruction's forward, when this branch is the first to ask for it, runs inside a
  // compress() call: it is counted in reconstruction_seconds, not again in compress_ms.
  double reconstruction_ms = 0;
  for (int l = 0; l < n_layers; ++l) {
    if (l < static_cast<int>(prefill.windows.size()) && prefill.windows[l] > 0) {
      layers.push_back(window_layer(prefill.k[l], prefill.v[l], prefill.windows[l]));
      continue;
    }
    // What a method may read beyond the layer (compress/context.h), each made when one asks.
    Context context;
    context.provide(inputs::rope_inv_freq, model.inv_freq);
    if (prefill.question_start >= 0)
      context.provide(inputs::question_start, at::scalar_tensor(prefill.question_start, at::kLong));
    const LayerWeights& lw = model.weights.layers[l];
    context.provide(inputs::out_proj, [&lw] { return dense_weight(lw.wo, lw.wo_s); });  // [hidden, Hq*d]
    if (all_queries && prefill.q_obs[l].defined() && prefill.q_obs[l].size(1) == prefill.k[l].size(1))
      context.provide(inputs::attention_sums, [&prefill, l] { return prefill.attention_sums(l); }, 1);  // [Hq, n]
    if (rq.any())
      context.provide(
          inputs::reconstruction_scores,
          [&model, &prefill, rq, reconstruction_seconds, &reconstruction_ms] {
            const auto t0 = std::chrono::steady_clock::now();
            const at::Tensor& s = prefill.reconstruction_scores(model, rq, reconstruction_seconds);  // [L, Hkv, n]
            reconstruction_ms += 1000.0 * seconds_since(t0);
            return s;
          },
          2);
    if (spec.budget.kind == Budget::Kind::bytes && prefill.k[l].size(1) > 0) {
      // Equal bytes (issue 52): the most entries of the whole layer whose K and V, stored by the
      // branch's quantizer (or in full precision), fit the fraction of the full-precision layer.
      const at::Tensor& k = prefill.k[l];  // [Hkv, n, d]
      const int64_t n = k.size(1);
      const int64_t m = entries_for_bytes(spec.method.quant.get(), n, k.size(0), k.size(2),
                                          int64_t(k.element_size()), spec.budget.bytes);
      co.budget = Budget::of_ratio(double(m) / double(n));
    }
    layers.push_back(compress_layer(*spec.method.compressor, co, prefill.k[l], prefill.v[l], prefill.q_obs[l],
                                    spec.keep_first, spec.keep_last, l, n_layers, compress_ms, spec.stream && !decodes,
                                    spec.count_whole, context));
    KVLAB_CHECK(layers.back().key_bytes_saved == 0 ||
                    (!decodes && !spec.method.quant && spec.budget.kind != Budget::Kind::bytes && !spec.rerotate),
                "--method {}: its keys lose channels (ThinK), which kvlab counts only in a full-precision cache "
                "compressed once after the prefill; not yet with --decode-rule compress or rerotate, a quantizer or "
                "--bytes (issue 53): give --ratio or --budget and --decode-rule prefill",
                spec.method.label());
    if (decodes) {
      KVLAB_CHECK(!spec.rerotate, "--decode-rule compress: the branch cannot also re-rotate");
      compress_while_decoding(layers.back(), spec.method.compressor, co, spec.count_whole, spec.decoding, l, n_layers,
                              decoding_inputs(model, l));
    }
    layers.back().quant = spec.method.quant;  // stored quantized from here on (window layers stay exact)
    if (spec.rerotate && layers.back().stream) {
      CompressedLayer& cl = layers.back();
      KVLAB_CHECK(cl.num.keys.size(1) == 0, "re-rotation (--decode-rule rerotate / --rerotate) moves only a stream's "
                  "own entries; {} keeps {} exact positions before them (--keep-first or its preset): give keep_first 0",
                  spec.method.name, cl.num.keys.size(1));
      cl.rerotation = std::make_shared<Rerotation>(model.layer_inv_freq(l), spec.method.name);
      cl.rerotation->require_movable(*cl.stream);  // before any token is decoded
      cl.rerotation->apply(*cl.stream);  // the prompt's survivors, before the first decoded token attends
    } else if (spec.rerotate && layers.back().window == 0) {
      rerotate_kept(layers.back(), model.layer_inv_freq(l), spec.method.name);  // before it is stored quantized
    }
    const KVSet& held = layers.back().num;
    KVLAB_CHECK(!(spec.method.quant && spec.budget.kind == Budget::Kind::bytes && held.bias.defined() &&
                  !at::isfinite(held.bias).all().item<bool>()),
                "--bytes with --method {}: {} keeps different counts per KV head, and a quantizer's window makes "
                "bytes depend on each head's count, so the fraction cannot be met by one count per layer yet "
                "(issue 52); give --ratio, or a method that keeps one count per head",
                spec.method.label(), spec.method.name);
  }
  if (compress_ms) *compress_ms = std::max(0.0, *compress_ms - reconstruction_ms);
  return layers;
}

// One branch from its compression to its last token. run_branch drives one through forward(),
// run_branches many at once through forward_batch(); both make the same calls on it in the same
// order: took() after every forward through its cache, choose() for every token.
class BranchRun {
 public:
  BranchRun(const Model& model, const Prefill& prefill, const BranchSpec& spec, const BranchOptions& opt)
      : model_(model), opt_(opt), label_(spec.method.label()),
        attn_(compress_branch(model, prefill, spec, &r_.compress_ms, &r_.reconstruction_seconds)) {
    r_.kv_bytes = attn_.bytes();
    r_.kv_bytes_window = attn_.window_bytes();
    r_.entries_start = attn_.live_entries();
    entries_sum_ = r_.entries_start;
    bytes_sum_ = double(r_.kv_bytes);
    logits_ = prefill.last_logits;  // [vocab]
    pos = static_cast<int64_t>(prefill.prompt.size());
  }
  CompressedAttention& attn() { return attn_; }
  // A cache that compresses while decoding takes the suffix token by token, as it takes every token
  // that arrives (its streams push one token a step).
  int64_t suffix_step() const { return attn_.streams() ? 1 : static_cast<int64_t>(opt_.suffix.size()); }
  // After a forward of `t` tokens through this branch's cache: the logits [vocab] of the last one.
  void took(const at::Tensor& logits, int64_t t) {
    logits_ = logits;
    pos += t;
    entries_sum_ += attn_.live_entries();
    bytes_sum_ += double(attn_.bytes());
    ++samples_;
  }
  // Chooses the next token from the latest logits. True when another token is wanted (the caller
  // then feeds last() through the cache and calls took()).
  bool choose() {
    if (step_ >= opt_.max_new_tokens) return false;
    if (opt_.on_logits) opt_.on_logits(step_, logits_);
    const int64_t next = greedy_choice(logits_, step_, label_);
    r_.ids.push_back(next);
    if (opt_.on_token) opt_.on_token(next);
    ++step_;
    const auto& eos = model_.config.eos_token_ids;
    if (opt_.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) return false;
    if (opt_.stop_when && opt_.stop_when(r_.ids)) return false;
    return step_ < opt_.max_new_tokens;
  }
  int64_t last() const { return r_.ids.back(); }
  void add_seconds(double s) { r_.decode_seconds += s; }
  BranchResult finish() {
    r_.kv_bytes_end = attn_.bytes();
    if (opt_.on_done) opt_.on_done(attn_);
    r_.kv_bytes_peak = attn_.peak_bytes();
    r_.entries_mean = entries_sum_ / double(samples_);
    r_.entries_peak = attn_.peak_entries();
    r_.bytes_mean = bytes_sum_ / double(samples_);
    if (opt_.keep_kept) r_.kept = kept_json(attn_);
    return std::move(r_);
  }
  int64_t pos = 0;  // the next token's position

 private:
  const Model& model_;
  const BranchOptions& opt_;
  std::string label_;  // the method's label, for errors
  BranchResult r_;
  CompressedAttention attn_;
  at::Tensor logits_;  // [vocab] the logits the next token is chosen from
  int64_t step_ = 0;
  double entries_sum_ = 0, bytes_sum_ = 0;
  int64_t samples_ = 1;
};

}  // namespace

BranchResult run_branch(const Model& model, const Prefill& prefill, const BranchSpec& spec, const BranchOptions& opt) {
  c10::InferenceMode guard;
  BranchRun b(model, prefill, spec, opt);
  auto t0 = std::chrono::steady_clock::now();
  ForwardOptions fo;
  fo.tap = opt.tap;
  // The question through the compressed cache (--protocol context): [T] ids -> logits [T, vocab];
  // the first answer token then comes from the compressed cache.
  const int64_t n_suffix = static_cast<int64_t>(opt.suffix.size()), step = b.suffix_step();
  for (int64_t i = 0; i < n_suffix; i += step) {
    std::vector<int64_t> part(opt.suffix.begin() + i, opt.suffix.begin() + i + step);
    b.took(forward(model, at::tensor(part, at::kLong), b.pos, b.attn(), fo).select(0, 0), step);  // [vocab]
  }
  while (b.choose()) {
    at::Tensor token = at::tensor(std::vector<int64_t>{b.last()}, at::kLong);  // [1]
    b.took(forward(model, token, b.pos, b.attn(), fo).select(0, 0), 1);        // [vocab]
  }
  b.add_seconds(seconds_since(t0));
  return b.finish();
}

std::vector<BranchResult> run_branches(const Model& model, const Prefill& prefill, const std::vector<BranchSpec>& specs,
                                       const std::vector<BranchOptions>& opts) {
  c10::InferenceMode guard;
  KVLAB_CHECK(specs.size() == opts.size(), "run_branches: {} branch specs and {} options", specs.size(), opts.size());
  std::vector<BranchResult> out(specs.size());
  // A branch with a q/k/v tap (which sees one sequence) or a suffix of its own runs alone.
  std::vector<size_t> batch;
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool alone = opts[i].tap != nullptr || (!batch.empty() && opts[i].suffix != opts[batch[0]].suffix);
    if (alone) out[i] = run_branch(model, prefill, specs[i], opts[i]);
    else batch.push_back(i);
  }
  if (batch.empty()) return out;
  std::vector<std::unique_ptr<BranchRun>> runs;
  for (size_t i : batch) runs.push_back(std::make_unique<BranchRun>(model, prefill, specs[i], opts[i]));

  // One batched forward of the token rows `ids` (one per run in `live`); each run takes its logits
  // and an even share of the wall time.
  auto step = [&](const std::vector<BranchRun*>& live, const std::vector<std::vector<int64_t>>& ids) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> flat;
    std::vector<AttentionBackend*> attns;
    for (size_t b = 0; b < live.size(); ++b) {
      flat.insert(flat.end(), ids[b].begin(), ids[b].end());
      attns.push_back(&live[b]->attn());
    }
    const int64_t B = static_cast<int64_t>(live.size()), T = static_cast<int64_t>(ids[0].size());
    at::Tensor logits = forward_batch(model, at::tensor(flat, at::kLong).view({B, T}), live[0]->pos, attns);  // [B, vocab]
    const double share = seconds_since(t0) / double(B);
    for (int64_t b = 0; b < B; ++b) {
      live[b]->took(logits.select(0, b), T);
      live[b]->add_seconds(share);
    }
  };

  // The suffix (the same for every run here): whole for the runs that compress once, token by
  // token for the streaming ones, as run_branch feeds each.
  const std::vector<int64_t>& suffix = opts[batch[0]].suffix;
  if (!suffix.empty()) {
    std::vector<BranchRun*> whole, streaming;
    for (auto& r : runs) (r->suffix_step() == 1 && suffix.size() > 1 ? streaming : whole).push_back(r.get());
    if (!whole.empty()) step(whole, std::vector<std::vector<int64_t>>(whole.size(), suffix));
    for (size_t i = 0; i < suffix.size() && !streaming.empty(); ++i)
      step(streaming, std::vector<std::vector<int64_t>>(streaming.size(), {suffix[i]}));
  }
  // Decoding: every live run's last token in one batch; a run that stops leaves it. Runs decode in
  // lockstep, so every live run is at the same position.
  std::vector<BranchRun*> live;
  for (auto& r : runs)
    if (r->choose()) live.push_back(r.get());
  while (!live.empty()) {
    std::vector<std::vector<int64_t>> ids;
    for (BranchRun* r : live) ids.push_back({r->last()});
    step(live, ids);
    std::vector<BranchRun*> still;
    for (BranchRun* r : live)
      if (r->choose()) still.push_back(r);
    live = std::move(still);
  }
  for (size_t j = 0; j < batch.size(); ++j) out[batch[j]] = runs[j]->finish();
  return out;
}

namespace {

// Keeps each layer's q/k/v of the tokens forwarded.
struct ProbeTap : QkvTap {
  QuestionProbe* probe = nullptr;
  void on_qkv(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) override {
    probe->q[layer] = q.clone();  // [Hq, s, d]
    probe->k[layer] = k.clone();  // [Hkv, s, d]
    probe->v[layer] = v.clone();
  }
};

// The branch's cache right after compression, compressed once (no stream).
CompressedAttention compressed_once(const Model& model, const Prefill& prefill, BranchSpec spec) {
  spec.stream = false;
  spec.decoding = DecodingRule{0};
  return CompressedAttention(compress_branch(model, prefill, spec, nullptr, nullptr));
}

}  // namespace

QuestionProbe probe_question(const Model& model, const Prefill& prefill, const std::vector<int64_t>& tokens,
                             const BranchSpec& exact) {
  c10::InferenceMode guard;
  KVLAB_CHECK(exact.method.full_cache(), "probe_question: the probe goes through the full cache, not {}",
              exact.method.label());
  KVLAB_CHECK(!tokens.empty(), "the single-layer error needs the question's tokens after the prefill "
              "(--protocol context); this record has none");
  const int64_t n_layers = model.config.n_layers;
  QuestionProbe p;
  p.pos0 = static_cast<int64_t>(prefill.prompt.size());
  p.q.resize(n_layers), p.k.resize(n_layers), p.v.resize(n_layers);
  ProbeTap tap;
  tap.probe = &p;
  ForwardOptions fo;
  fo.tap = &tap;
  CompressedAttention full = compressed_once(model, prefill, exact);
  forward(model, at::tensor(tokens, at::kLong), p.pos0, full, fo);
  // The exact outputs, from the context alone again: each layer attends once, and a layer's attend
  // changes only that layer, so one fresh cache serves every layer.
  CompressedAttention fresh = compressed_once(model, prefill, exact);
  for (int64_t l = 0; l < n_layers; ++l)
    p.z.push_back(fresh.attend(int(l), p.q[l], p.k[l], p.v[l], p.pos0, model.config.layer_window(l)));  // [Hq, s, d]
  return p;
}

std::vector<double> branch_layer_error(const Model& model, const Prefill& prefill, const BranchSpec& spec,
                                       const QuestionProbe& probe) {
  c10::InferenceMode guard;
  KVLAB_CHECK(!spec.rerotate, "the single-layer error (--layer-error) cannot judge {} with re-rotated keys "
              "(--decode-rule rerotate): the question's positions would move with them", spec.method.label());
  CompressedAttention attn = compressed_once(model, prefill, spec);
  std::vector<double> err;
  for (int l = 0; l < int(probe.q.size()); ++l) {
    if (l < int(prefill.windows.size()) && prefill.windows[l] > 0) {
      err.push_back(std::nan(""));  // held exact by every branch
      continue;
    }
    const at::Tensor z = attn.attend(l, probe.q[l], probe.k[l], probe.v[l], probe.pos0, model.config.layer_window(l));
    const at::Tensor ref = probe.z[l].to(at::kDouble);  // [Hq, s, d]
    err.push_back((z.to(at::kDouble) - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-300));
  }
  return err;
}

nlohmann::json kept_json(const CompressedAttention& attn) {
  nlohmann::json layers = nlohmann::json::array();
  for (int64_t l = 0; l < attn.n_layers(); ++l) {
    const CompressedLayer& cl = attn.layer(static_cast<int>(l));
    nlohmann::json heads = nlohmann::json::array();
    const int64_t h = cl.n_kv_heads();
    for (int64_t i = 0; i < h; ++i) heads.push_back(cl.kept(i));
    layers.push_back({{"layer", l}, {"kv_heads", heads}});
  }
  return {{"layers", layers}};
}

}  // namespace kvlab
