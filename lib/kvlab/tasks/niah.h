// Needle in a haystack (gkamradt/LLMTest_NeedleInAHaystack, as BalanceKV and kvpress run it):
// Paul Graham essays cut to a context length in tokens, one needle sentence inserted at a depth
// (percent of the context), the model asked the retrieval question. Followed from the original:
//   - the haystack is the essays concatenated (repeated until long enough), encoded and cut to
//     context_length − 200 tokens (its final_context_length_buffer, room for the question and
//     template), minus the needle's tokens;
//   - depth 100 appends the needle; otherwise the insertion point is ⌊len·depth/100⌋, moved back
//     until the token before it is the tokenizer's "." (the needle starts a sentence);
//   - the prompt is its OpenAI message layout: system "You are a helpful AI bot that answers
//     questions for a user. Keep your response short and direct", user = the context, user =
//     "<question> Don't give information outside the document or repeat your findings".
// Deviations: the essays are read in sorted file-name order (the original takes glob order, which
// the filesystem decides); the score is not a GPT-4 judge but whether the output contains the
// needle's key phrase (case-insensitive), with rouge-score's ROUGE-1 recall of the needle beside it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

class Tokenizer;

struct NiahSpec {
  std::string needle = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
  std::string question = "What is the best thing to do in San Francisco?";
  std::string key_phrase = "eat a sandwich and sit in Dolores Park";
  int64_t buffer = 200;  // tokens left out of the haystack for the question and template
};

// The essays of `dir` (*.txt, sorted by name) concatenated. Errors name the folder.
std::string read_haystack(const std::string& dir);

struct NiahCase {
  std::string id;          // "len<L>_depth<D>"
  int64_t context_length;  // L, the target prompt length in tokens
  double depth;            // D, percent
  std::string context;     // the haystack with the needle, decoded back to text
  int64_t needle_token;    // index of the needle's first token in the context's tokens
  int64_t context_tokens;  // tokens of the context
};

// The context for one (length, depth) cell. `haystack` is read_haystack's text.
NiahCase make_niah_case(const Tokenizer& tok, const std::string& haystack, const NiahSpec& spec,
                        int64_t context_length, double depth);

// {"score": 1 if the output contains the key phrase (case-insensitive) else 0,
//  "rouge1_recall": rouge-score ROUGE-1 recall of gold["needle"] by the output}
nlohmann::json niah_score(const std::string& output, const nlohmann::json& gold);

}  // namespace kvlab
