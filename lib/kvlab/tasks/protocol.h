// The end-to-end protocol of a task run (issue 21; docs/methods.md §5 "End-to-end settings"): how the
// question meets the compressed cache, how memory is held while decoding, and how it is counted.
// One named object, the same for every method of a run, recorded in result.json and printed above
// every table.
//
//   question  whole    (the seed papers') the whole prompt is prefilled exactly, then compressed;
//                      the first answer token comes from the exact prefill; the question survives
//                      only through a method's own windows.
//             context  (kvpress's query-agnostic protocol, the leaderboard's) only the context is
//                      prefilled and compressed, scored with context queries only; the question and
//                      the assistant prefix are then fed through the compressed cache at the
//                      following positions, and the first answer token comes from the compressed cache.
//   decode    prefill  every method compresses once, after the prefill; decoded tokens (and, under
//                      `context`, the question) are appended exactly: kvpress's rule, and the only
//                      one under which every method holds the same memory at every step.
//             stream   the methods that compress while decoding (CompressorInfo::streaming) keep
//                      r × the tokens they have seen; the others append. Memory differs by method
//                      (rows are marked).
//   memory    counted whole: --ratio/--budget is of the whole cache, the exact sinks and windows
//             (--keep-first/--keep-last, a preset's) inside it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvlab {

struct TaskProtocol {
  enum class Question { whole, context };
  // rerotate: as stream, and kept keys move to contiguous positions after compression (kvpress's
  // KeyRerotationPress) and, for streaming methods, after every token (StreamingLLM's and BUZZ's
  // code; cache/rerotation.h).
  enum class Decode { prefill, stream, rerotate };
  Question question = Question::whole;
  Decode decode = Decode::prefill;

  std::string question_name() const { return question == Question::whole ? "whole" : "context"; }
  std::string decode_name() const {
    return decode == Decode::prefill ? "prefill" : decode == Decode::stream ? "stream" : "rerotate";
  }
  bool streams() const { return decode != Decode::prefill; }  // streaming methods compress while decoding
  // {"protocol", "decode_rule", "memory"}: for result.json.
  nlohmann::json to_json() const;
  // One line for the head of a table: "protocol whole; decode rule prefill (...); memory counted whole".
  std::string line() const;
};

// From the flags; errors name --protocol / --decode-rule and list the choices.
TaskProtocol parse_task_protocol(const std::string& protocol, const std::string& decode_rule);

}  // namespace kvlab
