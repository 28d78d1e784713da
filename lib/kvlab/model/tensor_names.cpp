#include "kvlab/model/tensor_names.h"

#include <fmt/format.h>

#include "kvlab/core/check.h"

namespace kvlab {

const std::vector<TensorNameRow>& tensor_name_table() {
  using R = TensorRole;
  // clang-format off
  static const std::vector<TensorNameRow> t = {
      {R::tok_embd,   "model.embed_tokens.weight",                     "token_embd.weight"},
      {R::out_norm,   "model.norm.weight",                             "output_norm.weight"},
      {R::lm_head,    "lm_head.weight",                                "output.weight"},
      {R::rope_freqs, "",                                              "rope_freqs.weight"},
      {R::attn_q,     "model.layers.{}.self_attn.q_proj.weight",       "blk.{}.attn_q.weight"},
      {R::attn_k,     "model.layers.{}.self_attn.k_proj.weight",       "blk.{}.attn_k.weight"},
      {R::attn_v,     "model.layers.{}.self_attn.v_proj.weight",       "blk.{}.attn_v.weight"},
      {R::attn_o,     "model.layers.{}.self_attn.o_proj.weight",       "blk.{}.attn_output.weight"},
      {R::bias_q,     "model.layers.{}.self_attn.q_proj.bias",         "blk.{}.attn_q.bias"},
      {R::bias_k,     "model.layers.{}.self_attn.k_proj.bias",         "blk.{}.attn_k.bias"},
      {R::bias_v,     "model.layers.{}.self_attn.v_proj.bias",         "blk.{}.attn_v.bias"},
      {R::bias_o,     "model.layers.{}.self_attn.o_proj.bias",         "blk.{}.attn_output.bias"},
      {R::ffn_gate,   "model.layers.{}.mlp.gate_proj.weight",          "blk.{}.ffn_gate.weight"},
      {R::ffn_up,     "model.layers.{}.mlp.up_proj.weight",            "blk.{}.ffn_up.weight"},
      {R::ffn_down,   "model.layers.{}.mlp.down_proj.weight",          "blk.{}.ffn_down.weight"},
      {R::attn_norm,  "model.layers.{}.input_layernorm.weight",        "blk.{}.attn_norm.weight"},
      {R::ffn_norm,   "model.layers.{}.post_attention_layernorm.weight", "blk.{}.ffn_norm.weight"},
      {R::attn_q_norm, "model.layers.{}.self_attn.q_norm.weight",      "blk.{}.attn_q_norm.weight"},
      {R::attn_k_norm, "model.layers.{}.self_attn.k_norm.weight",      "blk.{}.attn_k_norm.weight"},
      {R::attn_post_norm, "model.layers.{}.post_attention_layernorm.weight", "blk.{}.post_attention_norm.weight"},
      {R::ffn_post_norm, "model.layers.{}.post_feedforward_layernorm.weight", "blk.{}.post_ffw_norm.weight"},
  };
  // clang-format on
  return t;
}

std::vector<TensorRole> layer_roles() {
  std::vector<TensorRole> out;
  for (const auto& row : tensor_name_table())
    if (row.role >= TensorRole::attn_q) out.push_back(row.role);
  return out;
}

std::string tensor_name(WeightFormat format, TensorRole role, int64_t layer) {
  for (const auto& row : tensor_name_table()) {
    if (row.role != role) continue;
    const std::string pattern = format == WeightFormat::hf ? row.hf : row.gguf;
    KVLAB_CHECK(!pattern.empty(), "tensor role {} has no name in this weight format", int(role));
    if (pattern.find("{}") == std::string::npos) return pattern;
    KVLAB_CHECK(layer >= 0, "tensor '{}' needs a layer index", pattern);
    return fmt::format(fmt::runtime(pattern), layer);
  }
  KVLAB_FAIL("tensor role {} is not in the name table", int(role));
}

std::string tensor_name(WeightFormat format, TensorRole role, int64_t layer, const ModelConfig& c) {
  if (c.sandwich_norms && format == WeightFormat::hf && role == TensorRole::ffn_norm)
    return fmt::format("model.layers.{}.pre_feedforward_layernorm.weight", layer);
  return tensor_name(format, role, layer);
}

bool layer_role_present(TensorRole role, const ModelConfig& c) {
  switch (role) {
    case TensorRole::bias_q:
    case TensorRole::bias_k:
    case TensorRole::bias_v: return c.qkv_bias;
    case TensorRole::bias_o: return c.o_bias;
    case TensorRole::attn_q_norm:
    case TensorRole::attn_k_norm: return c.qk_norm;
    case TensorRole::attn_post_norm:
    case TensorRole::ffn_post_norm: return c.sandwich_norms;
    default: return true;
  }
}

at::Tensor& layer_slot(LayerWeights& l, TensorRole role) {
  switch (role) {
    case TensorRole::attn_q: return l.wq;
    case TensorRole::attn_k: return l.wk;
    case TensorRole::attn_v: return l.wv;
    case TensorRole::attn_o: return l.wo;
    case TensorRole::bias_q: return l.bq;
    case TensorRole::bias_k: return l.bk;
    case TensorRole::bias_v: return l.bv;
    case TensorRole::bias_o: return l.bo;
    case TensorRole::ffn_gate: return l.w_gate;
    case TensorRole::ffn_up: return l.w_up;
    case TensorRole::ffn_down: return l.w_down;
    case TensorRole::attn_norm: return l.attn_norm;
    case TensorRole::ffn_norm: return l.ffn_norm;
    case TensorRole::attn_q_norm: return l.q_norm;
    case TensorRole::attn_k_norm: return l.k_norm;
    case TensorRole::attn_post_norm: return l.attn_post_norm;
    case TensorRole::ffn_post_norm: return l.ffn_post_norm;
    default: KVLAB_FAIL("tensor role {} is not a per-layer tensor", int(role));
  }
}

StoredMatrix& stored_slot(LayerWeights& l, TensorRole role) {
  switch (role) {
    case TensorRole::attn_q: return l.wq_s;
    case TensorRole::attn_k: return l.wk_s;
    case TensorRole::attn_v: return l.wv_s;
    case TensorRole::attn_o: return l.wo_s;
    case TensorRole::ffn_gate: return l.w_gate_s;
    case TensorRole::ffn_up: return l.w_up_s;
    case TensorRole::ffn_down: return l.w_down_s;
    default: KVLAB_FAIL("tensor role {} is not a projection", int(role));
  }
}

}  // namespace kvlab
