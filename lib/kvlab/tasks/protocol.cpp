#include "kvlab/tasks/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "kvlab/core/check.h"
#include "kvlab/core/text.h"

namespace kvlab {

namespace {
const char* kMemory = "counted whole: the budget is of the whole cache, exact sinks and windows inside it";
const char* decode_text(TaskProtocol::Decode d) {
  switch (d) {
    case TaskProtocol::Decode::prefill:
      return "every method compresses once after the prefill; later tokens are appended exactly";
    case TaskProtocol::Decode::stream:
      return "streaming methods keep r x tokens seen while decoding; the others append";
    case TaskProtocol::Decode::rerotate:
      return "as stream, kept keys re-rotated to contiguous positions after compression and, for streaming "
             "methods, after every token";
    case TaskProtocol::Decode::compress:
      return "every method compresses what it holds again every N decoded tokens, to its budget on the tokens "
             "seen: equal memory at every step";
  }
  return "";
}
}  // namespace

nlohmann::json TaskProtocol::to_json() const {
  nlohmann::json j = {{"protocol", question_name()},
                      {"decode_rule", decode_name()},
                      {"decode_rule_text", decode_text(decode)},
                      {"memory", kMemory}};
  // Only when set: a run's predictions are keyed by this object, and runs made before --ratio-of
  // existed must resume as they were.
  if (ratio_of_answer) j["ratio_of"] = "prompt+answer";
  return j;
}

std::string TaskProtocol::line() const {
  return fmt::format("protocol {} (question {}); decode rule {} ({}); memory {}", question_name(),
                     question == Question::whole ? "prefilled with the context, then compressed"
                                                 : "fed through the compressed context",
                     decode_name(), decode_text(decode), kMemory) +
         (ratio_of_answer ? "; a ratio R of the prompt and its new tokens: B = R(n + new tokens) entries from the "
                            "prefill on (Chelsea's budget)" : "");
}

int64_t ratio_of_answer_entries(double ratio, int64_t n, int64_t new_tokens) {
  return std::max<int64_t>(1, std::llround(ratio * static_cast<double>(n + new_tokens)));
}

std::string TaskProtocol::decode_name() const {
  switch (decode) {
    case Decode::prefill: return "prefill";
    case Decode::stream: return "stream";
    case Decode::rerotate: return "rerotate";
    case Decode::compress: return fmt::format("compress:{}", every);
  }
  return "";
}

TaskProtocol parse_task_protocol(const std::string& protocol, const std::string& decode_rule,
                                 const std::string& ratio_of) {
  TaskProtocol p;
  KVLAB_CHECK(ratio_of == "prompt" || ratio_of == "prompt+answer",
              "--ratio-of: expected prompt or prompt+answer, got '{}'", ratio_of);
  p.ratio_of_answer = ratio_of == "prompt+answer";
  KVLAB_CHECK(!p.ratio_of_answer || protocol == "whole",
              "--ratio-of prompt+answer needs --protocol whole (the budget counts the prompt the cache holds "
              "whole), got --protocol {}", protocol);
  KVLAB_CHECK(protocol == "whole" || protocol == "context", "--protocol: expected whole or context, got '{}'",
              protocol);
  p.question = protocol == "whole" ? TaskProtocol::Question::whole : TaskProtocol::Question::context;
  const std::string rule = decode_rule.substr(0, decode_rule.find(':'));
  KVLAB_CHECK(rule == "prefill" || rule == "stream" || rule == "rerotate" || rule == "compress",
              "--decode-rule: expected prefill, stream, rerotate or compress[:N], got '{}'", decode_rule);
  KVLAB_CHECK(rule == "compress" || rule == decode_rule, "--decode-rule {}: only compress takes a number, got '{}'",
              rule, decode_rule);
  p.decode = rule == "prefill"    ? TaskProtocol::Decode::prefill
             : rule == "stream"   ? TaskProtocol::Decode::stream
             : rule == "rerotate" ? TaskProtocol::Decode::rerotate
                                  : TaskProtocol::Decode::compress;
  if (p.decode == TaskProtocol::Decode::compress) {
    p.every = 512;
    if (rule != decode_rule) {
      const std::string n = decode_rule.substr(rule.size() + 1);
      const std::optional<int64_t> v = parse_int64(n);
      KVLAB_CHECK(v && *v >= 1 && *v <= (int64_t(1) << 40),
                  "--decode-rule compress:N: N (decoded tokens between compressions) must be a whole number >= 1, "
                  "got '{}'", n);
      p.every = *v;
    }
  }
  return p;
}

}  // namespace kvlab
