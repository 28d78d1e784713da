#include "kvlab/generate/branches.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "kvlab/attention/exact_cache.h"
#include "kvlab/cache/compressed_cache.h"
#include "kvlab/compress/layout.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

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
    const int64_t n = k[l].size(1), w = l < windows.size() ? windows[l] : 0;
    const int64_t held = w > 0 ? std::min(n, w - 1) : n;
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
    p.windows.push_back(model.config.interleaved_windows() ? model.config.layer_window(l) : 0);
  }
  p.seconds = seconds_since(t0);
  return p;
}

BranchResult run_branch(const Model& model, const Prefill& prefill, const BranchSpec& spec, const BranchOptions& opt) {
  c10::InferenceMode guard;
  KVLAB_CHECK(spec.keep_first >= 0 && spec.keep_last >= 0, "--keep-first and --keep-last must be >= 0");
  BranchResult r;
  CompressOptions co;
  co.budget = spec.budget;
  co.seed = spec.seed;
  std::vector<CompressedLayer> layers;
  const int n_layers = static_cast<int>(model.config.n_layers);
  // A method scoring with every prompt query shares the prefill's attention sums (see Prefill).
  const bool all_queries = spec.method.compressor->observation_queries() < 0;
  for (int l = 0; l < n_layers; ++l) {
    if (l < static_cast<int>(prefill.windows.size()) && prefill.windows[l] > 0) {
      layers.push_back(window_layer(prefill.k[l], prefill.v[l], prefill.windows[l]));
      continue;
    }
    const bool share = all_queries && prefill.q_obs[l].defined() && prefill.q_obs[l].size(1) == prefill.k[l].size(1);
    layers.push_back(compress_layer(*spec.method.compressor, co, prefill.k[l], prefill.v[l], prefill.q_obs[l],
                                    spec.keep_first, spec.keep_last, l, n_layers, &r.compress_ms, spec.stream,
                                    spec.count_whole, share ? prefill.attention_sums(l) : at::Tensor(),
                                    model.inv_freq, model.weights.layers[l].wo));
  }
  CompressedAttention attn(std::move(layers));
  r.kv_bytes = attn.bytes();
  r.kv_bytes_window = attn.window_bytes();
  r.entries_start = attn.live_entries();
  double entries_sum = r.entries_start, bytes_sum = double(r.kv_bytes);
  int64_t samples = 1;
  auto sample = [&] {
    entries_sum += attn.live_entries();
    bytes_sum += double(attn.bytes());
    ++samples;
  };

  auto t0 = std::chrono::steady_clock::now();
  at::Tensor logits = prefill.last_logits;  // [vocab]
  int64_t pos = static_cast<int64_t>(prefill.prompt.size());
  if (!opt.suffix.empty()) {
    // The question through the compressed cache (--protocol context): [T] ids -> logits [T, vocab]
    // in one forward; a cache that compresses while decoding takes it token by token, as it takes
    // every token that arrives (its streams push one token a step).
    const bool streams = attn.streams();
    const int64_t step = streams ? 1 : static_cast<int64_t>(opt.suffix.size());
    for (int64_t i = 0; i < static_cast<int64_t>(opt.suffix.size()); i += step) {
      ForwardOptions fo;
      fo.tap = opt.tap;
      std::vector<int64_t> part(opt.suffix.begin() + i, opt.suffix.begin() + i + step);
      at::Tensor all = forward(model, at::tensor(part, at::kLong), pos, attn, fo);
      logits = all.select(0, all.size(0) - 1);  // [vocab]
      pos += step;
      sample();
    }
  }
  const auto& eos = model.config.eos_token_ids;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    if (step > 0) {
      at::Tensor token = at::tensor(std::vector<int64_t>{r.ids.back()}, at::kLong);  // [1]
      ForwardOptions fo;
      fo.tap = opt.tap;
      logits = forward(model, token, pos, attn, fo).select(0, 0);                     // [vocab]
      ++pos;
      sample();
    }
    if (opt.on_logits) opt.on_logits(step, logits);
    const int64_t next = logits.argmax().item<int64_t>();
    r.ids.push_back(next);
    if (opt.on_token) opt.on_token(next);
    if (opt.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (opt.stop_when && opt.stop_when(r.ids)) break;
  }
  r.decode_seconds = seconds_since(t0);
  r.kv_bytes_end = attn.bytes();
  if (opt.on_done) opt.on_done(attn);
  r.kv_bytes_peak = attn.peak_bytes();
  r.entries_mean = entries_sum / double(samples);
  r.entries_peak = attn.peak_entries();
  r.bytes_mean = bytes_sum / double(samples);
  if (opt.keep_kept) r.kept = kept_json(attn);
  return r;
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
