// One table of tensor names for both weight formats (as llama.cpp keeps one): each role of a
// Llama-family checkpoint, its Hugging Face safetensors name and its GGUF (llama.cpp) name.
// "{}" in a name stands for the layer index.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/model/model.h"

namespace kvlab {

enum class WeightFormat { hf, gguf };

enum class TensorRole {
  // whole model
  tok_embd, out_norm, lm_head, rope_freqs,
  // per layer
  attn_q, attn_k, attn_v, attn_o, bias_q, bias_k, bias_v, bias_o,
  ffn_gate, ffn_up, ffn_down, attn_norm, ffn_norm, attn_q_norm, attn_k_norm,
  attn_post_norm, ffn_post_norm,  // gemma3's sandwich norms
};

struct TensorNameRow {
  TensorRole role;
  const char* hf;    // "" = the format has no such tensor
  const char* gguf;
};

// Every row, whole-model roles first, then the per-layer roles in load order.
const std::vector<TensorNameRow>& tensor_name_table();
// The per-layer roles, in load order.
std::vector<TensorRole> layer_roles();

// The name of `role` in `format`, with the layer index filled in for per-layer roles.
std::string tensor_name(WeightFormat format, TensorRole role, int64_t layer = -1);
// The same for a model of config `c`: gemma3's HF checkpoints name the pre-feed-forward norm
// pre_feedforward_layernorm (their post_attention_layernorm is the attention's output norm).
std::string tensor_name(WeightFormat format, TensorRole role, int64_t layer, const ModelConfig& c);

// Whether a model of config `c` has this per-layer tensor (biases only where the config says so).
bool layer_role_present(TensorRole role, const ModelConfig& c);
// The LayerWeights field a per-layer role fills.
at::Tensor& layer_slot(LayerWeights& l, TensorRole role);
// The field a projection role fills when held as stored (--weights stored): attn_q/k/v/o, ffn_gate/up/down.
StoredMatrix& stored_slot(LayerWeights& l, TensorRole role);

}  // namespace kvlab
