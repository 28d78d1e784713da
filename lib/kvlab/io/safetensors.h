// Hugging Face safetensors, parsed here with nlohmann/json (no Rust or Python library).
//
// File layout (https://github.com/huggingface/safetensors#format):
//   u64 little-endian N | N bytes of JSON header | data section
//   header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//            "data_offsets": [begin, end]}, ...}   offsets are relative to the data section.
//
// Everything is validated before any tensor is touched: header length (<= 100 MB and inside the
// file), JSON syntax, each tensor's dtype (F32/F16/BF16; anything else is an error naming the
// tensor), shape product x element size == byte range, byte range inside the data section, and
// no two tensors overlapping. Files are memory-mapped; `get` copies into an owned tensor.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvlab {

// A read-only memory map of a whole file (RAII). Also used by the GGUF reader.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor inside a mapped file (or buffer); `data` points into it and is NOT aligned in general.
struct TensorView {
  std::string name;
  at::ScalarType dtype = at::kFloat;  // kFloat, kHalf or kBFloat16
  std::vector<int64_t> shape;         // row-major, as stored
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// The parsed header of one safetensors file.
struct SafetensorsHeader {
  std::vector<TensorView> tensors;  // in header order
  nlohmann::json metadata = nlohmann::json::object();  // "__metadata__" (string -> string)
  size_t data_offset = 0;           // 8 + header length
};

// Largest accepted JSON header (the reference implementation uses the same limit).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u * 1000u * 1000u;

// Parses and validates a whole safetensors file held in memory. `source` names it in errors.
// Throws kvlab::Error on any malformed input; TensorView::data points into `data`.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& source);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return header_.tensors; }
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const nlohmann::json& metadata() const { return header_.metadata; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// Copies a view into an owned, contiguous tensor of its shape, converted to `to`.
at::Tensor tensor_from_view(const TensorView& view, at::ScalarType to = at::kFloat);

// A checkpoint: a Hugging Face model directory (model.safetensors or a sharded
// model.safetensors.index.json), a single .safetensors file, or an index .json file.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);

  bool has(const std::string& name) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  // The view of `name`; throws naming the checkpoint if absent.
  const TensorView& view(const std::string& name) const;
  // An owned copy of `name` converted to `to` (shape as stored).
  at::Tensor get(const std::string& name, at::ScalarType to = at::kFloat) const;
  const std::string& path() const { return path_; }
  size_t n_files() const { return files_.size(); }

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> views_;
};

// Name of a dtype the way safetensors spells it ("F32", "F16", "BF16").
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace kvlab
