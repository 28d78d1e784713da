#include "kvlab/tasks/protocol.h"

#include <fmt/format.h>

#include "kvlab/core/check.h"

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
  }
  return "";
}
}  // namespace

nlohmann::json TaskProtocol::to_json() const {
  return {{"protocol", question_name()},
          {"decode_rule", decode_name()},
          {"decode_rule_text", decode_text(decode)},
          {"memory", kMemory}};
}

std::string TaskProtocol::line() const {
  return fmt::format("protocol {} (question {}); decode rule {} ({}); memory {}", question_name(),
                     question == Question::whole ? "prefilled with the context, then compressed"
                                                 : "fed through the compressed context",
                     decode_name(), decode_text(decode), kMemory);
}

TaskProtocol parse_task_protocol(const std::string& protocol, const std::string& decode_rule) {
  TaskProtocol p;
  KVLAB_CHECK(protocol == "whole" || protocol == "context", "--protocol: expected whole or context, got '{}'",
              protocol);
  KVLAB_CHECK(decode_rule == "prefill" || decode_rule == "stream" || decode_rule == "rerotate",
              "--decode-rule: expected prefill, stream or rerotate, got '{}'", decode_rule);
  p.question = protocol == "whole" ? TaskProtocol::Question::whole : TaskProtocol::Question::context;
  p.decode = decode_rule == "prefill"  ? TaskProtocol::Decode::prefill
             : decode_rule == "stream" ? TaskProtocol::Decode::stream
                                       : TaskProtocol::Decode::rerotate;
  return p;
}

}  // namespace kvlab
