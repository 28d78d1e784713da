// --model resolution and weight loading: Hugging Face directories (safetensors, HF tensor names)
// and GGUF files (llama.cpp tensor names, dequantized by gguf.cpp, q/k rows un-permuted).
#include <fmt/format.h>

#include "kvlab/core/check.h"
#include "kvlab/io/gguf.h"
#include "kvlab/io/safetensors.h"
#include "kvlab/model/model.h"
#include "kvlab/model/tensor_names.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#ifndef KVLAB_REPO_DIR
#define KVLAB_REPO_DIR "."
#endif

namespace kvlab {

namespace fs = std::filesystem;
constexpr WeightFormat hf = WeightFormat::hf;
constexpr WeightFormat gguf = WeightFormat::gguf;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A weight holding NaN or Inf makes every logit NaN: the model loaded and generate printed <unk>
// with exit 0 (issue 50). One pass per tensor as it is read, before any conversion.
at::Tensor finite_weight(at::Tensor t, const std::string& src, const std::string& name) {
  if (!at::isfinite(t).all().item<bool>()) {
    const int64_t bad = t.numel() - at::isfinite(t).sum().item<int64_t>();
    KVLAB_FAIL("{}: tensor '{}' holds a NaN or Inf value ({} of {}): a model's weights must be finite", src, name,
               bad, t.numel());
  }
  return t;
}

// Checks a loaded tensor's shape; `what` names the tensor and its file.
void expect_shape(const at::Tensor& t, std::vector<int64_t> shape, const std::string& what) {
  KVLAB_CHECK(t.sizes().vec() == shape, "{}: expected shape {}, found {}", what, shape,
              t.sizes().vec());
}

// Moves the weights to the model's device/dtype and finishes the derived fields.
// One matrix for q/k/v and one for gate/up (forward() runs one GEMM each); the separate weights
// become row views into them, so nothing is stored twice.
void fuse_projections(LayerWeights& l) {
  // Held as stored (--weights stored): fused where the parts share a type, the parts then views.
  if (l.wq_s.defined() && l.wq_s.type == l.wk_s.type && l.wq_s.type == l.wv_s.type) {
    const int64_t nq = l.wq_s.rows, nk = l.wk_s.rows, nv = l.wv_s.rows;
    l.wqkv_s = stored_cat({&l.wq_s, &l.wk_s, &l.wv_s});
    l.wq_s = l.wqkv_s.narrow_rows(0, nq);
    l.wk_s = l.wqkv_s.narrow_rows(nq, nk);
    l.wv_s = l.wqkv_s.narrow_rows(nq + nk, nv);
    if (l.bq.defined()) {
      l.bqkv = at::cat({l.bq, l.bk, l.bv}, 0);  // [nq + nk + nv]
      l.bq = l.bqkv.narrow(0, 0, nq);
      l.bk = l.bqkv.narrow(0, nq, nk);
      l.bv = l.bqkv.narrow(0, nq + nk, nv);
    }
  }
  if (l.w_gate_s.defined() && l.w_gate_s.type == l.w_up_s.type) {
    const int64_t ni = l.w_gate_s.rows;
    l.w_gate_up_s = stored_cat({&l.w_gate_s, &l.w_up_s});
    l.w_gate_s = l.w_gate_up_s.narrow_rows(0, ni);
    l.w_up_s = l.w_gate_up_s.narrow_rows(ni, l.w_up_s.rows);
  }
  if (!l.wq.defined() || !l.w_gate.defined()) return;
  const int64_t nq = l.wq.size(0), nk = l.wk.size(0), nv = l.wv.size(0), ni = l.w_gate.size(0);
  l.wqkv = at::cat({l.wq, l.wk, l.wv}, 0);  // [nq + nk + nv, hidden]
  l.wq = l.wqkv.narrow(0, 0, nq);
  l.wk = l.wqkv.narrow(0, nq, nk);
  l.wv = l.wqkv.narrow(0, nq + nk, nv);
  if (l.bq.defined()) {
    l.bqkv = at::cat({l.bq, l.bk, l.bv}, 0);  // [nq + nk + nv]
    l.bq = l.bqkv.narrow(0, 0, nq);
    l.bk = l.bqkv.narrow(0, nq, nk);
    l.bv = l.bqkv.narrow(0, nq + nk, nv);
  }
  l.w_gate_up = at::cat({l.w_gate, l.w_up}, 0);  // [2 * intermediate, hidden]
  l.w_gate = l.w_gate_up.narrow(0, 0, ni);
  l.w_up = l.w_gate_up.narrow(0, ni, l.w_up.size(0));
}

void finish_model(Model& m, const ModelLoadOptions& opt) {
  auto to = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(opt.device, opt.dtype).contiguous();
  };
  // gemma3 keeps its norm weights in float32 (wider for a double model): Gemma3RMSNorm scales by
  // 1 + w.float() before the cast.
  const at::ScalarType norm_dtype = m.config.float_norm_scale && opt.dtype != at::kDouble ? at::kFloat : opt.dtype;
  auto to_norm = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(opt.device, norm_dtype).contiguous();
  };
  ModelWeights& w = m.weights;
  const bool tied = w.lm_head.defined() && w.lm_head.is_same(w.tok_embd);
  to(w.tok_embd);
  to_norm(w.out_norm);
  if (tied) w.lm_head = w.tok_embd; else to(w.lm_head);
  for (auto& l : w.layers) {
    for (at::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.w_gate, &l.w_up, &l.w_down})
      to(*t);
    for (at::Tensor* t : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.ffn_post_norm})
      to_norm(*t);
  }
  for (auto& l : w.layers) fuse_projections(l);
  m.inv_freq = rope_inv_freq(m.config, w.rope_freqs).to(opt.device);
  if (m.config.rope_local_theta > 0)  // gemma3's sliding layers: their own base, no scaling
    m.inv_freq_local = rope_inv_freq(m.config.rope_local_theta, m.config.head_dim, RopeScaling{}).to(opt.device);
  m.dtype = opt.dtype;
  m.device = opt.device;
}

// Expected shapes of every tensor of a layer, checked after loading (both formats).
void check_layer(const ModelConfig& c, const LayerWeights& l, int64_t i, const std::string& src) {
  const int64_t H = c.hidden_size, qd = c.n_q_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  const std::string p = fmt::format("{}: layer {} ", src, i);
  expect_shape(l.wq, {qd, H}, p + "q weight");
  expect_shape(l.wk, {kd, H}, p + "k weight");
  expect_shape(l.wv, {kd, H}, p + "v weight");
  expect_shape(l.wo, {H, qd}, p + "o weight");
  if (c.qkv_bias) {
    expect_shape(l.bq, {qd}, p + "q bias");
    expect_shape(l.bk, {kd}, p + "k bias");
    expect_shape(l.bv, {kd}, p + "v bias");
  }
  if (c.o_bias) expect_shape(l.bo, {H}, p + "o bias");
  expect_shape(l.w_gate, {c.intermediate_size, H}, p + "gate weight");
  expect_shape(l.w_up, {c.intermediate_size, H}, p + "up weight");
  expect_shape(l.w_down, {H, c.intermediate_size}, p + "down weight");
  expect_shape(l.attn_norm, {H}, p + "attention norm");
  expect_shape(l.ffn_norm, {H}, p + "ffn norm");
  if (c.qk_norm) {
    expect_shape(l.q_norm, {c.head_dim}, p + "q norm");
    expect_shape(l.k_norm, {c.head_dim}, p + "k norm");
  }
  if (c.sandwich_norms) {
    expect_shape(l.attn_post_norm, {H}, p + "post-attention norm");
    expect_shape(l.ffn_post_norm, {H}, p + "post-feed-forward norm");
  }
}

// Gemma's HF checkpoints store each RMSNorm weight as an offset from 1 (Gemma3RMSNorm scales by
// 1 + w); kvlab's norms scale by the weight, so the 1 is added on load (llama.cpp's converter
// adds it when it writes a GGUF, so GGUF weights are used as stored).
void add_norm_offsets(ModelWeights& w) {
  w.out_norm = w.out_norm + 1.0;
  for (auto& l : w.layers)
    for (at::Tensor* t : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.ffn_post_norm})
      if (t->defined()) *t = *t + 1.0;
}

}  // namespace

// The models kvlab fetches by name: the GGUF a data_scripts/ script puts under
// ${KVLAB_MODELS:-<repo>/models}/<name>/ (README, "Models").
struct NamedModel {
  const char* name;
  const char* script;
};
constexpr NamedModel kNamedModels[] = {
    {"smollm2-135m", "get_smollm2.sh"},
    {"gemma3-270m", "get_gemma3_270m.sh"},
    {"qwen2.5-coder-0.5b", "get_qwen25_coder.sh 0.5b"},
    {"qwen2.5-coder-1.5b", "get_qwen25_coder.sh 1.5b"},
};
constexpr const char* kModelNames = "smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, stories260k";

ModelSource resolve_model(const std::string& spec, const std::string& flag) {
  KVLAB_CHECK(!spec.empty(), "{} is required: a Hugging Face directory, a .gguf file, or one of "
              "the names {}", flag, kModelNames);
  ModelSource src;
  src.spec = spec;
  const std::string repo = KVLAB_REPO_DIR;
  const std::string name = lower(spec);
  fs::path path(spec);
  if (!fs::exists(path)) {
    const auto named = std::find_if(std::begin(kNamedModels), std::end(kNamedModels),
                                    [&](const NamedModel& m) { return name == m.name; });
    if (named != std::end(kNamedModels)) {
      const fs::path dir = fs::path(env_or("KVLAB_MODELS", repo + "/models")) / name;
      const std::string script = named->script;
      std::vector<fs::path> found;
      if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
          if (e.path().extension() == ".gguf") found.push_back(e.path());
      std::sort(found.begin(), found.end());
      KVLAB_CHECK(!found.empty(), "{} {}: no .gguf file in {}; run data_scripts/{} (or set "
                  "KVLAB_MODELS to the folder holding {}/)", flag, name, dir.string(), script, name);
      path = found.front();
    } else if (name == "stories260k") {
      path = fs::path(env_or("KVLAB_SHARED", repo + "/../shared")) / "models" / "stories260K";
      KVLAB_CHECK(fs::is_directory(path), "{} stories260k: {} does not exist (set KVLAB_SHARED to "
                  "the shared data folder)", flag, path.string());
    } else {
      KVLAB_FAIL("{} '{}': no such file or directory, and not a known name ({})", flag, spec, kModelNames);
    }
  }
  if (fs::is_directory(path)) {
    KVLAB_CHECK(fs::exists(path / "config.json"), "{} '{}': directory has no config.json (expected "
                "a Hugging Face model directory)", flag, path.string());
    src.kind = ModelSource::Kind::hf_dir;
    src.path = path.string();
    src.tokenizer_path = path.string();
  } else {
    KVLAB_CHECK(ends_with(lower(path.string()), ".gguf"), "{} '{}': expected a directory or a "
                ".gguf file", flag, path.string());
    src.kind = ModelSource::Kind::gguf;
    src.path = path.string();
    src.tokenizer_path = path.string();
  }
  return src;
}

at::ScalarType parse_compute_dtype(const std::string& name, const std::string& flag) {
  const std::string n = lower(name);
  if (n == "fp32" || n == "float32" || n == "float") return at::kFloat;
  if (n == "fp16" || n == "float16" || n == "half") return at::kHalf;
  if (n == "bf16" || n == "bfloat16") return at::kBFloat16;
  if (n == "fp64" || n == "float64" || n == "double") return at::kDouble;
  KVLAB_FAIL("{} '{}' is not a dtype (expected fp32, bf16, fp16 or fp64)", flag, name);
}

namespace {
void check_dtype_device(const ModelLoadOptions& opt) {
  KVLAB_CHECK(!opt.stored_weights || (opt.device.is_cpu() && opt.dtype == at::kFloat),
              "--weights stored runs on the CPU in fp32 (its kernels decode blocks into fp32): give --weights fp32 "
              "with --device cuda or --dtype bf16/fp16/fp64");
  // LibTorch 1.13's CPU matmul has no float16 kernel ("addmm_impl_cpu_ not implemented for Half").
  KVLAB_CHECK(!(opt.dtype == at::kHalf && opt.device.is_cpu()),
              "--dtype fp16 needs --device cuda (CPU matmuls have no float16 kernel); use bf16 or "
              "fp32 on CPU");
}
}  // namespace

bool parse_weights_flag(const std::string& value, const std::string& flag) {
  KVLAB_CHECK(value == "stored" || value == "fp32", "{} '{}': expected stored or fp32", flag, value);
  return value == "stored";
}

Model load_model(const std::string& spec, const ModelLoadOptions& opt) { return load_model(resolve_model(spec), opt); }

Model load_model(const ModelSource& src, const ModelLoadOptions& opt) {
  return src.kind == ModelSource::Kind::gguf ? load_model_gguf(src, opt) : load_model_hf(src, opt);
}

namespace {

// Phi-3 fuses q/k/v (rows q, then k, then v) and gate/up (rows gate, then up), in HF
// (self_attn.qkv_proj, mlp.gate_up_proj) and GGUF (attn_qkv, ffn_up) alike; they are split into the
// roles every other architecture has (finish_model fuses them again for the fast path).
bool fused_role(TensorRole r) {
  return r == TensorRole::attn_q || r == TensorRole::attn_k || r == TensorRole::attn_v ||
         r == TensorRole::ffn_gate || r == TensorRole::ffn_up;
}

void split_fused(LayerWeights& l, const ModelConfig& c, const at::Tensor& qkv, const at::Tensor& gate_up,
                 const std::string& where) {
  const int64_t nq = c.n_q_heads * c.head_dim, nk = c.n_kv_heads * c.head_dim;
  expect_shape(qkv, {nq + 2 * nk, c.hidden_size}, where + " fused q/k/v");
  expect_shape(gate_up, {2 * c.intermediate_size, c.hidden_size}, where + " fused gate/up");
  l.wq = qkv.narrow(0, 0, nq).contiguous();
  l.wk = qkv.narrow(0, nq, nk).contiguous();
  l.wv = qkv.narrow(0, nq + nk, nk).contiguous();
  l.w_gate = gate_up.narrow(0, 0, c.intermediate_size).contiguous();
  l.w_up = gate_up.narrow(0, c.intermediate_size, c.intermediate_size).contiguous();
}

}  // namespace

Model load_model_hf(const ModelSource& src, const ModelLoadOptions& opt) {
  check_dtype_device(opt);
  KVLAB_CHECK(!opt.stored_weights, "--weights stored needs a .gguf file (its blocks are what it keeps); {} is a "
              "Hugging Face directory: give --weights fp32", src.path);
  c10::InferenceMode guard;
  Model m;
  m.id = src.spec;
  m.source = src;
  m.config = load_hf_config((fs::path(src.path) / "config.json").string());
  const ModelConfig& c = m.config;
  SafetensorsCheckpoint ckpt(src.path);
  // Load as float32 first (the stored dtype may be F16/BF16), convert in finish_model.
  auto get = [&](const std::string& name) { return finite_weight(ckpt.get(name, at::kFloat), src.path, name); };
  ModelWeights& w = m.weights;
  w.tok_embd = get(tensor_name(hf, TensorRole::tok_embd));
  expect_shape(w.tok_embd, {c.vocab_size, c.hidden_size},
               src.path + ": " + tensor_name(hf, TensorRole::tok_embd));
  w.out_norm = get(tensor_name(hf, TensorRole::out_norm));
  if (ckpt.has(tensor_name(hf, TensorRole::lm_head)) && !c.tie_word_embeddings) {
    w.lm_head = get(tensor_name(hf, TensorRole::lm_head));
    expect_shape(w.lm_head, {c.vocab_size, c.hidden_size}, src.path + ": " + tensor_name(hf, TensorRole::lm_head));
  } else {
    KVLAB_CHECK(c.tie_word_embeddings, "{}: lm_head.weight is missing and config.json has "
                "tie_word_embeddings=false", src.path);
    w.lm_head = w.tok_embd;
  }
  w.layers.resize(c.n_layers);
  // Phi-3 fuses q/k/v (self_attn.qkv_proj: rows q, then k, then v) and gate/up (mlp.gate_up_proj:
  // rows gate, then up); they are split here into the roles every other architecture has.
  const bool fused = c.architecture == "phi3";
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    for (TensorRole role : layer_roles())
      if (layer_role_present(role, c) && !(fused && fused_role(role)))
        layer_slot(l, role) = get(tensor_name(WeightFormat::hf, role, i, c));
    if (fused)
      split_fused(l, c, get(fmt::format("model.layers.{}.self_attn.qkv_proj.weight", i)),
                  get(fmt::format("model.layers.{}.mlp.gate_up_proj.weight", i)),
                  src.path + fmt::format(": model.layers.{}", i));
    check_layer(c, l, i, src.path);
  }
  KVLAB_CHECK(!ckpt.has(fused ? fmt::format("model.layers.{}.self_attn.qkv_proj.weight", c.n_layers)
                              : tensor_name(WeightFormat::hf, TensorRole::attn_q, c.n_layers)),
              "{}: holds more layers than num_hidden_layers={}", src.path, c.n_layers);
  if (c.float_norm_scale) add_norm_offsets(w);
  finish_model(m, opt);
  return m;
}

// --weights stored: the row order gguf_unpermute_qk gives a [rows, cols] matrix of n_heads heads.
at::Tensor unpermuted_rows(int64_t rows, int n_heads) {
  const at::Tensor id = at::arange(rows, at::TensorOptions().dtype(at::kDouble)).unsqueeze(1);  // [rows, 1]
  return gguf_unpermute_qk(id, n_heads).squeeze(1).to(at::kLong);                                 // [rows]
}

// --weights stored: layer l's projections (loaded and checked in fp32 first) replaced by the
// file's blocks, where every part of a group applies (q, k, v; gate, up; o; down); the fp32 copies
// are freed. Checks that the blocks decode to the fp32 weights kvlab checked.
void store_layer(LayerWeights& l, const GgufFile& g, int64_t i, const ModelConfig& c, bool permuted) {
  auto info = [&](TensorRole role) {
    const GgufTensorInfo* t = g.find_tensor(tensor_name(WeightFormat::gguf, role, i, c));
    return t && t->shape.size() == 2 && stored_applies(t->type, t->shape[1]) ? t : nullptr;
  };
  const std::vector<std::vector<TensorRole>> groups = {{TensorRole::attn_q, TensorRole::attn_k, TensorRole::attn_v},
                                                       {TensorRole::attn_o},
                                                       {TensorRole::ffn_gate, TensorRole::ffn_up},
                                                       {TensorRole::ffn_down}};
  for (const auto& group : groups) {
    if (!std::all_of(group.begin(), group.end(), [&](TensorRole r) { return info(r) != nullptr; })) continue;
    for (TensorRole role : group) {
      StoredMatrix s = stored_matrix(*info(role));
      if (permuted && role == TensorRole::attn_q) s = s.take_rows(unpermuted_rows(s.rows, int(c.n_q_heads)));
      if (permuted && role == TensorRole::attn_k) s = s.take_rows(unpermuted_rows(s.rows, int(c.n_kv_heads)));
      at::Tensor& dense = layer_slot(l, role);
      KVLAB_CHECK(s.dequantize().equal(dense), "{}: {} decodes differently as stored", g.path(),
                  tensor_name(WeightFormat::gguf, role, i, c));
      dense = at::Tensor();
      stored_slot(l, role) = std::move(s);
    }
  }
}

Model load_model_gguf(const ModelSource& src, const ModelLoadOptions& opt) {
  check_dtype_device(opt);
  c10::InferenceMode guard;
  GgufFile g(src.path);
  // Scalar metadata as JSON for model_config_from_gguf.
  nlohmann::json md = nlohmann::json::object();
  for (const auto& key : g.keys()) {
    const GgufValue& v = g.value(key);
    if (v.type == GgufType::ARRAY) continue;
    if (v.type == GgufType::STRING) md[key] = v.s;
    else if (v.type == GgufType::BOOL) md[key] = v.i != 0;
    else if (v.is_float()) md[key] = v.f;
    else if (v.is_integer() && !v.u_only) md[key] = v.i;
  }
  const GgufTensorInfo* embd = g.find_tensor(tensor_name(gguf, TensorRole::tok_embd));
  KVLAB_CHECK(embd != nullptr, "{}: tensor token_embd.weight is missing", src.path);
  const int64_t n_vocab = embd->shape.size() == 2 ? embd->shape[0] : 0;

  Model m;
  m.id = src.spec;
  m.source = src;
  m.config = model_config_from_gguf(md, src.path, n_vocab);
  ModelConfig& c = m.config;
  c.tie_word_embeddings = !g.has_tensor(tensor_name(gguf, TensorRole::lm_head));
  // llama.cpp's converter permutes q/k rows of the "llama" architecture only (qwen2 is stored in
  // the HF layout already).
  const bool permuted = c.architecture == "llama";

  auto get = [&](const std::string& name) { return finite_weight(g.get(name, at::kFloat), src.path, name); };
  ModelWeights& w = m.weights;
  w.tok_embd = get(tensor_name(gguf, TensorRole::tok_embd));
  expect_shape(w.tok_embd, {c.vocab_size, c.hidden_size}, src.path + ": " + tensor_name(gguf, TensorRole::tok_embd));
  w.out_norm = get(tensor_name(gguf, TensorRole::out_norm));
  w.lm_head = c.tie_word_embeddings ? w.tok_embd : get(tensor_name(gguf, TensorRole::lm_head));
  if (!c.tie_word_embeddings)
    expect_shape(w.lm_head, {c.vocab_size, c.hidden_size}, src.path + ": " + tensor_name(gguf, TensorRole::lm_head));
  if (g.has_tensor(tensor_name(gguf, TensorRole::rope_freqs))) w.rope_freqs = get(tensor_name(gguf, TensorRole::rope_freqs));
  w.layers.resize(c.n_layers);
  const bool fused = c.architecture == "phi3";  // attn_qkv (q, k, v rows) and ffn_up (gate, up rows)
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    for (TensorRole role : layer_roles())
      if (layer_role_present(role, c) && !(fused && fused_role(role)))
        layer_slot(l, role) = get(tensor_name(WeightFormat::gguf, role, i, c));
    if (fused) split_fused(l, c, get(fmt::format("blk.{}.attn_qkv.weight", i)), get(fmt::format("blk.{}.ffn_up.weight", i)),
                           src.path + fmt::format(": blk.{}", i));
    if (permuted) {
      l.wq = gguf_unpermute_qk(l.wq, static_cast<int>(c.n_q_heads));
      l.wk = gguf_unpermute_qk(l.wk, static_cast<int>(c.n_kv_heads));
      if (l.bq.defined()) l.bq = gguf_unpermute_qk(l.bq, static_cast<int>(c.n_q_heads));
      if (l.bk.defined()) l.bk = gguf_unpermute_qk(l.bk, static_cast<int>(c.n_kv_heads));
    }
    check_layer(c, l, i, src.path);
    if (opt.stored_weights && !fused) store_layer(l, g, i, c, permuted);
  }
  if (opt.stored_weights) {  // the embedding and lm_head too, where they apply
    const GgufTensorInfo* e = g.find_tensor(tensor_name(gguf, TensorRole::tok_embd));
    if (stored_applies(e->type, e->shape[1])) {
      w.tok_embd_s = stored_matrix(*e);
      if (c.tie_word_embeddings) w.lm_head_s = w.tok_embd_s, w.lm_head = at::Tensor();
      w.tok_embd = at::Tensor();
    }
    const GgufTensorInfo* h = c.tie_word_embeddings ? nullptr : g.find_tensor(tensor_name(gguf, TensorRole::lm_head));
    if (h && stored_applies(h->type, h->shape[1])) w.lm_head_s = stored_matrix(*h), w.lm_head = at::Tensor();
  }
  finish_model(m, opt);
  return m;
}

}  // namespace kvlab
