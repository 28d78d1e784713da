// Checked sizes (issue 26): whether token counts fit a model's context, without int64 overflow.
//
// "length + max new tokens <= context" overflowed for a flag like --max-new-tokens
// 9223372036854775807: the sum wrapped negative, the check passed and decoding ran past the
// model's positions until killed. Every such check goes through fits_context.
#pragma once

#include <cstdint>

namespace kvlab {

// The most tokens any count may ask for when a model states no context (2^24, 16.7 M).
constexpr int64_t kMaxTokens = int64_t(1) << 24;

// Whether `used` tokens and `more` after them fit `context` positions: both >= 0 and
// used + more <= context, computed without overflow. context <= 0 (unknown) bounds the sum by
// kMaxTokens instead.
inline bool fits_context(int64_t used, int64_t more, int64_t context) {
  const int64_t limit = context > 0 ? context : kMaxTokens;
  return used >= 0 && more >= 0 && used <= limit && more <= limit - used;
}

}  // namespace kvlab
