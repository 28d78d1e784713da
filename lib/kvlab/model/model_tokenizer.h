// The tokenizer and chat-template hints that belong to a resolved --model: tokenizer.json or
// llama2.c tok*.bin in a HF directory; the `tokenizer.ggml.*` vocabulary of a GGUF file.
#pragma once

#include "kvlab/model/model.h"
#include "kvlab/tokenizer/chat_template.h"
#include "kvlab/tokenizer/tokenizer.h"

#include <string>

namespace kvlab {

Tokenizer load_model_tokenizer(const ModelSource& src);

// The Jinja chat template the model ships (GGUF tokenizer.chat_template, or tokenizer_config.json's
// chat_template in a HF directory), "" if none; and a display name (GGUF general.name / the
// directory name) for `--chat-template auto`.
struct ModelTemplateInfo {
  std::string jinja;
  std::string model_name;
};
ModelTemplateInfo model_template_info(const ModelSource& src);

// Resolves --chat-template for this model and applies it to a single user prompt. "none" returns
// the prompt unchanged. The result is meant for tokenizer.encode(text, add_bos=true).
std::string apply_model_chat_template(const std::string& flag_value, const ModelSource& src,
                                      const Tokenizer& tok, const std::string& prompt,
                                      std::string* resolved_name = nullptr);

// The template name --chat-template resolves to for this model ("auto" reads the model's hints).
std::string resolve_model_chat_template(const std::string& flag_value, const ModelSource& src, const Tokenizer& tok);

// The same for a conversation (system and user messages); "none" joins the contents with "\n".
std::string apply_model_chat_messages(const std::string& flag_value, const ModelSource& src,
                                      const Tokenizer& tok, const std::vector<ChatMessage>& msgs,
                                      std::string* resolved_name = nullptr);

}  // namespace kvlab
