#include "kvlab/model/model_tokenizer.h"

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/io/gguf.h"

#include <filesystem>

namespace kvlab {

namespace fs = std::filesystem;

Tokenizer load_model_tokenizer(const ModelSource& src) {
  if (src.kind == ModelSource::Kind::hf_dir) return Tokenizer::from_model_dir(src.tokenizer_path);
  GgufFile g(src.tokenizer_path);
  KVLAB_CHECK(g.has("tokenizer.ggml.tokens"), "{}: has no tokenizer.ggml.tokens (no embedded "
              "vocabulary; pass --prompt-ids instead of --prompt)", g.path());
  TokenizerVocab v;
  v.model = g.get_string("tokenizer.ggml.model");
  v.pre = g.get_string_or("tokenizer.ggml.pre", "");
  v.tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (g.has("tokenizer.ggml.scores"))
    for (double s : g.get_float_array("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(s));
  if (g.has("tokenizer.ggml.token_type"))
    for (int64_t t : g.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
  if (g.has("tokenizer.ggml.merges")) v.merges = g.get_string_array("tokenizer.ggml.merges");
  v.bos_id = g.get_int_or("tokenizer.ggml.bos_token_id", -1);
  v.eos_id = g.get_int_or("tokenizer.ggml.eos_token_id", -1);
  v.unk_id = g.get_int_or("tokenizer.ggml.unknown_token_id", -1);
  // llama.cpp's default: add BOS for SentencePiece vocabularies, not for byte-level BPE.
  v.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", v.model == "llama");
  v.add_space_prefix = g.get_bool_or("tokenizer.ggml.add_space_prefix", true);
  return Tokenizer::from_vocab(v);
}

ModelTemplateInfo model_template_info(const ModelSource& src) {
  ModelTemplateInfo info;
  if (src.kind == ModelSource::Kind::gguf) {
    GgufFile g(src.path);
    info.jinja = g.get_string_or("tokenizer.chat_template", "");
    info.model_name = g.get_string_or("general.name", fs::path(src.path).stem().string());
  } else {
    info.model_name = fs::path(src.path).filename().string();
    const fs::path tc = fs::path(src.path) / "tokenizer_config.json";
    if (fs::exists(tc)) {
      nlohmann::json j = read_json_file(tc.string());
      if (j.contains("chat_template") && j["chat_template"].is_string())
        info.jinja = j["chat_template"].get<std::string>();
    }
  }
  return info;
}

std::string apply_model_chat_template(const std::string& flag_value, const ModelSource& src,
                                      const Tokenizer& tok, const std::string& prompt,
                                      std::string* resolved_name) {
  return apply_model_chat_messages(flag_value, src, tok, {ChatMessage{"user", prompt}}, resolved_name);
}

std::string resolve_model_chat_template(const std::string& flag_value, const ModelSource& src, const Tokenizer& tok) {
  ChatTemplateHints hints;
  hints.tokenizer = &tok;
  if (flag_value == "auto") {
    ModelTemplateInfo info = model_template_info(src);
    hints.jinja = info.jinja;
    hints.model_name = info.model_name;
  }
  return resolve_chat_template(flag_value, hints);
}

std::string apply_model_chat_messages(const std::string& flag_value, const ModelSource& src,
                                      const Tokenizer& tok, const std::vector<ChatMessage>& msgs,
                                      std::string* resolved_name) {
  const std::string name = resolve_model_chat_template(flag_value, src, tok);
  if (resolved_name) *resolved_name = name;
  return apply_chat_template(name, msgs, /*add_generation_prompt=*/true);
}

}  // namespace kvlab
