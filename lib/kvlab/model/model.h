// The Llama-family forward pass (llama, mistral, qwen2, qwen3, phi3, gemma3, SmolLM2) in ATen, batch size 1.
//
//   x = embed(tokens)                                   [T, hidden]
//   per layer:  h = rms_norm(x) ; q,k,v = h W^T (+ b)   q [n_q_heads, T, head_dim], k/v [n_kv_heads, T, head_dim]
//               q,k = rms_norm(q) , rms_norm(k) over head_dim, per head (qwen3 only)
//               q,k = rope(q,k)  (HF rotate-half layout; rope_theta; linear / llama3 scaling)
//               tap->on_qkv(layer, q, k, v)            (post-RoPE; only the T new positions)
//               a = attn.attend(layer, q, k, v, pos0, window)  [n_q_heads, T, head_dim]  (GQA, causal;
//                   window: the layer's sliding window, 0 = none)
//               x = x + a Wo^T ;  x = x + W_down (silu(W_gate h') * W_up h'),  h' = rms_norm(x)
//   logits = rms_norm(x) W_lm^T                         [T, vocab]  (W_lm = W_embed if tied)
//
// gemma3 differs (ModelConfig's gemma fields): x = embed * sqrt(hidden); q,k RMS-normalised per head;
// the sliding layers rotate with their own base (Model::inv_freq_local); q is scaled by
// sqrt(head_dim / query_pre_attn_scalar) after RoPE; x = x + rms_norm(a Wo^T) and
// x = x + rms_norm(W_down (gelu_tanh(W_gate h') * W_up h')) (sandwich norms); RMSNorm weights carry
// their +1 and scale in float32 before the cast.
//
// Numerics follow transformers' LlamaForCausalLM: RMSNorm in float32, RoPE cos/sin computed in
// float32 (inv_freq = 1 / theta^(2i/d)), softmax in float32 for half dtypes.
// Everything runs under c10::InferenceMode on the model's device.
#pragma once

#include "kvlab/attention/backend.h"
#include "kvlab/core/device.h"
#include "kvlab/model/model_config.h"
#include "kvlab/model/stored_matrix.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvlab {

// One decoder layer. Linear weights are [out_features, in_features] as in HF; biases undefined
// when the architecture has none.
struct LayerWeights {
  at::Tensor wq;         // [n_q_heads * head_dim, hidden]
  at::Tensor wk, wv;     // [n_kv_heads * head_dim, hidden]
  at::Tensor wo;         // [hidden, n_q_heads * head_dim]
  at::Tensor bq;         // [n_q_heads * head_dim] or undefined
  at::Tensor bk, bv;     // [n_kv_heads * head_dim] or undefined
  at::Tensor bo;         // [hidden] or undefined
  at::Tensor w_gate;     // [intermediate, hidden]
  at::Tensor w_up;       // [intermediate, hidden]
  at::Tensor w_down;     // [hidden, intermediate]
  at::Tensor attn_norm;  // [hidden]
  at::Tensor ffn_norm;   // [hidden]
  at::Tensor q_norm;     // [head_dim] qwen3's per-head q RMSNorm, or undefined
  at::Tensor k_norm;     // [head_dim] qwen3's per-head k RMSNorm, or undefined
  at::Tensor attn_post_norm;  // [hidden] gemma3: norm of the attention output, or undefined
  at::Tensor ffn_post_norm;   // [hidden] gemma3: norm of the MLP output, or undefined
  // Fused projections, one GEMM each (set by the loader): wq, wk, wv are row views into wqkv and
  // w_gate, w_up into w_gate_up, so the fused weights cost no memory.
  at::Tensor wqkv;       // [(n_q_heads + 2 * n_kv_heads) * head_dim, hidden]
  at::Tensor bqkv;       // [(n_q_heads + 2 * n_kv_heads) * head_dim] or undefined
  at::Tensor w_gate_up;  // [2 * intermediate, hidden]
  // Weights as stored (ModelLoadOptions::stored_weights, issue 51): a GGUF's projections kept as
  // the file's blocks (model/stored_matrix.h) where they apply; the at::Tensor of each one held so
  // is undefined. wq_s, wk_s, wv_s are row views into wqkv_s and w_gate_s, w_up_s into w_gate_up_s
  // when the parts share a type (else the fused ones are undefined).
  StoredMatrix wq_s, wk_s, wv_s, wo_s, w_gate_s, w_up_s, w_down_s, wqkv_s, w_gate_up_s;
};

struct ModelWeights {
  at::Tensor tok_embd;               // [vocab, hidden]
  std::vector<LayerWeights> layers;  // n_layers
  at::Tensor out_norm;               // [hidden]
  at::Tensor lm_head;                // [vocab, hidden]; the same tensor as tok_embd when tied
  at::Tensor rope_freqs;             // [head_dim / 2] GGUF llama3 frequency divisors, or undefined
  // Weights as stored (see LayerWeights): the embedding and lm_head as the file's blocks (the same
  // bytes when tied); tok_embd / lm_head then undefined.
  StoredMatrix tok_embd_s, lm_head_s;
};

// A projection's fp32 matrix however it is held: w, or s decoded (criticalkv's W_o).
at::Tensor dense_weight(const at::Tensor& w, const StoredMatrix& s);

// How --model was resolved.
struct ModelSource {
  enum class Kind { hf_dir, gguf };
  Kind kind = Kind::hf_dir;
  std::string spec;            // what the user typed ("smollm2-135m", a path)
  std::string path;            // the HF directory or the .gguf file
  std::string tokenizer_path;  // the directory / file the tokenizer is loaded from
};

// A HF directory (config.json + safetensors), a .gguf file, or a name:
//   smollm2-135m -> ${KVLAB_MODELS:-<repo>/models}/smollm2-135m/*.gguf
//   stories260k  -> ${KVLAB_SHARED:-<repo>/../shared}/models/stories260K
// `flag` names the option in errors ("--model").
ModelSource resolve_model(const std::string& spec, const std::string& flag = "--model");

// "fp32"|"float32"|"fp16"|"float16"|"bf16"|"bfloat16"|"fp64"|"float64" -> dtype.
at::ScalarType parse_compute_dtype(const std::string& name, const std::string& flag = "--dtype");

struct ModelLoadOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype; weights are converted on load
  at::Device device = at::kCPU;
  // --weights stored: a GGUF's matrices kept as its blocks and multiplied as stored (issue 51;
  // model/stored_matrix.h); fp32 compute on the CPU only. false (--weights fp32): dequantized at load.
  bool stored_weights = false;
};

// "stored" | "fp32" -> ModelLoadOptions::stored_weights; the error names `flag`.
bool parse_weights_flag(const std::string& value, const std::string& flag = "--weights");

struct Model {
  std::string id;                // resolved spec, recorded in captures
  ModelSource source;
  ModelConfig config;
  ModelWeights weights;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  at::Tensor inv_freq;           // [head_dim / 2] float32 on device, scaling applied
  at::Tensor inv_freq_local;     // [head_dim / 2] gemma3's sliding layers (rope_local_theta), or undefined
  // The RoPE frequencies layer l rotates with.
  const at::Tensor& layer_inv_freq(int64_t l) const {
    return inv_freq_local.defined() && config.layer_window(l) > 0 ? inv_freq_local : inv_freq;
  }
};

Model load_model(const std::string& spec, const ModelLoadOptions& opt = {});
// The same for an already resolved source (HF directory or GGUF file).
Model load_model(const ModelSource& src, const ModelLoadOptions& opt = {});
// The pieces load_model uses, for tests and tools.
Model load_model_hf(const ModelSource& src, const ModelLoadOptions& opt);    // weights_loader.cpp
Model load_model_gguf(const ModelSource& src, const ModelLoadOptions& opt);  // weights_loader.cpp

// RoPE inverse frequencies of a model (attention/rope.h), divided by `freq_factors` ([head_dim / 2],
// GGUF rope_freqs) when defined.
at::Tensor rope_inv_freq(const ModelConfig& cfg, const at::Tensor& freq_factors = {});

// Receives post-RoPE q/k/v of the positions just computed, layer by layer, as they are produced.
struct QkvTap {
  virtual ~QkvTap() = default;
  virtual bool wants(int layer) const { return true; }
  virtual void on_qkv(int layer, const at::Tensor& q,   // [n_q_heads,  T, head_dim] post-RoPE
                      const at::Tensor& k,              // [n_kv_heads, T, head_dim] post-RoPE
                      const at::Tensor& v) = 0;         // [n_kv_heads, T, head_dim]
};

struct ForwardOptions {
  QkvTap* tap = nullptr;
  bool all_logits = false;  // false: logits of the last position only
  bool logits = true;       // false: skip the final norm and lm_head (dump needs only the taps)
  bool fused = true;        // false: separate q/k/v and gate/up GEMMs (the fused path's reference)
};

// tokens int64 [T] at positions pos0 .. pos0+T-1 (the backend must hold exactly pos0 earlier
// positions). Returns logits [T or 1, vocab] in float32 (float64 when the model is double),
// or an undefined tensor when opt.logits is false.
at::Tensor forward(const Model& model, const at::Tensor& tokens, int64_t pos0,
                   AttentionBackend& attn, const ForwardOptions& opt = {});

// B sequences at once (issue 25): tokens int64 [B, T], every sequence at positions pos0 ..
// pos0+T-1, sequence b attending through attns[b] (each holding exactly pos0 earlier positions of
// its own). The dense parts (projections, norms, MLP, lm_head) run once over the B*T rows, one GEMM
// each instead of B; attention runs per sequence over its own cache. Returns logits [B, vocab]
// (the last position of each; [B*T, vocab] with opt.all_logits). opt.tap must be null.
// forward() is this with B = 1.
at::Tensor forward_batch(const Model& model, const at::Tensor& tokens, int64_t pos0,
                         const std::vector<AttentionBackend*>& attns, const ForwardOptions& opt = {});

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  bool stop_at_eos = true;
  // Called after each forward with the logits [vocab] that chose the next token.
  std::function<void(int64_t step, const at::Tensor& logits)> on_logits;
  // Called with each new token id (for streaming output).
  std::function<void(int64_t id)> on_token;
};

// Greedy decoding: one prefill over `prompt`, then one-token decode steps with the cache.
// Returns only the new ids.
std::vector<int64_t> generate_greedy(const Model& model, const std::vector<int64_t>& prompt,
                                     AttentionBackend& attn, const GenerateOptions& opt = {});

// The greedy choice from logits [vocab], refusing non-finite logits (issue 50: argmax over NaN
// picked a token and a run printed <unk>... with exit 0). `who` names the run in the error
// ("generate", a method's label); step: the decoded token's index.
int64_t greedy_choice(const at::Tensor& logits, int64_t step, const std::string& who);

// Number of parameters (for logs).
int64_t n_parameters(const Model& model);

// The model's identity as 16 hex digits: its resolved id, its config (a frozen list of fields) and
// its parameter count. Predictions (tasks/task_runner.h) and calibration files (kvlab calibrate)
// record it, so that what was made with one model is not taken for another's.
std::string model_key(const Model& model);

}  // namespace kvlab
