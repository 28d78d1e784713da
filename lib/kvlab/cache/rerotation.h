// Re-rotation while decoding (`--rerotate`; StreamingLLM's and BUZZ's code): a streaming layer's
// held keys sit at contiguous RoPE positions that end at the newest token, ordered as the tokens'
// own positions, instead of keeping the positions they were cached at.
//
// The official codes keep keys before RoPE and rotate each by its slot in the cache (0 .. m−1),
// the new token's query by its own slot; attention and the method's eviction scores both see those
// keys. RoPE logits depend only on position differences, so slots that end at the query's true
// position t (t − m + 1 .. t) give the same logits, and the model's query rotation stays as it is.
// kvlab's cache holds post-RoPE keys, so after each step (push, attend, settle) the survivors are
// rotated by δ = target − where they are now (RoPE is a rotation: exact up to float rounding); the
// next step's token arrives at t + 1, so the held set is contiguous again when it attends.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/compress/stream.h"

namespace kvlab {

struct CompressedLayer;

// A method that compresses once (kvpress's KeyRerotationPress): right after compression the kept
// keys of `l` (exact parts included) move to contiguous positions ending at the prompt's last
// position, l.n_positions − 1, in the order of the positions they hold (l.origin); decoded tokens then
// follow at their own positions, contiguous. Merged entries (origin −1) have no position to move:
// an error naming `method`.
void rerotate_kept(CompressedLayer& l, const at::Tensor& inv_freq, const std::string& method);

class Rerotation {
 public:
  // inv_freq [head_dim / 2]: the layer's RoPE frequencies; `method` names the stream in errors.
  Rerotation(at::Tensor inv_freq, std::string method);
  // Moves s's held keys to their slots (call after each settle). Every live entry (bias > −inf)
  // must be one token (pos >= 0) and s must support rotate_held; otherwise an error naming the method.
  void apply(LayerStream& s);
  // Asks s to move its keys by 0 positions, so that a stream that cannot move them (it merges or
  // keeps copies) is one error naming the method when the cache is made, before any work.
  void require_movable(LayerStream& s) const;
  // Per KV head, the position each live held entry's key is rotated to now (held() order; −1 for
  // padding): what a test compares with a one-shot rotation of the keys as they arrived.
  std::vector<std::vector<int64_t>> positions(const LayerStream& s) const;

 private:
  int64_t at(size_t h, int64_t pos) const;

  at::Tensor inv_freq_;
  std::string method_;
  // [Hkv][token position] -> the position its key is rotated to now; absent (past the end) = its own.
  std::vector<std::vector<int64_t>> at_;
};

}  // namespace kvlab
