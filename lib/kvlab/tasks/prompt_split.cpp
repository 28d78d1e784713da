#include "kvlab/tasks/prompt_split.h"

#include <algorithm>

#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

SplitPrompt encode_split(const Tokenizer& tok, const std::string& text, size_t context_end, bool add_bos) {
  SplitPrompt out;
  out.ids = tok.encode(text, add_bos);
  if (context_end == std::string::npos || context_end > text.size()) return out;
  const std::vector<int64_t> ctx = tok.encode(text.substr(0, context_end), add_bos);
  const size_t common = static_cast<size_t>(
      std::mismatch(ctx.begin(), ctx.end(), out.ids.begin(), out.ids.end()).first - ctx.begin());
  // The last common token may still be cut by the boundary (a merge that continues in the question
  // would have differed; one that ends exactly there is the context's).
  out.context_len = static_cast<int64_t>(common);
  return out;
}

size_t offset_in(const std::string& templated, const std::string& raw, size_t raw_offset) {
  if (raw_offset == std::string::npos || raw.empty()) return std::string::npos;
  const size_t at = templated.find(raw);
  return at == std::string::npos ? std::string::npos : at + raw_offset;
}

size_t last_paragraph(const std::string& text) { return text.rfind("\n\n"); }

}  // namespace kvlab
