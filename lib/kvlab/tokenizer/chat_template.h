// Named chat templates of the supported model families, written out in C++ (no Jinja engine):
//   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//   smollm2  chatml with SmolLM2-Instruct's default system prompt (from its GGUF
//            tokenizer.chat_template) when the conversation has none
//   qwen2    chatml with Qwen2-Instruct's default system prompt "You are a helpful assistant."
//   llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
//   llama2   [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {reply} </s><s>[INST] ...
//   vicuna   FastChat vicuna_v1.1 (LongChat, as LongBench builds it): "{system} USER: {user} ASSISTANT:"
//   none     the message contents joined by "\n" (the raw prompt for base models)
// The leading BOS token is never part of the string: encode the result with add_bos=true, and
// the tokenizer adds it exactly when the model family expects it (Llama 2/3 yes, SmolLM2 no).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

class Tokenizer;

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;
};

// The names --chat-template accepts, besides "auto".
const std::vector<std::string>& chat_template_names();

// Throws kvlab::Error for an unknown name (listing the names and the closest one), a role other
// than system/user/assistant, or a system message that is not first.
std::string apply_chat_template(const std::string& name, const std::vector<ChatMessage>& msgs,
                                bool add_generation_prompt);

// What `auto` looks at. All fields optional.
struct ChatTemplateHints {
  const Tokenizer* tokenizer = nullptr;  // special tokens in the vocabulary
  std::string model_name;                // e.g. directory name, GGUF general.name / basename
  std::string jinja;                     // tokenizer.chat_template (GGUF or tokenizer_config.json)
};

// The template name a Jinja chat_template string implements, or "" if not recognised.
std::string detect_chat_template(std::string_view jinja);

// Resolves a --chat-template value: "auto" picks from the hints (Jinja text, then model name,
// then the tokenizer's special tokens; "none" when nothing matches, e.g. base models); other
// values are checked against chat_template_names().
std::string resolve_chat_template(const std::string& flag, const ChatTemplateHints& hints);

}  // namespace kvlab
