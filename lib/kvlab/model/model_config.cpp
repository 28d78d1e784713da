#include "kvlab/model/model_config.h"

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

#include <cmath>
#include <type_traits>

namespace kvlab {

namespace {

using nlohmann::json;

// Typed access to an HF config key; errors name the file and the key.
template <class T>
T get_or(const json& j, const std::string& key, T fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, int64_t>) {
    // json's get<int64_t>() truncates 64.5 to 64 and turns true into 1: a size must be an integer
    // (64.0 is one).
    const bool integral = it->is_number_integer() ||
                          (it->is_number_float() && std::isfinite(it->get<double>()) &&
                           std::trunc(it->get<double>()) == it->get<double>() &&
                           std::fabs(it->get<double>()) < 9.0e15);
    KVLAB_CHECK(integral, "{}: key '{}' must be an integer, found {}", source, key, it->dump());
    return it->is_number_integer() ? it->get<int64_t>() : static_cast<int64_t>(it->get<double>());
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    KVLAB_FAIL("{}: key '{}' has the wrong type (found {})", source, key, it->dump());
  }
}

// A context length given in the file must be positive (absent = unknown, 0).
int64_t context_length(const json& j, const std::string& key, const std::string& source) {
  const int64_t n = get_or<int64_t>(j, key, 0, source);
  KVLAB_CHECK(!j.contains(key) || j[key].is_null() || n > 0,
              "{}: key '{}' must be a positive integer (the model's context length), found {}", source, key, n);
  // A claim past any model's (issue 50: 2^63-1 was accepted, and a RULER length checked against it
  // then ran silent for a minute). 2^30 leaves room for the longest contexts stated today (10M).
  constexpr int64_t kMaxContext = int64_t(1) << 30;
  KVLAB_CHECK(n <= kMaxContext, "{}: key '{}' claims a context of {} tokens, more than kvlab accepts ({}): not a "
              "model's context length", source, key, n, kMaxContext);
  return n;
}

template <class T>
T get_required(const json& j, const std::string& key, const std::string& source) {
  auto it = j.find(key);
  KVLAB_CHECK(it != j.end() && !it->is_null(), "{}: required key '{}' is missing", source, key);
  return get_or<T>(j, key, T{}, source);
}

std::vector<int64_t> id_list(const json& j, const std::string& key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_array()) {
    std::vector<int64_t> out;
    for (const auto& e : *it) {
      KVLAB_CHECK(e.is_number_integer(), "{}: '{}' must hold integers, found {}", source, key,
                  it->dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  KVLAB_CHECK(it->is_number_integer(), "{}: '{}' must be an integer or a list, found {}", source,
              key, it->dump());
  return {it->get<int64_t>()};
}

// RMSNorm's epsilon, in (0, 1) (models use 1e-6 to 1e-5), and a RoPE base, finite and > 0, as read
// from `key`: outside them a model loaded and decoded noise, <unk> with exit 0 (issue 50).
double norm_eps(const json& j, const std::string& key, double fallback, const std::string& source) {
  const double v = get_or<double>(j, key, fallback, source);
  KVLAB_CHECK(v > 0 && v < 1, "{}: key '{}' must be in (0, 1), found {}", source, key, v);
  return v;
}
// A RoPE base below 1 turns the frequency ladder upside down (no model has one), and a tiny one
// overflows it: rope_theta 1e-300 made float32 frequencies of inf, so cos/sin NaN and generate
// printed <unk> with exit 0 (issue 50). Bases of 1 and above give frequencies in (0, 1].
double rope_base(const json& j, const std::string& key, double fallback, const std::string& source) {
  const double v = get_or<double>(j, key, fallback, source);
  KVLAB_CHECK(std::isfinite(v) && v >= 1, "{}: key '{}' must be a finite number >= 1, found {}", source, key, v);
  return v;
}

// Bounds on sizes read from a config: far above any real model (Llama 3.1 405B: 126 layers, 128
// heads, hidden 16384, vocabularies up to 256k), and low enough that a corrupted count cannot make
// the loader allocate per-layer or per-head structures until the process dies (GGUF block_count =
// 2^31-1 was a bare std::bad_alloc).
constexpr int64_t kMaxLayers = 4096, kMaxHeads = 4096, kMaxWidth = int64_t(1) << 20, kMaxVocab = int64_t(1) << 24;

// A size read from `key` must lie in [1, hi]; the error names the file and the key as written.
int64_t checked_size(int64_t v, const std::string& key, int64_t hi, const std::string& source) {
  KVLAB_CHECK(v >= 1 && v <= hi, "{}: key '{}' = {} is out of range: expected an integer in [1, {}]", source, key,
              v, hi);
  return v;
}

}  // namespace

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"};
  return names;
}

bool ModelConfig::interleaved_windows() const {
  if (sliding_window <= 0) return false;
  bool slides = false, global = false;
  for (int64_t l = 0; l < n_layers; ++l) (layer_window(l) > 0 ? slides : global) = true;
  return slides && global;
}

double ModelConfig::query_scale() const {
  return query_pre_attn_scalar > 0 ? std::sqrt(double(head_dim) / query_pre_attn_scalar) : 1.0;
}

namespace {

// gemma3 (transformers' Gemma3TextConfig; llama.cpp's LLM_ARCH_GEMMA3): what sets it apart from a
// Llama layer. Both formats call it after the common fields.
void set_gemma3_layers(ModelConfig& c) {
  c.qk_norm = true;
  c.embed_scaled = true;
  c.sandwich_norms = true;
  c.float_norm_scale = true;
  c.hidden_act = "gelu_tanh";
}

// Layer l slides when (l + 1) % pattern != 0: transformers' default for configs without
// layer_types (sliding_window_pattern, 6), and llama.cpp's fixed gemma3 pattern.
std::vector<bool> every_nth_global(int64_t n_layers, int64_t pattern) {
  std::vector<bool> out(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) out[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
  return out;
}

// A per-layer pattern as kvlab holds it: "sliding from some layer on" becomes window_from_layer
// (every earlier model's form, so their keys do not change), anything else sliding_layers.
void set_sliding_layers(ModelConfig& c, const std::vector<bool>& slides) {
  int64_t first = c.n_layers;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (slides[static_cast<size_t>(l)]) { first = l; break; }
  bool tail = true;
  for (int64_t l = first; l < c.n_layers; ++l) tail = tail && slides[static_cast<size_t>(l)];
  c.sliding_layers.clear();
  if (tail) c.window_from_layer = first;
  else c.sliding_layers = slides;
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  KVLAB_CHECK(hidden_size > 0 && n_layers > 0 && n_q_heads > 0 && n_kv_heads > 0 && head_dim > 0 &&
                  intermediate_size > 0 && vocab_size > 0,
              "{}: hyperparameters must be positive, found hidden_size={} n_layers={} "
              "n_q_heads={} n_kv_heads={} head_dim={} intermediate_size={} vocab_size={}",
              source, hidden_size, n_layers, n_q_heads, n_kv_heads, head_dim, intermediate_size,
              vocab_size);
  KVLAB_CHECK(n_q_heads % n_kv_heads == 0,
              "{}: n_q_heads={} must be a multiple of n_kv_heads={}", source, n_q_heads,
              n_kv_heads);
  KVLAB_CHECK(head_dim % 2 == 0, "{}: head_dim must be even for RoPE, found {}", source, head_dim);
  KVLAB_CHECK(rms_norm_eps > 0 && rms_norm_eps < 1, "{}: rms_norm_eps must be in (0, 1), found {}", source,
              rms_norm_eps);
  KVLAB_CHECK(std::isfinite(rope_theta) && rope_theta >= 1, "{}: rope_theta must be a finite number >= 1, found {}",
              source, rope_theta);
}

nlohmann::json ModelConfig::to_json() const {
  json j{{"architecture", architecture},
              {"hidden_size", hidden_size},
              {"n_layers", n_layers},
              {"n_q_heads", n_q_heads},
              {"n_kv_heads", n_kv_heads},
              {"head_dim", head_dim},
              {"intermediate_size", intermediate_size},
              {"vocab_size", vocab_size},
              {"max_position_embeddings", max_position_embeddings},
              {"rms_norm_eps", rms_norm_eps},
              {"rope_theta", rope_theta},
              {"rope_scaling", rope_scaling.to_json()},
              {"tie_word_embeddings", tie_word_embeddings},
              {"qkv_bias", qkv_bias},
              {"o_bias", o_bias},
              {"sliding_window", sliding_window},
              {"bos_token_id", bos_token_id},
              {"eos_token_ids", eos_token_ids}};
  if (sliding_window > 0) j["window_from_layer"] = window_from_layer;
  if (qk_norm) j["qk_norm"] = true;
  // gemma3's fields only where they are set, so that every earlier model's JSON is unchanged.
  if (!sliding_layers.empty()) {
    json kinds = json::array();
    for (bool s : sliding_layers) kinds.push_back(s ? "sliding_attention" : "full_attention");
    j["layer_types"] = kinds;
  }
  if (rope_local_theta > 0) j["rope_local_theta"] = rope_local_theta;
  if (query_pre_attn_scalar > 0) j["query_pre_attn_scalar"] = query_pre_attn_scalar;
  if (embed_scaled) j["embed_scaled"] = true;
  if (sandwich_norms) j["sandwich_norms"] = true;
  if (float_norm_scale) j["float_norm_scale"] = true;
  if (hidden_act != "silu") j["hidden_act"] = hidden_act;
  return j;
}

ModelConfig model_config_from_hf(const nlohmann::json& cfg, const std::string& source) {
  KVLAB_CHECK(cfg.is_object(), "{}: expected a JSON object", source);
  ModelConfig c;
  std::string type = get_or<std::string>(cfg, "model_type", "", source);
  // No guess from "architectures" (issue 50: a missing or null model_type was taken from it as llama;
  // transformers' AutoConfig refuses such a file too): the error says what to add.
  if (type.empty()) {
    std::string hint;
    if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
        cfg["architectures"][0].is_string()) {
      const std::string a = cfg["architectures"][0].get<std::string>();
      for (const auto& [arch, name] : std::vector<std::pair<std::string, std::string>>{
               {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"},
               {"Qwen3ForCausalLM", "qwen3"}, {"Phi3ForCausalLM", "phi3"}, {"Gemma3ForCausalLM", "gemma3_text"}})
        if (a == arch) hint = fmt::format(" (its architectures say {}: add \"model_type\": \"{}\")", a, name);
    }
    KVLAB_FAIL("{}: no model_type says which architecture this is{}; supported: {}", source, hint,
               fmt::join(supported_architectures(), ", "));
  }
  if (type == "gemma3_text") type = "gemma3";
  KVLAB_CHECK(!(type == "gemma3" && cfg.contains("text_config")),
              "{}: a Gemma 3 vision-language checkpoint (Gemma3ForConditionalGeneration); kvlab runs the "
              "text model only: give a gemma3_text checkpoint (e.g. Gemma-3-270M / 1B) or its GGUF", source);
  bool known = false;
  for (const auto& a : supported_architectures()) known = known || a == type;
  KVLAB_CHECK(known, "{}: model_type '{}' is not supported (supported: {})", source, type,
              fmt::join(supported_architectures(), ", "));
  c.architecture = type;

  if (type == "gemma3") {
    const std::string act = get_or<std::string>(cfg, "hidden_activation",
                                                get_or<std::string>(cfg, "hidden_act", "gelu_pytorch_tanh", source), source);
    KVLAB_CHECK(act == "gelu_pytorch_tanh", "{}: hidden_activation '{}' is not supported for gemma3 (expected "
                "\"gelu_pytorch_tanh\")", source, act);
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
      KVLAB_CHECK(!cfg.contains(k) || cfg[k].is_null(), "{}: {} = {} is not supported (gemma3 has none)", source, k,
                  cfg[k].dump());
    KVLAB_CHECK(!get_or<bool>(cfg, "use_bidirectional_attention", false, source),
                "{}: use_bidirectional_attention=true is not supported (a causal LM only)", source);
  } else {
    const std::string act = get_or<std::string>(cfg, "hidden_act", "silu", source);
    KVLAB_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (expected \"silu\")", source,
                act);
  }
  auto size = [&](const char* key, int64_t hi) {
    return checked_size(get_required<int64_t>(cfg, key, source), key, hi, source);
  };
  c.hidden_size = size("hidden_size", kMaxWidth);
  c.n_layers = size("num_hidden_layers", kMaxLayers);
  c.n_q_heads = size("num_attention_heads", kMaxHeads);
  c.n_kv_heads = checked_size(get_or<int64_t>(cfg, "num_key_value_heads", c.n_q_heads, source),
                              "num_key_value_heads", kMaxHeads, source);
  c.head_dim = get_or<int64_t>(cfg, "head_dim", 0, source);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.n_q_heads;
  checked_size(c.head_dim, "head_dim", kMaxWidth, source);
  c.intermediate_size = size("intermediate_size", kMaxWidth);
  c.vocab_size = size("vocab_size", kMaxVocab);
  c.max_position_embeddings = context_length(cfg, "max_position_embeddings", source);
  c.rms_norm_eps = norm_eps(cfg, "rms_norm_eps", 1e-6, source);
  // transformers >= 5 may nest rope settings under "rope_parameters".
  json rope_params = cfg.contains("rope_parameters") ? cfg["rope_parameters"] : json(nullptr);
  c.rope_theta = rope_base(cfg, "rope_theta", 10000.0, source);
  if (rope_params.is_object() && rope_params.contains("rope_theta"))
    c.rope_theta = rope_base(rope_params, "rope_theta", c.rope_theta, source);
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null())
    c.rope_scaling = rope_scaling_from_json(cfg["rope_scaling"], source);
  else if (rope_params.is_object())
    c.rope_scaling = rope_scaling_from_json(rope_params, source);
  // Partial rotary embeddings (Phi-4-mini's 0.75) rotate only part of each head: not supported.
  double partial = get_or<double>(cfg, "partial_rotary_factor", 1.0, source);
  if (rope_params.is_object() && rope_params.contains("partial_rotary_factor"))
    partial = get_or<double>(rope_params, "partial_rotary_factor", partial, source);
  KVLAB_CHECK(partial == 1.0, "{}: partial_rotary_factor {} is not supported (only 1.0: RoPE over the whole head)",
              source, partial);
  if (type == "gemma3") {
    // Global layers: rope_theta (default 1e6) and rope_scaling; sliding layers: their own base
    // (rope_local_base_freq, default 1e4), unscaled. transformers >= 5 nests both under
    // rope_parameters.{full_attention, sliding_attention}.
    c.rope_theta = rope_base(cfg, "rope_theta", 1.0e6, source);
    c.rope_local_theta = rope_base(cfg, "rope_local_base_freq", 1.0e4, source);
    if (rope_params.is_object() && rope_params.contains("full_attention")) {
      const json& full = rope_params["full_attention"];
      const json& local = rope_params.contains("sliding_attention") ? rope_params["sliding_attention"] : json(nullptr);
      c.rope_theta = rope_base(full, "rope_theta", c.rope_theta, source);
      c.rope_scaling = rope_scaling_from_json(full, source + " rope_parameters.full_attention");
      if (local.is_object()) {
        c.rope_local_theta = rope_base(local, "rope_theta", c.rope_local_theta, source);
        KVLAB_CHECK(rope_scaling_from_json(local, source).kind == "none",
                    "{}: rope_parameters.sliding_attention scales RoPE ({}); only unscaled local RoPE is supported",
                    source, local.dump());
      }
    }
    c.query_pre_attn_scalar = get_or<double>(cfg, "query_pre_attn_scalar", 256.0, source);
    KVLAB_CHECK(c.query_pre_attn_scalar > 0, "{}: query_pre_attn_scalar must be > 0, found {}", source,
                c.query_pre_attn_scalar);
    set_gemma3_layers(c);
  }
  c.tie_word_embeddings = get_or<bool>(cfg, "tie_word_embeddings", type == "gemma3", source);
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o_proj bias
  } else if (type == "llama" || type == "qwen3" || type == "gemma3") {
    c.qkv_bias = c.o_bias = get_or<bool>(cfg, "attention_bias", false, source);
  }
  c.qk_norm = type == "qwen3" || type == "gemma3";
  KVLAB_CHECK(!get_or<bool>(cfg, "mlp_bias", false, source),
              "{}: mlp_bias=true is not supported", source);
  // Mistral and Phi-3 slide every layer when sliding_window is set (transformers: the sliding
  // mask whenever config.sliding_window is not None).
  if (type == "mistral" || type == "phi3") c.sliding_window = get_or<int64_t>(cfg, "sliding_window", 0, source);
  if ((type == "qwen2" || type == "qwen3") && get_or<bool>(cfg, "use_sliding_window", false, source)) {
    // transformers' Qwen2Config / Qwen3Config: layer i slides when i >= max_window_layers (default 28).
    c.sliding_window = get_or<int64_t>(cfg, "sliding_window", 0, source);
    c.window_from_layer = get_or<int64_t>(cfg, "max_window_layers", 28, source);
  }
  if (type == "gemma3") {
    c.sliding_window = get_or<int64_t>(cfg, "sliding_window", 4096, source);
    const int64_t pattern = get_or<int64_t>(cfg, "sliding_window_pattern", 6, source);
    KVLAB_CHECK(pattern >= 1, "{}: sliding_window_pattern must be >= 1, found {}", source, pattern);
    if (c.sliding_window > 0) set_sliding_layers(c, every_nth_global(c.n_layers, pattern));
  }
  // transformers >= 4.53 also writes the per-layer kinds; they win over max_window_layers.
  if (c.sliding_window > 0 && cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
    const json& kinds = cfg["layer_types"];
    KVLAB_CHECK(static_cast<int64_t>(kinds.size()) == c.n_layers,
                "{}: layer_types has {} entries, expected num_hidden_layers = {}", source, kinds.size(),
                c.n_layers);
    std::vector<bool> slides(static_cast<size_t>(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string kind = kinds[l].is_string() ? kinds[l].get<std::string>() : "";
      KVLAB_CHECK(kind == "full_attention" || kind == "sliding_attention",
                  "{}: layer_types[{}] must be \"full_attention\" or \"sliding_attention\", found {}",
                  source, l, kinds[l].dump());
      slides[static_cast<size_t>(l)] = kind == "sliding_attention";
    }
    set_sliding_layers(c, slides);
  }
  KVLAB_CHECK(c.sliding_window >= 0 && c.window_from_layer >= 0,
              "{}: sliding_window and max_window_layers must be >= 0, found {} and {}", source,
              c.sliding_window, c.window_from_layer);
  auto bos = id_list(cfg, "bos_token_id", source);
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = id_list(cfg, "eos_token_id", source);
  c.validate(source);
  return c;
}

ModelConfig load_hf_config(const std::string& config_json_path) {
  return model_config_from_hf(read_json_file(config_json_path), config_json_path);
}

ModelConfig model_config_from_gguf(const nlohmann::json& md, const std::string& source,
                                   int64_t n_vocab_fallback) {
  KVLAB_CHECK(md.is_object(), "{}: GGUF metadata must be an object", source);
  const std::string arch = get_required<std::string>(md, "general.architecture", source);
  KVLAB_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "phi3" || arch == "gemma3",
              "{}: GGUF general.architecture '{}' is not supported (supported: llama, qwen2, qwen3, phi3, gemma3; "
              "mistral GGUFs use 'llama')",
              source, arch);
  auto key = [&](const std::string& k) { return arch + "." + k; };
  ModelConfig c;
  c.architecture = arch;
  auto size = [&](const std::string& k, int64_t hi) {
    return checked_size(get_required<int64_t>(md, key(k), source), key(k), hi, source);
  };
  c.hidden_size = size("embedding_length", kMaxWidth);
  c.n_layers = size("block_count", kMaxLayers);
  c.n_q_heads = size("attention.head_count", kMaxHeads);
  c.n_kv_heads = checked_size(get_or<int64_t>(md, key("attention.head_count_kv"), c.n_q_heads, source),
                              key("attention.head_count_kv"), kMaxHeads, source);
  c.head_dim = get_or<int64_t>(md, key("attention.key_length"), 0, source);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.n_q_heads;
  checked_size(c.head_dim, key("attention.key_length"), kMaxWidth, source);
  const int64_t rope_dims = get_or<int64_t>(md, key("rope.dimension_count"), c.head_dim, source);
  KVLAB_CHECK(rope_dims == c.head_dim,
              "{}: partial RoPE is not supported ({} = {}, head_dim = {})", source,
              key("rope.dimension_count"), rope_dims, c.head_dim);
  c.intermediate_size = size("feed_forward_length", kMaxWidth);
  c.vocab_size = checked_size(get_or<int64_t>(md, key("vocab_size"), n_vocab_fallback, source), key("vocab_size"),
                              kMaxVocab, source);
  c.max_position_embeddings = context_length(md, key("context_length"), source);
  c.rms_norm_eps = norm_eps(md, key("attention.layer_norm_rms_epsilon"), 1e-6, source);
  // GGUF stores eps as float32 (1e-5 reads back as 9.99999974738e-06); transformers' GGUF loader
  // passes that value on unchanged, so kvlab does too.
  c.rope_theta = rope_base(md, key("rope.freq_base"), 10000.0, source);
  const std::string scaling = get_or<std::string>(md, key("rope.scaling.type"), "none", source);
  if (scaling == "linear") {
    c.rope_scaling.kind = "linear";
    c.rope_scaling.factor = get_required<double>(md, key("rope.scaling.factor"), source);
  } else {
    KVLAB_CHECK(scaling == "none", "{}: {} '{}' is not supported (supported: none, linear)",
                source, key("rope.scaling.type"), scaling);
  }
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  // llama.cpp's converter writes Phi-3's sliding window (every layer) under this key.
  if (arch == "phi3") c.sliding_window = get_or<int64_t>(md, key("attention.sliding_window"), 0, source);
  if (arch == "gemma3") {
    // llama.cpp's gemma3 loader (as transformers' GGUF path): every sixth layer global, the local
    // RoPE base 1e4, and the query scale 1/sqrt(head_dim) except for the 27B model (62 layers),
    // which uses 1/sqrt(hidden / heads). The norm weights are stored with their 1 added.
    set_gemma3_layers(c);
    c.sliding_window = get_or<int64_t>(md, key("attention.sliding_window"), 0, source);
    if (c.sliding_window > 0) set_sliding_layers(c, every_nth_global(c.n_layers, 6));
    c.rope_local_theta = 1.0e4;
    c.query_pre_attn_scalar = c.n_layers == 62 ? double(c.hidden_size / c.n_q_heads) : double(c.head_dim);
  }
  c.tie_word_embeddings = false;  // the loader sets it when output.weight is absent
  c.bos_token_id = get_or<int64_t>(md, "tokenizer.ggml.bos_token_id", -1, source);
  const int64_t eos = get_or<int64_t>(md, "tokenizer.ggml.eos_token_id", -1, source);
  if (eos >= 0) c.eos_token_ids = {eos};
  c.validate(source);
  return c;
}

}  // namespace kvlab
