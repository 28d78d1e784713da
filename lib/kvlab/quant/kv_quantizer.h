// A KV-cache quantizer as a cache drives it (issue 52): the entries a layer holds, in cache order,
// are quantized oldest first, the newest kept in full precision until the scheme's window lets them
// go. One interface for every scheme; the schemes' arithmetic lives in fp8.h, affine.h and kivi.h,
// each checked bit for bit against its reference (docs/quantization.md).
//
//   kivi<b>  KIVI (Liu et al. 2024): keys per channel over groups of G = 32 tokens, values per token
//            over groups of 32 channels, b in {2, 4}; keys leave full precision in whole blocks of
//            R = 128 (T - T mod R quantized), values one at a time (T - min(T, R) quantized).
//   int<b>   transformers' QuantizedCache, quanto backend, defaults (axis 0: groups of G = 64
//            consecutive elements of one token), b in {2, 4, 8}: the prefill quantized whole, then
//            decoded tokens wait in a residual of R = 128 and leave it all at once (§1).
//   fp8      E4M3 with one float32 scale per (head, token) (amax / 448, as vLLM's dynamic per-token
//            scale), no window: every entry quantized after the step that added it.
//
// A name may end in ".r<R>" and ".g<G>" to change the window and the group ("kivi2.r32.g16").
// Stored as dequantized float32 values (simulated quantization); bytes() counts what the scheme
// stores: its codes packed b to a code plus every scale and zero point in float32 (kvlab's cache
// dtype), residual entries at float32.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvlab {

class KvQuantizer {
 public:
  virtual ~KvQuantizer() = default;
  virtual std::string name() const = 0;  // as given: "kivi2", "int4.r64"
  virtual nlohmann::json describe() const = 0;  // {"scheme", "bits", "group", "residual"}
  // How many of the oldest entries are quantized after a step that took the held entries from
  // t_before to t_after (t_before = 0: the cache as compression left it), `quantized` of them
  // quantized before the step. Never less than `quantized`: an entry once quantized stays so.
  virtual int64_t quantized_after(int64_t quantized, int64_t t_before, int64_t t_after, bool keys) const = 0;
  // Entries that newly leave full precision, x [H, n, D] float32 (n as quantized_after's step
  // allows) -> their dequantized values [H, n, D] float32; *bytes += what the scheme stores for them.
  virtual at::Tensor round_trip(const at::Tensor& x, bool keys, int64_t* bytes) const = 0;
  // What round_trip counts for n entries of H heads and head_dim D quantized together (n as
  // quantized_after allows: KIVI keys in whole groups), without quantizing anything.
  virtual int64_t stored_bytes(int64_t n, int64_t H, int64_t D, bool keys) const = 0;
  // Checked once per layer before any entry is quantized: head_dim D fits the groups. Errors name
  // the quantizer and the model's head_dim.
  virtual void check_head_dim(int64_t D) const = 0;
};

// "kivi2", "kivi4", "int2", "int4", "int8", "fp8", each optionally ".r<R>" / ".g<G>". Unknown names
// and bad windows are errors naming `flag` and the known schemes.
std::shared_ptr<const KvQuantizer> make_quantizer(const std::string& name, const std::string& flag = "--method");

struct QuantizerInfo {
  std::string name, description;
};
// The schemes, for --list-methods.
std::vector<QuantizerInfo> quantizer_list();

}  // namespace kvlab
