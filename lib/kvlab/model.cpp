// Llama-family forward pass, exact attention with a KV cache, greedy generation.
#include "kvlab/model.h"

#include "kvlab/check.h"

#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>

namespace kvlab {

namespace {

bool is_reduced(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// HF LlamaRMSNorm: normalise in float32 (or wider), then cast back and scale by the weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  // x [T, hidden], w [hidden]
  at::Tensor xf = is_reduced(x.scalar_type()) ? x.to(at::kFloat) : x;
  at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);  // [T, 1]
  at::Tensor y = xf * at::rsqrt(var + eps);
  return w * y.to(x.scalar_type());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Attention

at::Tensor causal_gqa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t pos0, int64_t query_block) {
  TORCH_INTERNAL_ASSERT(q.dim() == 3 && k.dim() == 3 && v.dim() == 3);
  const int64_t n_q_heads = q.size(0), T = q.size(1), d = q.size(2);
  const int64_t n_kv_heads = k.size(0), n = k.size(1);
  TORCH_INTERNAL_ASSERT(n_q_heads % n_kv_heads == 0 && n >= pos0 + T, "n_q_heads=", n_q_heads,
                        " n_kv_heads=", n_kv_heads, " n=", n, " pos0=", pos0, " T=", T);
  const int64_t G = n_q_heads / n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool reduced = is_reduced(q.scalar_type());
  if (query_block <= 0) query_block = T;

  at::Tensor q4 = q.view({n_kv_heads, G, T, d});        // [Hkv, G, T, d]
  at::Tensor out = at::empty({n_kv_heads, G, T, d}, q.options());
  // One score buffer for every block (sized for the largest), reused in place: fewer passes over
  // memory and no large allocation per block.
  const int64_t max_bl = std::min(query_block, T);
  at::Tensor s_buf = at::empty({n_kv_heads * G * max_bl * (pos0 + T)}, q.options());
  for (int64_t b0 = 0; b0 < T; b0 += query_block) {
    const int64_t bl = std::min(query_block, T - b0);
    const int64_t nk = pos0 + b0 + bl;  // keys visible to the last query of the block
    // Scaling q (small) instead of the scores saves a pass; exact when head_dim is a power of 4.
    at::Tensor qb = (q4.narrow(2, b0, bl) * scale).reshape({n_kv_heads, G * bl, d});  // [Hkv, G*bl, d]
    at::Tensor kb = k.narrow(1, 0, nk);                                        // [Hkv, nk, d]
    at::Tensor vb = v.narrow(1, 0, nk);                                        // [Hkv, nk, d]
    at::Tensor s = s_buf.narrow(0, 0, n_kv_heads * G * bl * nk).view({n_kv_heads, G * bl, nk});
    at::bmm_out(s, qb, kb.transpose(1, 2));  // [Hkv, G*bl, nk]  (baddbmm_out with beta=0 let
                                             // NaNs of the uninitialised buffer through in bf16)
    if (nk > pos0 + b0 + 1) {
      // query i (position pos0+b0+i) sees keys j <= pos0+b0+i.
      at::Tensor qi = at::arange(bl, q.options().dtype(at::kLong)).unsqueeze(1);   // [bl, 1]
      at::Tensor kj = at::arange(nk, q.options().dtype(at::kLong)).unsqueeze(0);   // [1, nk]
      at::Tensor mask = kj > (qi + (pos0 + b0));                                  // [bl, nk]
      s.view({n_kv_heads, G, bl, nk})
          .masked_fill_(mask, -std::numeric_limits<double>::infinity());
    }
    at::Tensor p;                                                                // [Hkv, G*bl, nk]
    if (reduced) {
      p = at::softmax(s, -1, at::kFloat).to(q.scalar_type());
    } else {
      p = at::softmax_out(s, s, -1);  // in place
    }
    at::Tensor ob = at::bmm(p, vb);                                              // [Hkv, G*bl, d]
    out.narrow(2, b0, bl).copy_(ob.view({n_kv_heads, G, bl, d}));
  }
  return out.view({n_q_heads, T, d});
}

ExactAttention::ExactAttention(int64_t n_layers, int64_t query_block)
    : cache_(static_cast<size_t>(n_layers)), query_block_(query_block) {}

at::Tensor ExactAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                  const at::Tensor& v_new, int64_t pos0) {
  TORCH_INTERNAL_ASSERT(layer >= 0 && layer < static_cast<int>(cache_.size()));
  LayerCache& c = cache_[layer];
  KVLAB_CHECK(pos0 == c.n, "ExactAttention: layer {} holds {} positions but the forward starts at "
              "position {} (reset() before a new sequence)", layer, c.n, pos0);
  const int64_t T = k_new.size(1);
  const int64_t need = c.n + T;
  if (!c.k.defined() || c.k.size(1) < need) {
    int64_t cap = c.k.defined() ? c.k.size(1) : 0;
    cap = std::max<int64_t>(need, std::max<int64_t>(2 * cap, 64));
    // [Hkv, cap, d]
    at::Tensor k2 = at::empty({k_new.size(0), cap, k_new.size(2)}, k_new.options());
    at::Tensor v2 = at::empty({v_new.size(0), cap, v_new.size(2)}, v_new.options());
    if (c.n > 0) {
      k2.narrow(1, 0, c.n).copy_(c.k.narrow(1, 0, c.n));
      v2.narrow(1, 0, c.n).copy_(c.v.narrow(1, 0, c.n));
    }
    c.k = k2;
    c.v = v2;
  }
  c.k.narrow(1, c.n, T).copy_(k_new);
  c.v.narrow(1, c.n, T).copy_(v_new);
  c.n = need;
  return causal_gqa_attention(q, c.k.narrow(1, 0, c.n), c.v.narrow(1, 0, c.n), pos0, query_block_);
}

void ExactAttention::reset() {
  for (auto& c : cache_) c = LayerCache{};
}

int64_t ExactAttention::n_cached(int layer) const { return cache_.at(layer).n; }
at::Tensor ExactAttention::keys(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.k.narrow(1, 0, c.n) : at::Tensor();
}
at::Tensor ExactAttention::values(int layer) const {
  const auto& c = cache_.at(layer);
  return c.n ? c.v.narrow(1, 0, c.n) : at::Tensor();
}

// ---------------------------------------------------------------------------------------------
// Forward

at::Tensor forward(const Model& model, const at::Tensor& tokens, int64_t pos0,
                   AttentionBackend& attn, const ForwardOptions& opt) {
  c10::InferenceMode guard;
  const ModelConfig& cfg = model.config;
  KVLAB_CHECK(tokens.dim() == 1 && tokens.numel() > 0, "forward: tokens must be a non-empty 1-D "
              "tensor, found shape {}", tokens.sizes().vec());
  const int64_t T = tokens.numel();
  const int64_t Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads, d = cfg.head_dim;
  at::Tensor ids = tokens.to(model.device, at::kLong);  // [T]
  {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    KVLAB_CHECK(lo >= 0 && hi < cfg.vocab_size, "token ids must be in [0, {}), found [{}, {}]",
                cfg.vocab_size, lo, hi);
  }
  auto [cos, sin] = rope_cos_sin(model.inv_freq, pos0, T, model.dtype);  // [T, d] each
  at::Tensor x = at::embedding(model.weights.tok_embd, ids);             // [T, hidden]

  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& w = model.weights.layers[l];
    at::Tensor h = rms_norm(x, w.attn_norm, cfg.rms_norm_eps);               // [T, hidden]
    at::Tensor q = linear(h, w.wq, w.bq).view({T, Hq, d}).transpose(0, 1);   // [Hq, T, d]
    at::Tensor k = linear(h, w.wk, w.bk).view({T, Hkv, d}).transpose(0, 1);  // [Hkv, T, d]
    at::Tensor v = linear(h, w.wv, w.bv).view({T, Hkv, d}).transpose(0, 1);  // [Hkv, T, d]
    q = apply_rope(q, cos, sin);  // [Hq, T, d] contiguous
    k = apply_rope(k, cos, sin);  // [Hkv, T, d] contiguous
    v = v.contiguous();
    const int layer = static_cast<int>(l);
    if (opt.tap && opt.tap->wants(layer)) opt.tap->on_qkv(layer, q, k, v);
    at::Tensor a = attn.attend(layer, q, k, v, pos0);              // [Hq, T, d]
    a = a.transpose(0, 1).reshape({T, Hq * d});                    // [T, Hq*d]
    x = x + linear(a, w.wo, w.bo);                                 // [T, hidden]
    at::Tensor h2 = rms_norm(x, w.ffn_norm, cfg.rms_norm_eps);     // [T, hidden]
    at::Tensor g = at::silu(at::linear(h2, w.w_gate)) * at::linear(h2, w.w_up);  // [T, inter]
    x = x + at::linear(g, w.w_down);                               // [T, hidden]
  }
  if (!opt.logits) return at::Tensor();
  if (!opt.all_logits) x = x.narrow(0, T - 1, 1);                  // [1, hidden]
  x = rms_norm(x, model.weights.out_norm, cfg.rms_norm_eps);
  at::Tensor logits = at::linear(x, model.weights.lm_head);         // [T or 1, vocab]
  return model.dtype == at::kDouble ? logits : logits.to(at::kFloat);
}

std::vector<int64_t> generate_greedy(const Model& model, const std::vector<int64_t>& prompt,
                                     AttentionBackend& attn, const GenerateOptions& opt) {
  c10::InferenceMode guard;
  KVLAB_CHECK(!prompt.empty(), "generate: the prompt has no tokens (give --prompt or --prompt-ids)");
  attn.reset();
  std::vector<int64_t> out;
  at::Tensor tokens = at::tensor(prompt, at::kLong);  // [T]
  int64_t pos = 0;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    at::Tensor logits = forward(model, tokens, pos, attn).select(0, 0);  // [vocab]
    pos += tokens.numel();
    if (opt.on_logits) opt.on_logits(step, logits);
    const int64_t next = logits.argmax().item<int64_t>();
    out.push_back(next);
    if (opt.on_token) opt.on_token(next);
    const auto& eos = model.config.eos_token_ids;
    if (opt.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    tokens = at::tensor(std::vector<int64_t>{next}, at::kLong);  // [1]
  }
  return out;
}

int64_t n_parameters(const Model& model) {
  const ModelWeights& w = model.weights;
  int64_t n = w.tok_embd.numel() + w.out_norm.numel();
  if (!w.lm_head.is_same(w.tok_embd)) n += w.lm_head.numel();
  for (const auto& l : w.layers)
    for (const at::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.w_gate,
                                &l.w_up, &l.w_down, &l.attn_norm, &l.ffn_norm})
      if (t->defined()) n += t->numel();
  return n;
}

}  // namespace kvlab
