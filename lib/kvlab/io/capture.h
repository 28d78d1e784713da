// The capture format: post-RoPE q/k/v per sample and layer in one HDF5 file
// (docs/capture-format.md is the reference; bump kCaptureVersion when the layout changes).
//
//   /                     attrs: kvlab_capture_version, model_id, architecture, n_layers,
//                                n_q_heads, n_kv_heads, head_dim, rope_theta, rope_scaling,
//                                dtype, layers, queries, source_dataset, kvlab_version, git_sha
//   /sample_0000          attrs: sample_id, n_tokens, n_q, q_start
//   /sample_0000/tokens   int32 [n_tokens]
//   /sample_0000/layer_00/q   [n_q_heads,  n_q,      head_dim]  (positions q_start .. n_tokens-1)
//   /sample_0000/layer_00/k   [n_kv_heads, n_tokens, head_dim]
//   /sample_0000/layer_00/v   [n_kv_heads, n_tokens, head_dim]
//
// String attributes are fixed-length (version 2). Version 1 wrote variable-length strings, which
// HDF5 reads from its global heap through an id stored in the file; a corrupted id crashes HDF5
// itself (1.10: H5HG_read indexes past the heap), and no check before the read can tell a bad id
// from a good one. So the reader refuses version-1 captures with one line saying that version 2 is
// needed (re-run 'kvlab dump' or 'kvlab synth'), rather than read them.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvlab {

constexpr int kCaptureVersion = 2;

// Bounds on a capture's attributes that the reader enforces and the writer respects, so that a
// corrupted attribute cannot make the reader allocate terabytes; real models lie far inside them.
struct CaptureLimits {
  static constexpr int64_t max_layers = 4096;
  static constexpr int64_t max_heads = 4096;                  // n_q_heads and n_kv_heads
  static constexpr int64_t max_head_dim = 16384;
  static constexpr int64_t max_tokens = int64_t(1) << 26;     // per sample
  static constexpr int64_t max_samples = int64_t(1) << 24;
  static constexpr int64_t max_string_bytes = int64_t(1) << 16;  // one string attribute
  static constexpr int64_t max_chunk_bytes = int64_t(1) << 28;   // one HDF5 chunk of q/k/v
  // The least the part of a chunk in one head holds: this many bytes, or the head's whole
  // [n, head_dim] (a rank-1 dataset: all of it) when that is less. The writers' [1, min(n, 4096),
  // head_dim] chunks always do.
  static constexpr int64_t min_chunk_bytes = int64_t(1) << 12;
};

// Storage dtype names: "float32", "float16", "bfloat16".
at::ScalarType parse_storage_dtype(const std::string& name, const std::string& flag);
std::string storage_dtype_name(at::ScalarType t);

struct CaptureMeta {
  std::string model_id;            // e.g. "smollm2-135m" or a path
  std::string architecture;        // "llama", "mistral", "qwen2", "synthetic", ...
  int n_layers = 0;                // layers of the model
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling;     // null or the config's rope_scaling object
  std::string dtype = "float32";   // storage dtype of q/k/v
  std::vector<int> layers;         // captured layers (0-based), ascending
  std::string queries = "all";     // "all" or "last:N"
  std::string source_dataset;      // dataset spec or "synthetic:..." or "prompt"
  std::string kvlab_version, git_sha;  // filled by the writer
};

struct SampleInfo {
  std::string sample_id;
  int64_t n_tokens = 0;
  int64_t n_q = 0;       // captured query positions: q_start .. n_tokens - 1
  int64_t q_start = 0;
};

// One (sample, layer), loaded as float32 unless asked otherwise.
struct LayerQKV {
  at::Tensor q;  // [n_q_heads,  n_q,      head_dim]
  at::Tensor k;  // [n_kv_heads, n_tokens, head_dim]
  at::Tensor v;  // [n_kv_heads, n_tokens, head_dim]
};

// Streams a capture: samples one after another, layers one after another, each written as it
// arrives. Writes to "<path>.partial" and renames on finish(); an unfinished writer removes the
// partial file, so an existing file at `path` is never lost to a failed run.
class CaptureWriter {
 public:
  CaptureWriter(const std::string& path, CaptureMeta meta);
  ~CaptureWriter();
  CaptureWriter(const CaptureWriter&) = delete;
  CaptureWriter& operator=(const CaptureWriter&) = delete;

  // tokens: int64 or int32 [n_tokens]; n_q: how many trailing query positions will be written.
  void begin_sample(const std::string& sample_id, const at::Tensor& tokens, int64_t n_q);
  // q [n_q_heads, n_q or n_tokens, head_dim] (only the last n_q are kept),
  // k, v [n_kv_heads, n_tokens, head_dim]; any float dtype, any device.
  void write_layer(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  void end_sample();
  // Checks every sample has every layer, writes the completion mark, renames into place.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CaptureReader {
 public:
  // Opens and validates the whole structure before reading any q/k/v: the version, every
  // attribute's type class, size, string kind, value count and range, every object's link kind,
  // and every dataset's presence, shape (against the attributes), type, layout, filters and chunk
  // size. Any failure, HDF5's own included, is one kvlab::Error naming the file and the object
  // (group, dataset or attribute path) and expected vs found.
  explicit CaptureReader(const std::string& path);
  // The same from a file image in memory (the bytes of an HDF5 file; copied): `name` stands for
  // the path in messages and in path(). For fuzzing and for captures that never touch disk.
  static CaptureReader from_image(const void* data, size_t size, const std::string& name);
  ~CaptureReader();
  CaptureReader(CaptureReader&&) noexcept;

  const CaptureMeta& meta() const;
  const std::string& path() const;
  int64_t n_samples() const;
  const SampleInfo& sample(int64_t i) const;
  at::Tensor tokens(int64_t sample) const;  // int64 [n_tokens]
  // layer: a model layer index listed in meta().layers. Corrupted q/k/v bytes are an error
  // (Fletcher32 checksums, written since version 2), never values. NaN/Inf are returned as read:
  // see find_nonfinite / check_finite below.
  LayerQKV read_layer(int64_t sample, int layer, at::ScalarType as = at::kFloat) const;
  // One KV head (and its group's query heads) without reading the rest:
  // q [group, n_q, head_dim], k, v [1, n_tokens, head_dim].
  LayerQKV read_kv_head(int64_t sample, int layer, int kv_head, at::ScalarType as = at::kFloat) const;
  // Bytes of the file (or image), and of q/k/v if stored uncompressed.
  int64_t file_bytes() const;
  int64_t raw_bytes() const;

 private:
  struct Impl;
  explicit CaptureReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The metadata summary 'kvlab inspect' prints (model, architecture, samples and their lengths,
// layers, dtype, shapes, sizes) as JSON; reads no q/k/v.
nlohmann::json capture_summary(const CaptureReader& r);

// ---- non-finite values (NaN, +Inf, -Inf) in q/k/v ----

// Where one (sample, layer) has non-finite values: how many, and the first of them, looking at q,
// then k, then v, each in [head, position, dim] order.
struct NonFinite {
  int64_t count = 0;      // over q, k and v together; 0: all finite
  std::string tensor;     // "q", "k" or "v"
  int head = -1;          // a query head for q, a KV head for k and v
  int64_t position = -1;  // token position in the sample (q's row i is position q_start + i)
  int64_t dim = -1;
  double value = 0;       // nan, inf or -inf
};

// qkv: one (sample, layer) as read_layer returns it (any float dtype; q [n_q_heads, n_q, head_dim],
// k, v [n_kv_heads, n_tokens, head_dim]); q_start: the sample's SampleInfo::q_start.
NonFinite find_nonfinite(const LayerQKV& qkv, int64_t q_start);
// "v = nan at KV head 1, position 17 (dim 4)"
std::string describe_nonfinite(const NonFinite& nf);
// Throws kvlab::Error if any value of one (sample, layer) of `cap` is NaN or infinite, e.g.
//   capture 'c.h5': sample 1 ('doc_7'), layer 2: 3 non-finite values in q/k/v; the first is
//   v = nan at KV head 1, position 17 (dim 4)
// qkv: that (sample, layer) as read by cap.read_layer(sample, layer) (the caller usually has it
// already: replay checks each unit it loads).
void check_finite(const CaptureReader& cap, int64_t sample, int layer, const LayerQKV& qkv);

// Every (sample, layer) of a capture read once, one at a time.
struct CaptureNonFinite {
  int64_t count = 0;   // non-finite values in the whole capture
  int64_t units = 0;   // (sample, layer) units with at least one
  int64_t sample = -1;  // the first such unit, in sample then layer order
  int layer = -1;
  NonFinite first;      // its first value
};
CaptureNonFinite scan_nonfinite(const CaptureReader& cap);

}  // namespace kvlab
