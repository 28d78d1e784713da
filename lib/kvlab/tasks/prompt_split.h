// Where a task prompt's context ends and its question begins (issue 21, --protocol context).
//
// A task knows the split as a character offset in the prompt text (LongBench: where the template's
// text after {context} starts; LongEval and XSUM: the last paragraph, "\n\n…"; NIAH: the end of the
// haystack message). The prompt is tokenized once, whole, exactly as under --protocol whole, and
// the context is the longest common prefix of those ids and the ids of the text up to the offset:
// a token that spans the boundary goes to the question. So both protocols see the same token ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

class Tokenizer;

struct SplitPrompt {
  std::vector<int64_t> ids;  // encode(text, add_bos)
  int64_t context_len = -1;  // ids[0, context_len) are the context; -1 = no split (offset unknown)
};

// `context_end`: the offset in `text` where the question starts; std::string::npos = unknown.
SplitPrompt encode_split(const Tokenizer& tok, const std::string& text, size_t context_end, bool add_bos = true);

// The offset in `templated` (a chat template applied around `raw`) of offset `raw_offset` of raw:
// npos when either is unknown or raw does not occur in templated verbatim.
size_t offset_in(const std::string& templated, const std::string& raw, size_t raw_offset);

// The offset where the last paragraph ("\n\n" and what follows) of `text` starts; npos if none.
size_t last_paragraph(const std::string& text);

}  // namespace kvlab
