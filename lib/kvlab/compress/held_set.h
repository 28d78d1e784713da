// The exact entries a window, h2o or tova stream holds while decoding, in buffers with room to
// grow (issue 25). A decoded token is written in place and an eviction moves the survivors forward
// in place, so a step neither copies the whole set into a new tensor (at::cat, gather) nor
// allocates one. The entries stay in the order append_exact / gather_entries (stream.h) would give
// them, the simple path the test compares with (tests/compress/test_held_set.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "kvlab/attention/attention.h"
#include "kvlab/compress/compressor.h"

namespace kvlab {

// A region's tokens as exact entries: keys, values [Hkv, n, d] (views of kv's), bias 0 [Hkv, n],
// pos [Hkv, n] = pos0 .. pos0+n-1.
KVSet region_entries(const LayerKV& kv);

// Appends x_new [H, t, ...] to `live` [H, m, ...] along dim 1: in place when `live` is the first m
// entries of `buf` and t more fit there; otherwise `live` moves into a new buffer with room for
// max(2 (m + t), 64) entries. `live` is then buf's first m + t entries. The one growth rule of
// every set that decoded tokens join: HeldSet's buffers and a compressed layer's room.
void append_in_room(at::Tensor& buf, at::Tensor& live, const at::Tensor& x_new);

class HeldSet {
 public:
  HeldSet() = default;
  // Holds a copy of s: keys, values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m] int64.
  explicit HeldSet(const KVSet& s);
  // k, v [Hkv, T, d] at positions pos0 .. pos0+T-1 join the held entries exactly (bias 0), as
  // append_exact does; the buffers double when full.
  void append(const at::Tensor& k, const at::Tensor& v, int64_t pos0);
  // Keeps, per KV head, the held entries at `rows`: Hkv rows of m' indices, row after row, each
  // strictly ascending; as gather_entries does.
  void keep_rows(const std::vector<int64_t>& rows) { compact(rows, true); }
  // Keeps the held entries at `row` (m' strictly ascending indices) in every head.
  void keep_same(const std::vector<int64_t>& row) { compact(row, false); }
  // keys, values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m]: views of the buffers' first m entries.
  const KVSet& set() const { return view_; }
  // Rotates the held keys in place by delta [Hkv, m] positions (rope.h rotate_by).
  void rotate_keys(const at::Tensor& delta, const at::Tensor& inv_freq);
  int64_t size() const { return m_; }

 private:
  void compact(const std::vector<int64_t>& keep, bool per_head);
  void refresh_view();

  KVSet buf_;       // keys, values [Hkv, capacity, d], bias [Hkv, capacity], pos [Hkv, capacity]
  KVSet view_;      // buf_'s first m_ entries
  int64_t m_ = 0;
};

}  // namespace kvlab
