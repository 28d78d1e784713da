#include "kvlab/generate/reconstruction.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlab/attention/backend.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/check.h"
#include "kvlab/tokenizer/chat_template.h"
#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

ReconstructionPrompt reconstruction_prompt(const Tokenizer& tok, const std::string& chat_template) {
  ReconstructionPrompt rp;
  rp.first = tok.encode("\n\nRepeat the previous context exactly.", false);
  rp.next = tok.encode("\n\nRepeat the part of the previous context exactly, starting with", false);
  std::string prefix, turn = "\n";
  if (chat_template != "none") {
    const std::string dummy = "dummy context", sep = "\n" + std::string(dummy.size(), '#');
    const std::string text = apply_chat_template(chat_template, {{"user", dummy + sep}}, true);
    const size_t at = text.find(sep), d = text.find(dummy);
    KVLAB_CHECK(at != std::string::npos && d != std::string::npos && d < at,
                "kvzip: chat template '{}' does not keep the user's text verbatim", chat_template);
    prefix = text.substr(0, d);
    turn = text.substr(at + sep.size());
  }
  rp.prefix = tok.encode(prefix, true);  // as the prompt itself is encoded (with the model's BOS)
  rp.turn = tok.encode(turn, false);
  return rp;
}

const ReconstructionPrompt& reconstruction_prompt_for(const std::vector<int64_t>& prompt,
                                                      const ReconstructionPrompt& templated,
                                                      const ReconstructionPrompt& plain) {
  const auto& p = templated.prefix;
  const bool starts = templated.defined() && p.size() > plain.prefix.size() && prompt.size() >= p.size() &&
                      std::equal(p.begin(), p.end(), prompt.begin());
  return starts ? templated : plain;
}

std::vector<ReconstructionChunk> reconstruction_chunks(const std::vector<int64_t>& prompt,
                                                       const ReconstructionPrompt& rp, int64_t chunk_size) {
  KVLAB_CHECK(rp.defined(), "kvzip: no repeat prompt (the command did not tokenize KVzip's prompts)");
  KVLAB_CHECK(chunk_size > 0, "kvzip: parameter 'chunk_size' must be > 0, got {}", chunk_size);
  constexpr int64_t kPrevPostfix = 8;  // KVzipPress.prepare's prev_postfix_size
  const int64_t n = int64_t(prompt.size()), start = std::min<int64_t>(int64_t(rp.prefix.size()), n);
  std::vector<ReconstructionChunk> out;
  for (int64_t b = start; b < n; b += chunk_size) {
    ReconstructionChunk c;
    c.begin = b;
    c.end = std::min(n, b + chunk_size);
    if (out.empty()) {
      c.ids = rp.first;
    } else {
      c.ids = rp.next;
      const int64_t pb = std::max(out.back().begin, out.back().end - kPrevPostfix);
      c.ids.insert(c.ids.end(), prompt.begin() + pb, prompt.begin() + out.back().end);
    }
    c.ids.insert(c.ids.end(), rp.turn.begin(), rp.turn.end());
    c.ids.insert(c.ids.end(), prompt.begin() + b, prompt.begin() + c.end);
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

// The attention of one reconstruction forward: exact attention over the prefill's cache and the
// new tokens (the prefill's tensors are read, never extended), and, on every compressed layer,
// the scores of the chunk being rebuilt (KVzip's, or KVCompose's with group_mean), taken from the
// same attention weights.
class ReconstructionAttention final : public AttentionBackend {
 public:
  // scores: per layer [Hkv, n], filled chunk by chunk; undefined = a layer not scored.
  ReconstructionAttention(const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v,
                          std::vector<at::Tensor>& scores, int64_t n_sink, bool group_mean)
      : k_(k), v_(v), scores_(scores), n_sink_(n_sink), group_mean_(group_mean) {}
  void set_chunk(int64_t begin, int64_t end) { begin_ = begin, end_ = end; }

  at::Tensor attend(int layer, const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, int64_t pos0,
                    int64_t window) override {
    const at::Tensor keys = at::cat({k_[layer], k_new}, 1), values = at::cat({v_[layer], v_new}, 1);  // [Hkv, n+t, d]
    if (!scores_[layer].defined()) return causal_gqa_attention(q, keys, values, pos0, 128, window);  // [Hq, t, d]
    KVLAB_CHECK(window == 0, "{}: layer {} has a sliding window and cannot be scored", group_mean_ ? "kvcompose" : "kvzip", layer);
    return attend_and_score(layer, q, keys, values);
  }
  void reset() override {}

 private:
  // q [Hq, t, d] post-RoPE at positions n.. (after the prefill's n); keys, values [Hkv, n+t, d].
  // -> the attention output [Hq, t, d]. One pass per block of queries: the weights p over every
  // key (the n cached, the t new ones causally) give the output p·V; KVzip's softmax is over a
  // subset S (the first min(n_sink, begin) positions, the chunk [begin, end), the t new tokens),
  // and for a key j in S it equals p_j / sum_{i in S} p_i, so the chunk's scores come from the same
  // weights: per cached key and query head the max over every query, then the max over the KV
  // group's query heads (KVzip) or their mean (KVCompose, group_mean_).
  at::Tensor attend_and_score(int layer, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values) {
    const int64_t hq = q.size(0), t = q.size(1), d = q.size(2), hkv = keys.size(0), g = hq / hkv;
    const int64_t all = keys.size(1), n = all - t, sink = std::min(n_sink_, begin_), c = end_ - begin_;
    const bool subset_is_all = sink == begin_ && end_ == n;  // no cached key left out of KVzip's softmax
    const at::Tensor kt = keys.transpose(1, 2).contiguous();  // [Hkv, d, n+t]
    const at::Tensor q4 = q.reshape({hkv, g, t, d});
    const double scale = 1.0 / std::sqrt(double(d));
    at::Tensor out = at::empty({hkv, g, t, d}, q.options());  // [Hkv, g, t, d]
    at::Tensor best = at::zeros({hkv, g, c}, q.options());     // [Hkv, g, c]
    // Queries per block: about 4M logits (16 MB in fp32) at a time.
    const int64_t block = std::clamp<int64_t>((int64_t(1) << 22) / std::max<int64_t>(1, hq * all), 16, 256);
    const auto lopt = q.options().dtype(at::kLong);
    for (int64_t t0 = 0; t0 < t; t0 += block) {
      const int64_t tb = std::min(block, t - t0);
      const at::Tensor qb = q4.narrow(2, t0, tb).reshape({hkv, g * tb, d});                  // [Hkv, g*tb, d]
      at::Tensor logits = at::bmm(qb, kt).mul_(scale).view({hkv, g, tb, all});              // [Hkv, g, tb, n+t]
      // Query t0+j sees new token u <= t0+j.
      const at::Tensor hide = at::arange(t, lopt).unsqueeze(0) > at::arange(t0, t0 + tb, lopt).unsqueeze(1);  // [tb, t]
      logits.narrow(3, n, t).masked_fill_(hide, -std::numeric_limits<double>::infinity());
      const at::Tensor p = at::softmax(logits, -1);                                           // [Hkv, g, tb, n+t]
      out.narrow(2, t0, tb).copy_(at::bmm(p.view({hkv, g * tb, all}), values).view({hkv, g, tb, d}));
      at::Tensor chunk = p.narrow(3, begin_, c);                                              // [Hkv, g, tb, c]
      if (!subset_is_all) {
        const at::Tensor mass = p.narrow(3, 0, sink).sum(-1, true) + chunk.sum(-1, true) +
                                p.narrow(3, n, t).sum(-1, true);                              // [Hkv, g, tb, 1]
        chunk = chunk / mass;
      }
      best = at::maximum(best, std::get<0>(chunk.max(2)));  // [Hkv, g, c]
    }
    scores_[layer].narrow(1, begin_, c).copy_(group_mean_ ? best.mean(1) : std::get<0>(best.max(1)));  // [Hkv, c]
    return out.view({hq, t, d});
  }

  const std::vector<at::Tensor>& k_;
  const std::vector<at::Tensor>& v_;
  std::vector<at::Tensor>& scores_;
  int64_t n_sink_ = 0, begin_ = 0, end_ = 0;
  bool group_mean_ = false;
};

}  // namespace

at::Tensor reconstruction_scores(const Model& model, const std::vector<at::Tensor>& k,
                                 const std::vector<at::Tensor>& v, const std::vector<int64_t>& windows,
                                 const std::vector<int64_t>& prompt, const ReconstructionPrompt& rp,
                                 const ReconstructionRequest& rq) {
  c10::InferenceMode guard;
  const int64_t n_layers = model.config.n_layers, n = int64_t(prompt.size());
  const char* who = rq.repeat_context ? "kvcompose" : "kvzip";
  KVLAB_CHECK(int64_t(k.size()) == n_layers && int64_t(v.size()) == n_layers,
              "{}: the prefill holds {} layers, the model {}", who, k.size(), n_layers);
  KVLAB_CHECK(rq.n_sink >= 0, "kvzip: parameter 'n_sink' must be >= 0, got {}", rq.n_sink);
  at::Tensor all = at::zeros({n_layers, k[0].size(0), n}, k[0].options().dtype(at::kFloat));  // [L, Hkv, n]
  std::vector<at::Tensor> scores(static_cast<size_t>(n_layers));  // views of the scored layers' rows
  for (int64_t l = 0; l < n_layers; ++l) {
    KVLAB_CHECK(k[l].size(1) == n, "{}: layer {} caches {} positions, the prompt has {}", who, l, k[l].size(1), n);
    if (l < int64_t(windows.size()) && windows[l] > 0)
      all[l].fill_(std::numeric_limits<float>::quiet_NaN());
    else
      scores[l] = all[l];  // [Hkv, n]
  }
  ReconstructionAttention attn(k, v, scores, rq.repeat_context ? 0 : rq.n_sink, rq.repeat_context);
  ForwardOptions fo;
  fo.logits = false;  // only the attention of every layer is wanted
  // KVCompose: one forward of the whole context, scoring all of it, its softmax over everything.
  const std::vector<ReconstructionChunk> chunks =
      rq.repeat_context ? std::vector<ReconstructionChunk>{{0, n, prompt}} : reconstruction_chunks(prompt, rp, rq.chunk_size);
  for (const auto& c : chunks) {
    attn.set_chunk(c.begin, c.end);
    forward(model, at::tensor(c.ids, at::kLong), n, attn, fo);
  }
  return all;
}

}  // namespace kvlab
