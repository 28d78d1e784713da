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
//             compress every method compresses again every N decoded tokens (compress:N, default
//                      512), to r × the tokens seen: equal memory at every step.
//   memory    counted whole: --ratio/--budget is of the whole cache, the exact sinks and windows
//             (--keep-first/--keep-last, a preset's) inside it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kvlab {

struct TaskProtocol {
  enum class Question { whole, context };
  // rerotate: as stream, and kept keys move to contiguous positions after compression (kvpress's
  // KeyRerotationPress) and, for streaming methods, after every token (StreamingLLM's and BUZZ's
  // code; cache/rerotation.h).
  // compress: every method compresses what it holds again every `every` decoded tokens, to its
  // budget on the tokens seen (kvpress's DecodingPress / CompressionRatioDecodingPress with the
  // method as the scorer; compress/decoding_stream.h): equal memory at every step.
  enum class Decode { prefill, stream, rerotate, compress };
  Question question = Question::whole;
  Decode decode = Decode::prefill;
  int64_t every = 0;  // Decode::compress: decoded tokens between compressions ("compress:N"; 512)
  // --ratio-of prompt+answer: a ratio R holds B = round(R * (n + G)) entries per (layer, KV head), n
  // the prompt's tokens and G the record's new tokens (Chelsea §7's budget B = R(n + G)), fixed from
  // the prefill on: prefill-only methods keep min(B, n) and append, streaming methods hold B as a
  // cache of B entries. false (--ratio-of prompt): R of the prompt, R * n.
  bool ratio_of_answer = false;

  std::string question_name() const { return question == Question::whole ? "whole" : "context"; }
  // "prefill", "stream", "rerotate" or "compress:N".
  std::string decode_name() const;
  // Streaming methods compress while decoding by their own rule (stream, rerotate).
  bool streams() const { return decode == Decode::stream || decode == Decode::rerotate; }
  // Some branch compresses while decoding (its cache then takes a suffix token by token).
  bool compresses_while_decoding() const { return decode != Decode::prefill; }
  // {"protocol", "decode_rule", "memory"}: for result.json.
  nlohmann::json to_json() const;
  // One line for the head of a table: "protocol whole; decode rule prefill (...); memory counted whole".
  std::string line() const;
};

// From the flags; errors name --protocol / --decode-rule / --ratio-of and list the choices.
TaskProtocol parse_task_protocol(const std::string& protocol, const std::string& decode_rule,
                                 const std::string& ratio_of = "prompt");

// The entries a --ratio R branch holds under --ratio-of prompt+answer for a prompt of n tokens and
// up to `new_tokens` generated ones: round(R * (n + new_tokens)), at least 1.
int64_t ratio_of_answer_entries(double ratio, int64_t n, int64_t new_tokens);

}  // namespace kvlab
