// Llama-family forward pass and greedy generation (the exact KV cache is attention/exact_cache).
#include "kvlab/model/model.h"

#include "kvlab/core/check.h"
#include "kvlab/core/sha256.h"
#include "kvlab/model/few_rows.h"

#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>
#include <tuple>

namespace kvlab {

namespace {

bool is_reduced(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// HF LlamaRMSNorm: normalise in float32 (or wider), then cast back and scale by the weight.
// A float32 weight on a reduced-precision x (gemma3's float_norm_scale) scales before the cast, as
// Gemma3RMSNorm does.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  // x [..., width], w [width]
  at::Tensor xf = is_reduced(x.scalar_type()) ? x.to(at::kFloat) : x;
  at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);  // [T, 1]
  at::Tensor y = xf * at::rsqrt(var + eps);
  if (w.scalar_type() != x.scalar_type()) return (y * w).to(x.scalar_type());
  return w * y.to(x.scalar_type());
}

// The MLP's gate activation: silu, or gelu with the tanh approximation (gemma3).
at::Tensor activate(const at::Tensor& g, bool gelu) { return gelu ? at::gelu(g, "tanh") : at::silu(g); }

// x [T, in], w [out, in], b [out] or undefined -> [T, out]. One row (a decode step) goes through
// a matrix-vector product: as a GEMM with M = 1, OpenBLAS packs the whole weight matrix on every
// call (62% of decode time in sgemm_incopy), where GEMV reads it once. A few rows (batched
// decoding, issue 25) go through few_rows_linear, one pass over the weights (model/few_rows.h);
// in another dtype, through W xᵀ: with the weight as the GEMM's tall left operand OpenBLAS ran the
// layers' matrices (576-3072 rows, SmolLM2) 1.5-1.8x faster than x Wᵀ at 4-20 rows (2 threads);
// for the 49k-row lm_head x Wᵀ stays faster, so it keeps it.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {}) {
  if (x.size(0) == 1 && x.device().is_cpu()) {
    at::Tensor y = at::mv(w, x.select(0, 0));  // [out]
    if (b.defined()) y.add_(b);
    return y.unsqueeze(0);                      // [1, out]
  }
  if (few_rows_applies(x, w, b)) return few_rows_linear(x, w, b);  // [rows, out]
  if (x.size(0) <= 32 && w.size(0) <= 16384 && x.device().is_cpu()) {
    at::Tensor y = at::mm(w, x.t()).t();  // [rows, out]
    return b.defined() ? y + b : y.contiguous();
  }
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

// The same for a projection held as stored (LayerWeights' *_s) when s is defined: up to
// kStoredRowsMax rows (decoding, batched branches) through stored_linear, one block decoded at a
// time; more (a prefill) through the matrix decoded once for the call and a GEMM.
constexpr int64_t kStoredRowsMax = 64;
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const StoredMatrix& s) {
  if (!s.defined()) return project(x, w, b);
  at::Tensor y = x.size(0) <= kStoredRowsMax ? stored_linear(x, s) : project(x, s.dequantize());  // [rows, out]
  return b.defined() ? y.add_(b) : y;
}

}  // namespace

at::Tensor dense_weight(const at::Tensor& w, const StoredMatrix& s) { return s.defined() ? s.dequantize() : w; }

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// The forward pass of B sequences of T new tokens each, all at positions pos0 .. pos0+T-1, each
// attending through its own backend. The dense parts (embedding, projections, norms, MLP, lm_head)
// run once over the B*T rows; attention runs per sequence. ids [B*T] int64, sequence-major.
// Returns logits [B*T or B, vocab] (the last position of each sequence unless opt.all_logits).
at::Tensor forward_rows(const Model& model, const at::Tensor& ids, int64_t B, int64_t T, int64_t pos0,
                        const std::vector<AttentionBackend*>& attns, const ForwardOptions& opt) {
  const ModelConfig& cfg = model.config;
  const int64_t Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads, d = cfg.head_dim, N = B * T;
  {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    KVLAB_CHECK(lo >= 0 && hi < cfg.vocab_size, "token ids must be in [0, {}), found [{}, {}]",
                cfg.vocab_size, lo, hi);
  }
  auto [cos, sin] = rope_cos_sin(model.inv_freq, pos0, T, model.dtype);  // [T, d] each
  at::Tensor cos_local, sin_local;                                       // [T, d] gemma3's sliding layers
  if (model.inv_freq_local.defined())
    std::tie(cos_local, sin_local) = rope_cos_sin(model.inv_freq_local, pos0, T, model.dtype);
  const StoredMatrix& embd_s = model.weights.tok_embd_s;
  at::Tensor x = embd_s.defined() ? embd_s.take_rows(ids).dequantize()                 // [N, hidden]
                                  : at::embedding(model.weights.tok_embd, ids);
  if (cfg.embed_scaled)  // sqrt(hidden) rounded to float32, then to the model's dtype (as transformers)
    x = x * at::scalar_tensor(std::sqrt(double(cfg.hidden_size)), at::kFloat).to(x.scalar_type());
  const double q_scale = cfg.query_scale();
  const bool gelu = cfg.hidden_act == "gelu_tanh";

  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& w = model.weights.layers[l];
    at::Tensor h = rms_norm(x, w.attn_norm, cfg.rms_norm_eps);               // [N, hidden]
    at::Tensor q, k, v;
    if (opt.fused && (w.wqkv.defined() || w.wqkv_s.defined())) {
      at::Tensor qkv = project(h, w.wqkv, w.bqkv, w.wqkv_s);                  // [N, (Hq+2Hkv)*d]
      q = qkv.narrow(1, 0, Hq * d).view({B, T, Hq, d}).transpose(1, 2);          // [B, Hq, T, d]
      k = qkv.narrow(1, Hq * d, Hkv * d).view({B, T, Hkv, d}).transpose(1, 2);   // [B, Hkv, T, d]
      v = qkv.narrow(1, (Hq + Hkv) * d, Hkv * d).view({B, T, Hkv, d}).transpose(1, 2);
    } else {
      q = project(h, w.wq, w.bq, w.wq_s).view({B, T, Hq, d}).transpose(1, 2);    // [B, Hq, T, d]
      k = project(h, w.wk, w.bk, w.wk_s).view({B, T, Hkv, d}).transpose(1, 2);   // [B, Hkv, T, d]
      v = project(h, w.wv, w.bv, w.wv_s).view({B, T, Hkv, d}).transpose(1, 2);   // [B, Hkv, T, d]
    }
    if (w.q_norm.defined()) {  // qwen3, gemma3: RMSNorm over head_dim, each head and position
      q = rms_norm(q, w.q_norm, cfg.rms_norm_eps);  // [B, Hq, T, d]
      k = rms_norm(k, w.k_norm, cfg.rms_norm_eps);  // [B, Hkv, T, d]
    }
    const bool local = cos_local.defined() && cfg.layer_window(l) > 0;
    q = apply_rope(q, local ? cos_local : cos, local ? sin_local : sin);  // [B, Hq, T, d] contiguous
    k = apply_rope(k, local ? cos_local : cos, local ? sin_local : sin);  // [B, Hkv, T, d] contiguous
    if (q_scale != 1.0) q.mul_(q_scale);  // gemma3's query_pre_attn_scalar, folded into q
    const int layer = static_cast<int>(l);
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor qb = q.select(0, b), kb = k.select(0, b), vb = v.select(0, b).contiguous();  // [H, T, d]
      if (opt.tap && opt.tap->wants(layer)) opt.tap->on_qkv(layer, qb, kb, vb);
      at::Tensor a = attns[b]->attend(layer, qb, kb, vb, pos0, cfg.layer_window(l));  // [Hq, T, d]
      outs.push_back(a.transpose(0, 1).reshape({T, Hq * d}));                      // [T, Hq*d]
    }
    at::Tensor a = B == 1 ? outs[0] : at::cat(outs, 0);              // [N, Hq*d]
    at::Tensor o = project(a, w.wo, w.bo, w.wo_s);                  // [N, hidden]
    if (w.attn_post_norm.defined()) o = rms_norm(o, w.attn_post_norm, cfg.rms_norm_eps);
    x = x + o;                                                      // [N, hidden]
    at::Tensor h2 = rms_norm(x, w.ffn_norm, cfg.rms_norm_eps);     // [N, hidden]
    at::Tensor g;                                                  // [N, inter]
    if (opt.fused && (w.w_gate_up.defined() || w.w_gate_up_s.defined())) {
      at::Tensor gu = project(h2, w.w_gate_up, {}, w.w_gate_up_s);  // [N, 2*inter]
      const int64_t inter = gu.size(1) / 2;
      g = activate(gu.narrow(1, 0, inter), gelu).mul_(gu.narrow(1, inter, inter));
    } else {
      g = activate(project(h2, w.w_gate, {}, w.w_gate_s), gelu) * project(h2, w.w_up, {}, w.w_up_s);
    }
    at::Tensor m = project(g, w.w_down, {}, w.w_down_s);        // [N, hidden]
    if (w.ffn_post_norm.defined()) m = rms_norm(m, w.ffn_post_norm, cfg.rms_norm_eps);
    x = x + m;                                                  // [N, hidden]
  }
  if (!opt.logits) return at::Tensor();
  if (!opt.all_logits) x = x.view({B, T, x.size(1)}).select(1, T - 1);  // [B, hidden]
  x = rms_norm(x, model.weights.out_norm, cfg.rms_norm_eps);
  at::Tensor logits = project(x, model.weights.lm_head, {}, model.weights.lm_head_s);  // [B*T or B, vocab]
  return model.dtype == at::kDouble ? logits : logits.to(at::kFloat);
}

}  // namespace

at::Tensor forward(const Model& model, const at::Tensor& tokens, int64_t pos0,
                   AttentionBackend& attn, const ForwardOptions& opt) {
  c10::InferenceMode guard;
  KVLAB_CHECK(tokens.dim() == 1 && tokens.numel() > 0, "forward: tokens must be a non-empty 1-D "
              "tensor, found shape {}", tokens.sizes().vec());
  return forward_rows(model, tokens.to(model.device, at::kLong), 1, tokens.numel(), pos0, {&attn}, opt);
}

at::Tensor forward_batch(const Model& model, const at::Tensor& tokens, int64_t pos0,
                         const std::vector<AttentionBackend*>& attns, const ForwardOptions& opt) {
  c10::InferenceMode guard;
  KVLAB_CHECK(tokens.dim() == 2 && tokens.size(0) > 0 && tokens.size(1) > 0,
              "forward_batch: tokens must be [B, T] with B, T > 0, found shape {}", tokens.sizes().vec());
  KVLAB_CHECK(static_cast<int64_t>(attns.size()) == tokens.size(0),
              "forward_batch: {} attention backends for {} sequences", attns.size(), tokens.size(0));
  KVLAB_CHECK(opt.tap == nullptr, "forward_batch: a q/k/v tap sees one sequence; use forward()");
  for (const AttentionBackend* a : attns) KVLAB_CHECK(a != nullptr, "forward_batch: a null attention backend");
  at::Tensor ids = tokens.to(model.device, at::kLong).contiguous().view({-1});  // [B*T]
  return forward_rows(model, ids, tokens.size(0), tokens.size(1), pos0, attns, opt);
}

int64_t greedy_choice(const at::Tensor& logits, int64_t step, const std::string& who) {
  const at::Tensor finite = at::isfinite(logits);  // [vocab]
  if (!finite.all().item<bool>()) {
    const int64_t bad = logits.numel() - finite.sum().item<int64_t>();
    KVLAB_FAIL("{}: the logits of decoded token {} are not finite ({} of {} values): the forward pass "
               "overflowed (a weight, a config value or a compressed cache out of range)",
               who, step, bad, logits.numel());
  }
  return logits.argmax().item<int64_t>();
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
    const int64_t next = greedy_choice(logits, step, "generate");
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
  // The same count however the weights are held (--weights stored or fp32).
  auto count = [](const at::Tensor& t, const StoredMatrix& s) {
    return t.defined() ? t.numel() : s.defined() ? s.rows * s.cols : int64_t(0);
  };
  int64_t n = count(w.tok_embd, w.tok_embd_s) + w.out_norm.numel();
  const bool tied = w.lm_head.defined() ? w.lm_head.is_same(w.tok_embd) : w.lm_head_s.data.is_same(w.tok_embd_s.data);
  if (!tied) n += count(w.lm_head, w.lm_head_s);
  for (const auto& l : w.layers) {
    for (const at::Tensor* t : {&l.bq, &l.bk, &l.bv, &l.bo, &l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm,
                                &l.attn_post_norm, &l.ffn_post_norm})
      if (t->defined()) n += t->numel();
    n += count(l.wq, l.wq_s) + count(l.wk, l.wk_s) + count(l.wv, l.wv_s) + count(l.wo, l.wo_s) +
         count(l.w_gate, l.w_gate_s) + count(l.w_up, l.w_up_s) + count(l.w_down, l.w_down_s);
  }
  return n;
}

// The model a prediction was made with: its resolved id, its config and its parameter count. A
// separate field from input_key, so that predictions made before it existed keep their keys.
// The config's fields are a frozen list: a field added to ModelConfig::to_json later must not
// change every key and send resumed runs (hours of shards) back to the start.
std::string model_key(const Model& model) {
  static const char* const kFields[] = {
      "architecture", "hidden_size", "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "intermediate_size",
      "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
      "tie_word_embeddings", "qkv_bias", "o_bias", "sliding_window", "bos_token_id", "eos_token_ids",
      "window_from_layer", "qk_norm"};
  const nlohmann::json all = model.config.to_json();
  nlohmann::json cfg = nlohmann::json::object();
  for (const char* f : kFields)
    if (all.contains(f)) cfg[f] = all[f];
  const nlohmann::json j = {{"id", model.id}, {"config", cfg}, {"parameters", n_parameters(model)}};
  return sha256_hex(j.dump()).substr(0, 16);
}

}  // namespace kvlab
