// How much of a region a compressor may keep: one type from the flags (--ratio, --budget, --T) to
// the compressor, validated once, when it is made.
//
//   ratio     fraction of the region's tokens kept, in (0, 1]      -> llround(ratio * n) entries
//   entries   entries per KV head, >= 1                            -> min(entries, n)
//   halvings  T halvings (BalanceKV, uniform-halving, Chelsea),    -> ⌊n / 2^T⌋ entries
//             in [0, kMaxHalvings]
//   bytes     fraction of the full-precision K and V bytes kept,   -> ⌊bytes * n⌋ entries
//             in (0, 1] (issue 52)                                     (unquantized; a quantized
//             branch keeps more: quant/quantized_part.h entries_for_bytes, resolved per layer)
// Every form resolves on a region of n >= 1 tokens to an entry count in [1, n].
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kvlab {

struct Budget {
  enum class Kind { unset, ratio, entries, halvings, bytes };
  static constexpr int kMaxHalvings = 30;

  Kind kind = Kind::unset;
  double ratio = -1;     // Kind::ratio
  int64_t entries = -1;  // Kind::entries
  int halvings = -1;     // Kind::halvings
  double bytes = -1;     // Kind::bytes

  // Validated constructors; errors name the flag (--ratio, --budget, --T).
  static Budget of_ratio(double ratio);
  static Budget of_entries(int64_t entries);
  static Budget of_halvings(int64_t halvings);
  static Budget of_bytes(double fraction);

  bool is_set() const { return kind != Kind::unset; }
  bool is_halvings() const { return kind == Kind::halvings; }
  // Entries per KV head for a region of n tokens: in [1, n] when n >= 1, 0 when n = 0.
  int64_t entries_for(int64_t n) const;

  std::string label() const;        // "ratio=0.2" | "budget=64" | "T=2" | "bytes=0.25"
  nlohmann::json to_json() const;   // {"ratio": r} | {"budget": b} | {"T": t} | {"bytes": f}
};

}  // namespace kvlab
