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
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvlab {

constexpr int kCaptureVersion = 1;

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
  // Opens and validates the whole structure (version, attributes, every dataset's presence, shape
  // and dtype); errors name the file, the dataset and expected vs found.
  explicit CaptureReader(const std::string& path);
  ~CaptureReader();
  CaptureReader(CaptureReader&&) noexcept;

  const CaptureMeta& meta() const;
  const std::string& path() const;
  int64_t n_samples() const;
  const SampleInfo& sample(int64_t i) const;
  at::Tensor tokens(int64_t sample) const;  // int64 [n_tokens]
  // layer: a model layer index listed in meta().layers.
  LayerQKV read_layer(int64_t sample, int layer, at::ScalarType as = at::kFloat) const;
  // One KV head (and its group's query heads) without reading the rest:
  // q [group, n_q, head_dim], k, v [1, n_tokens, head_dim].
  LayerQKV read_kv_head(int64_t sample, int layer, int kv_head, at::ScalarType as = at::kFloat) const;
  // Bytes on disk of the file, and of q/k/v if stored uncompressed.
  int64_t file_bytes() const;
  int64_t raw_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvlab
