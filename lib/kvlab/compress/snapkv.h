// SnapKV's selection, shared by snapkv.cpp and pyramidkv.cpp (which only changes the budget per
// layer), plus PyramidKV's layer budgets (exposed for tests).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/compress/compressor.h"

namespace kvlab {

struct SnapKVOptions {
  int64_t window = 32;             // observation window: the last `window` queries
  int64_t kernel = 7;              // 1-D pooling kernel over the key axis (odd; padding kernel/2)
  std::string pooling = "max";     // "max" | "avg"
  std::string gqa_reduce = "mean"; // over a KV group's query heads, per query
};

// Reads and validates the four SnapKV parameters (shared by snapkv and pyramidkv); `method`
// names the method in errors.
SnapKVOptions read_snapkv_options(Params& p, const std::string& method);

// Per KV head, the region indices SnapKV keeps for `budget` entries: the region keys inside the
// observation window (positions >= the window's first query) and the top-(budget − those) prefix
// keys by pooled window attention. -> [n_kv_heads, budget] int64, ascending per row, CPU.
at::Tensor snapkv_select(const LayerKV& kv, int64_t budget, const SnapKVOptions& opt);

// The pooled window score of every prefix key (the quantity SnapKV ranks), and how many region
// keys lie in the window: scores [n_kv_heads, n − n_window] float64, CPU.
at::Tensor snapkv_scores(const LayerKV& kv, const SnapKVOptions& opt, int64_t* n_window);

// PyramidKV's budget of every layer (0 = bottom) for an average of `budget` entries per layer
// over a region of n tokens: B = budget − window, min = B/beta, max = 2B − min (capped at
// n − window as KVCache-Factory does, min = 2B − max then), layer ℓ gets
// max − ℓ·(max − min)/(n_layers − 1) + window. floor_mode=false: the exact rational values with
// largest-remainder rounding, so the budgets sum exactly to n_layers·budget, each is within one
// of its exact value, and they never increase with ℓ. floor_mode=true: KVCache-Factory's integer
// arithmetic (min = B // beta, step = (max − min) // (n_layers − 1)), which overshoots.
std::vector<int64_t> pyramidkv_layer_budgets(int64_t budget, int64_t window, int64_t n,
                                             int n_layers, int64_t beta, bool floor_mode);

}  // namespace kvlab
