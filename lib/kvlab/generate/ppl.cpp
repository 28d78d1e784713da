#include "kvlab/generate/ppl.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>

#include "kvlab/attention/exact_cache.h"
#include "kvlab/cache/compressed_cache.h"
#include "kvlab/core/check.h"
#include "kvlab/generate/branches.h"

namespace kvlab {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One layer per model layer, each an empty stream of `cache_size` entries (exact: an empty exact set).
CompressedAttention empty_cache(const Model& model, const PplBranch& b) {
  const auto& c = model.config;
  auto opts = at::TensorOptions().dtype(model.dtype).device(model.device);
  const at::Tensor none = at::zeros({c.n_kv_heads, 0, c.head_dim}, opts);  // [Hkv, 0, d]
  CompressOptions co;
  co.budget = Budget::of_entries(b.cache_size);
  co.seed = b.seed;
  const bool decodes = b.compress_every > 0 && b.method.name != "exact";
  if (b.method.name != "exact")
    KVLAB_CHECK(!b.method.quant, "ppl: {}: quantized caches are not in ppl yet (issue 52); use generate or a task "
                "command", b.method.label());
  if (decodes) {
    KVLAB_CHECK(!b.rerotate, "ppl: --compress-every and --rerotate: re-rotation moves a method's own stream; "
                "give one of them");
    check_decoding_compressible(b.method.name, *b.method.compressor, b.compress_every);
  }
  std::vector<CompressedLayer> layers;
  for (int l = 0; l < c.n_layers; ++l) {
    CompressedLayer layer;
    layer.num.keys = none, layer.num.values = none;
    layer.num.bias = at::zeros({c.n_kv_heads, 0}, opts);
    layer.num.pos = at::zeros({c.n_kv_heads, 0}, opts.dtype(at::kLong));
    layer.origin = layer.num.pos.clone();
    if (c.held_window(l) > 0) {
      layer.window = c.held_window(l);  // gemma3's sliding layers: an exact window for every method
    } else if (decodes) {
      layer.stream = start_decoding_stream(b.method.compressor, layer.num, 0, co, 0, DecodingRule{b.compress_every}, l,
                                           static_cast<int>(c.n_layers), decoding_inputs(model, l));
    } else if (b.method.name != "exact") {
      LayerKV empty;
      empty.keys = none, empty.values = none;
      empty.layer = l, empty.n_layers = static_cast<int>(c.n_layers);
      layer.stream = b.method.compressor->start_stream(empty, co);
      KVLAB_CHECK(layer.stream, "ppl: {} compresses once after a prefill and does not stream while decoding; "
                  "ppl streams a cache of --cache-size entries from the first token (see 'kvlab replay "
                  "--list-methods' for the streaming methods)", b.method.name);
      if (b.rerotate) {
        layer.rerotation = std::make_shared<Rerotation>(model.layer_inv_freq(l), b.method.name);
        layer.rerotation->require_movable(*layer.stream);
      }
    }
    layers.push_back(std::move(layer));
  }
  return CompressedAttention(std::move(layers));
}

}  // namespace

void check_ppl_branches(const Model& model, const std::vector<PplBranch>& branches) {
  c10::InferenceMode guard;
  for (const auto& b : branches) {
    KVLAB_CHECK(b.cache_size >= 1, "--cache-size must be >= 1, got {}", b.cache_size);
    (void)empty_cache(model, b);
  }
}

PplResult run_ppl(const Model& model, const std::vector<int64_t>& tokens, const std::vector<PplBranch>& branches,
                  const PplOptions& opt) {
  c10::InferenceMode guard;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVLAB_CHECK(n >= 2, "ppl: the text has {} tokens; at least 2 are needed", n);
  KVLAB_CHECK(opt.chunk >= 1, "ppl: chunk must be >= 1");
  std::vector<CompressedAttention> caches;
  for (const auto& b : branches) {
    KVLAB_CHECK(b.cache_size >= 1, "--cache-size must be >= 1, got {}", b.cache_size);
    caches.push_back(empty_cache(model, b));
  }
  PplResult res;
  res.n_tokens = n;
  res.full.method = "full";
  res.full.cache_size = n;
  std::vector<PplRow> rows(branches.size());
  std::vector<double> secs(branches.size(), 0.0);
  ExactAttention exact(model.config.n_layers);
  for (int64_t s = 0; s < n - 1; s += opt.chunk) {
    const int64_t e = std::min(n - 1, s + opt.chunk);  // predict tokens s+1 .. e from positions s .. e-1
    std::vector<int64_t> chunk(tokens.begin() + s, tokens.begin() + e);
    auto t0 = std::chrono::steady_clock::now();
    ForwardOptions fo;
    fo.all_logits = true;
    auto full = forward(model, at::tensor(chunk, at::kLong), s, exact, fo).to(at::kCPU, at::kDouble);  // [T, V]
    auto full_lp = at::log_softmax(full, -1);                                                        // [T, V]
    auto next = at::tensor(std::vector<int64_t>(tokens.begin() + s + 1, tokens.begin() + e + 1), at::kLong);  // [T]
    res.full.nll -= full_lp.gather(1, next.view({-1, 1})).sum().item<double>();
    auto full_top = full_lp.argmax(-1);  // [T]
    res.full.seconds += seconds_since(t0);
    // Branch b's log-probabilities [V] at position t enter its row.
    auto score = [&](size_t b, int64_t t, const at::Tensor& logits) {
      auto lp = at::log_softmax(logits.to(at::kCPU, at::kDouble), -1);  // [V]
      const auto ref = full_lp[t - s];                                  // [V]
      rows[b].nll -= lp[tokens[t + 1]].item<double>();
      rows[b].kl += (ref.exp() * (ref - lp)).sum().item<double>();
      rows[b].top1 += lp.argmax().item<int64_t>() == full_top[t - s].item<int64_t>() ? 1.0 : 0.0;
    };
    if (opt.batch && branches.size() > 1) {
      std::vector<AttentionBackend*> attns;
      for (auto& c : caches) attns.push_back(&c);
      const int64_t B = static_cast<int64_t>(branches.size());
      for (int64_t t = s; t < e; ++t) {
        auto t1 = std::chrono::steady_clock::now();
        auto tok = at::full({B, 1}, tokens[t], at::kLong);          // [B, 1]
        at::Tensor logits = forward_batch(model, tok, t, attns);    // [B, V]
        for (int64_t b = 0; b < B; ++b) score(size_t(b), t, logits.select(0, b));
        const double share = seconds_since(t1) / double(B);
        for (auto& x : secs) x += share;
      }
    } else {
      for (size_t b = 0; b < branches.size(); ++b) {
        auto t1 = std::chrono::steady_clock::now();
        for (int64_t t = s; t < e; ++t) {
          auto tok = at::tensor(std::vector<int64_t>{tokens[t]}, at::kLong);  // [1]
          score(b, t, forward(model, tok, t, caches[b]).select(0, 0));
        }
        secs[b] += seconds_since(t1);
      }
    }
    if (opt.progress) opt.progress(e, n);
  }
  const double m = static_cast<double>(n - 1);
  res.full.n_predicted = n - 1;
  res.full.nll /= m;
  res.full.ppl = std::exp(res.full.nll);
  res.full.top1 = 1.0;
  int64_t exact_bytes = 0;
  for (int64_t l = 0; l < model.config.n_layers; ++l) {
    // A sliding layer of an interleaved model (gemma3) holds only its window, as transformers' cache.
    const int64_t n = exact.keys(l).size(1), held = window_held(n, model.config.held_window(l));
    if (n > 0) exact_bytes += (exact.keys(l).nbytes() + exact.values(l).nbytes()) / n * held;
  }
  res.full.kv_bytes_peak = exact_bytes;
  for (size_t b = 0; b < branches.size(); ++b) {
    PplRow& r = rows[b];
    r.method = branches[b].method.label();
    r.cache_size = branches[b].cache_size;
    r.rerotate = branches[b].rerotate;
    r.compress_every = branches[b].method.name == "exact" ? 0 : branches[b].compress_every;  // the full cache never compresses
    r.n_predicted = n - 1;
    r.nll /= m;
    r.ppl = std::exp(r.nll);
    r.kl /= m;
    r.top1 /= m;
    r.kv_bytes_peak = caches[b].peak_bytes();
    r.seconds = secs[b];
  }
  res.rows = std::move(rows);
  return res;
}

}  // namespace kvlab
