// Hyperparameters of a Llama-family model (llama, mistral, qwen2, qwen3, phi3, gemma3; SmolLM2 is a
// llama), read from a
// Hugging Face `config.json` or from GGUF metadata (`<arch>.*` keys). Names follow the kvlab
// vocabulary: n_layers, n_q_heads, n_kv_heads, head_dim.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/attention/rope.h"

namespace kvlab {

struct ModelConfig {
  std::string architecture;        // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_q_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;            // explicit in the config or hidden_size / n_q_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;           // q/k/v projections carry a bias (qwen2; llama attention_bias)
  bool o_bias = false;             // o_proj carries a bias (llama, qwen3 attention_bias)
  bool qk_norm = false;            // q and k RMS-normalised per head before RoPE (qwen3)
  // Sliding-window attention (mistral; qwen2 with use_sliding_window): a query at position p sees
  // the keys at positions (p - sliding_window, p], as transformers' sliding-window mask. 0 = none.
  int64_t sliding_window = 0;
  int64_t window_from_layer = 0;   // layers l >= this slide (qwen2's max_window_layers); others see all
  // Per layer, whether it slides (gemma3's layer_types: five sliding layers, then a global one);
  // empty = window_from_layer decides. Set only for interleaved patterns.
  std::vector<bool> sliding_layers;
  // gemma3: the sliding layers' RoPE base (rope_local_base_freq; no scaling there). 0 = rope_theta.
  double rope_local_theta = 0.0;
  // gemma3: attention logits are scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2.
  // 0 = head_dim. The forward folds sqrt(head_dim / query_pre_attn_scalar) into q after RoPE, so
  // softmax(q k^T / sqrt(head_dim)) is the model's attention everywhere kvlab attends.
  double query_pre_attn_scalar = 0.0;
  // gemma3 ("Gemma-style" layers): embeddings times sqrt(hidden_size); RMSNorm weights are
  // offsets from 1 (stored here with the 1 added) and applied in float32 before the cast;
  // post-attention and post-feed-forward norms; gelu (tanh approximation) gating.
  bool embed_scaled = false;
  bool sandwich_norms = false;
  bool float_norm_scale = false;    // norm weights kept in float32 and applied before the cast
  std::string hidden_act = "silu";  // "silu" or "gelu_tanh"
  int64_t bos_token_id = -1;       // -1 = none
  std::vector<int64_t> eos_token_ids;

  int64_t group_size() const { return n_q_heads / n_kv_heads; }  // query heads per KV head
  // The attention window of layer l: sliding_window on a sliding layer, else 0 (full attention).
  int64_t layer_window(int64_t l) const {
    if (!sliding_layers.empty()) return sliding_layers.at(static_cast<size_t>(l)) ? sliding_window : 0;
    return l >= window_from_layer ? sliding_window : 0;
  }
  // Whether some layers slide and others attend globally (gemma3; qwen2 with max_window_layers):
  // such a model's sliding layers are held as exact windows, never compressed.
  bool interleaved_windows() const;
  // The window of layer l when it is held as an exact window (a sliding layer of an interleaved
  // model), else 0 (a layer methods compress).
  int64_t held_window(int64_t l) const { return interleaved_windows() ? layer_window(l) : 0; }
  // The factor the forward multiplies q by (1 unless query_pre_attn_scalar is set).
  double query_scale() const;
  // Throws kvlab::Error naming `source` if a field is missing or inconsistent.
  void validate(const std::string& source) const;
  nlohmann::json to_json() const;
};

// Architectures the forward pass supports, for error messages.
const std::vector<std::string>& supported_architectures();

// From a parsed HF config.json; `source` (the file path) goes into error messages.
ModelConfig model_config_from_hf(const nlohmann::json& cfg, const std::string& source);
ModelConfig load_hf_config(const std::string& config_json_path);

// From GGUF metadata given as a JSON object key -> value (scalars and strings; arrays may be left
// out). `n_vocab_fallback` is used when `<arch>.vocab_size` is absent (token_embd rows).
ModelConfig model_config_from_gguf(const nlohmann::json& metadata, const std::string& source,
                                   int64_t n_vocab_fallback = 0);

}  // namespace kvlab
