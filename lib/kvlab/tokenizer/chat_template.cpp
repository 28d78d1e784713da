// Chat templates as plain string building. Each template follows the Jinja chat_template the
// model family ships (quoted in the comment above its function) so prompts match transformers'
// apply_chat_template() character for character.
#include "kvlab/tokenizer/chat_template.h"

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"  // closest_match
#include "kvlab/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>

namespace kvlab {

namespace {

const char* const kSmolLM2System = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
const char* const kQwen2System = "You are a helpful assistant.";
// Qwen2.5's templates (Instruct and Coder-Instruct) hold this one, which contains Qwen2's: test it first.
const char* const kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
const char* const kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
    "helpful, detailed, and polite answers to the user's questions.";

// Jinja's `trim` / Python's str.strip(): ASCII whitespace at both ends.
std::string trim(const std::string& s) {
  auto ws = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  size_t b = 0, e = s.size();
  while (b < e && ws(s[b])) ++b;
  while (e > b && ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

void check_roles(const std::vector<ChatMessage>& msgs) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    KVLAB_CHECK(r == "system" || r == "user" || r == "assistant",
                "chat message {} has role '{}'; expected system, user or assistant", i, r);
    KVLAB_CHECK(r != "system" || i == 0, "chat message {} is a system message; only the first may be", i);
  }
}

// {% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}
// {{ '<|im_start|>system\n<DEFAULT><|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role']
// + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}
// {{ '<|im_start|>assistant\n' }}{% endif %}
std::string chatml(const std::vector<ChatMessage>& msgs, bool gen, const char* default_system) {
  std::string out;
  if (default_system && !msgs.empty() && msgs[0].role != "system")
    out += std::string("<|im_start|>system\n") + default_system + "<|im_end|>\n";
  for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// {{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] +
// '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}
// {% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
std::string llama3(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Llama-2-chat: user turns alternate with assistant turns; the system prompt goes inside the
// first [INST] as <<SYS>>...<</SYS>>; {{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
// for users, {{ ' ' + content.strip() + ' ' + eos_token }} for assistants. The generation
// prompt is the trailing [/INST] itself.
std::string llama2(const std::vector<ChatMessage>& msgs) {
  std::string out, system;
  size_t first = 0;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    first = 1;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const bool want_user = (i - first) % 2 == 0;
    KVLAB_CHECK((msgs[i].role == "user") == want_user,
                "chat template llama2: roles must alternate user/assistant/user/...; message {} is '{}'",
                i, msgs[i].role);
    std::string content = msgs[i].content;
    if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (want_user) out += std::string(i == first ? "" : "<s>") + "[INST] " + trim(content) + " [/INST]";
    else out += " " + trim(content) + " </s>";
  }
  return out;
}

// FastChat's vicuna_v1.1 (SeparatorStyle.ADD_COLON_TWO, sep " ", sep2 "</s>"), used for
// LongChat by LongBench and LongEval.
std::string vicuna(const std::vector<ChatMessage>& msgs, bool gen) {
  size_t first = 0;
  std::string out = kVicunaSystem;
  if (!msgs.empty() && msgs[0].role == "system") {
    out = msgs[0].content;
    first = 1;
  }
  out += " ";
  for (size_t i = first; i < msgs.size(); ++i) {
    const bool user = msgs[i].role == "user";
    out += (user ? "USER: " : "ASSISTANT: ") + msgs[i].content + (user ? " " : "</s>");
  }
  if (gen) out += "ASSISTANT:";
  return out;
}

std::string none(const std::vector<ChatMessage>& msgs) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) out += (i ? "\n" : "") + msgs[i].content;
  return out;
}

std::string check_name(const std::string& name, const char* what) {
  const auto& names = chat_template_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return name;
  const std::string close = closest_match(name, names);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  KVLAB_FAIL("{} '{}' is not a chat template.{} Available: auto, {}", what, name,
             close.empty() ? "" : " Did you mean: " + close + "?", list);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = {"chatml", "smollm2", "qwen2", "qwen2.5", "llama3",
                                                 "llama2", "vicuna",  "none"};
  return names;
}

std::string apply_chat_template(const std::string& name, const std::vector<ChatMessage>& msgs,
                                bool add_generation_prompt) {
  check_name(name, "--chat-template");
  check_roles(msgs);
  if (name == "chatml") return chatml(msgs, add_generation_prompt, nullptr);
  if (name == "smollm2") return chatml(msgs, add_generation_prompt, kSmolLM2System);
  if (name == "qwen2") return chatml(msgs, add_generation_prompt, kQwen2System);
  if (name == "qwen2.5") return chatml(msgs, add_generation_prompt, kQwen25System);
  if (name == "llama3") return llama3(msgs, add_generation_prompt);
  if (name == "llama2") return llama2(msgs);
  if (name == "vicuna") return vicuna(msgs, add_generation_prompt);
  return none(msgs);
}

std::string detect_chat_template(std::string_view jinja) {
  auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) {
    if (has("SmolLM")) return "smollm2";
    if (has(kQwen25System)) return "qwen2.5";
    if (has(kQwen2System)) return "qwen2";
    return "chatml";
  }
  if (has("<|start_header_id|>")) return "llama3";
  if (has("[INST]")) return "llama2";
  if (has("USER:") && has("ASSISTANT:")) return "vicuna";
  return "";
}

std::string resolve_chat_template(const std::string& flag, const ChatTemplateHints& hints) {
  if (flag != "auto") return check_name(flag, "--chat-template");
  if (std::string t = detect_chat_template(hints.jinja); !t.empty()) return t;
  const std::string model = lower(hints.model_name);
  auto has = [&](const char* s) { return model.find(s) != std::string::npos; };
  if (has("smollm")) return "smollm2";
  if (has("qwen2.5") || has("qwen2_5") || has("qwen-2.5")) return "qwen2.5";
  if (has("qwen")) return "qwen2";
  if (has("longchat") || has("vicuna")) return "vicuna";
  if ((has("llama-3") || has("llama3")) && has("instruct")) return "llama3";
  if ((has("llama-2") || has("llama2")) && has("chat")) return "llama2";
  if (hints.tokenizer) {
    if (hints.tokenizer->token_id("<|im_start|>") >= 0) return "chatml";
    if (hints.tokenizer->token_id("<|start_header_id|>") >= 0) return "llama3";
  }
  return "none";
}

}  // namespace kvlab
