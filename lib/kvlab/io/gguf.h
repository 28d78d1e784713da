// GGUF (llama.cpp's model format), versions 2 and 3: a reader with full validation.
//
// Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all little-endian:
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x  { string key | u32 value_type | value }        string = u64 length + bytes
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32) | data section (tensor offsets are relative to it)
// ne[] lists dimensions fastest-varying first (ggml order); `GgufTensorInfo::shape` is the reverse,
// i.e. the row-major at::Tensor shape. E.g. token_embd.weight has ne = [n_embd, n_vocab] and
// shape = [n_vocab, n_embd].
//
// Every count, string length, dimension, offset and byte size is checked against the file before it
// is used, so a hostile file gives a kvlab::Error, never a crash or a huge allocation.
// Tensors are dequantized to float32 on load: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (ggml's block layouts; reference formulas in gguf_dequant.cpp).
#pragma once

#include "kvlab/io/safetensors.h"  // MappedFile

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvlab {

// GGUF metadata value types (numbering from the spec).
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars: integers (and bools) in `i` (uint64 above INT64_MAX in `u` with
// `i` unset), floats in `f`, strings in `s`. Arrays: `elem_type` plus exactly one of `ints`
// (integer and bool elements), `floats`, `strings`, `arrays` (nested arrays).
struct GgufValue {
  GgufType type = GgufType::UINT8;
  int64_t i = 0;
  uint64_t u = 0;
  bool u_only = false;  // UINT64 scalar too large for int64
  double f = 0.0;
  std::string s;
  GgufType elem_type = GgufType::UINT8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;

  bool is_integer() const;  // any integer type or bool
  bool is_float() const { return type == GgufType::FLOAT32 || type == GgufType::FLOAT64; }
  size_t array_size() const;  // number of elements (0 for scalars)
};

// ggml tensor types (numbering from ggml.h). Only some can be dequantized; the others are still
// recognised so that the file can be validated and the error can name them.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
std::string ggml_type_name(GgmlType t);
bool ggml_type_dequantizable(GgmlType t);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;     // ggml order, fastest-varying first
  std::vector<int64_t> shape;  // row-major at::Tensor shape (ne reversed)
  int64_t numel = 0;
  uint64_t offset = 0;         // from the start of the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the file / buffer
};

// Everything in a GGUF file except the tensor bytes themselves.
struct GgufContents {
  std::string source;  // file name for errors
  uint32_t version = 0;
  uint64_t alignment = 32;
  size_t data_offset = 0;  // start of the data section in the file
  std::vector<std::string> keys;             // metadata keys in file order
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;       // in file order
  std::map<std::string, size_t> tensor_index;
};

// Parses and validates a whole GGUF file held in memory; tensor data pointers point into `data`.
GgufContents parse_gguf(const uint8_t* data, size_t size, const std::string& source);

// Dequantizes one tensor to float32, shape `info.shape`. Throws for types without a dequantizer.
at::Tensor gguf_dequantize(const GgufTensorInfo& info);

// A memory-mapped GGUF file with typed metadata getters. Getters throw a kvlab::Error naming the
// file and the key when the key is missing or has another type; `*_or` variants return a default
// when the key is missing (but still throw on a wrong type).
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return contents_.source; }
  uint32_t version() const { return contents_.version; }
  uint64_t alignment() const { return contents_.alignment; }
  const GgufContents& contents() const { return contents_; }

  // Metadata.
  bool has(const std::string& key) const { return contents_.metadata.count(key) != 0; }
  const std::vector<std::string>& keys() const { return contents_.keys; }
  const GgufValue& value(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;     // any integer type or bool
  double get_float(const std::string& key) const;    // float types, or an integer
  bool get_bool(const std::string& key) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;  // float or integer elements
  // "general.architecture", e.g. "llama".
  std::string architecture() const { return get_string("general.architecture"); }

  // Tensors.
  const std::vector<GgufTensorInfo>& tensors() const { return contents_.tensors; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  bool has_tensor(const std::string& name) const { return find_tensor(name) != nullptr; }
  std::vector<std::string> tensor_names() const;
  // Dequantized copy of `name`, shape GgufTensorInfo::shape, converted to `to`.
  at::Tensor get(const std::string& name, at::ScalarType to = at::kFloat) const;

 private:
  std::unique_ptr<MappedFile> file_;
  GgufContents contents_;
};

// Undoes the row permutation llama.cpp's convert_hf_to_gguf.py applies to llama q_proj/k_proj
// weights. The converter maps the Hugging Face "rotate-half" RoPE layout (within each head, rows
// [0, head_dim/2) are the first halves of the rotated pairs and [head_dim/2, head_dim) the second
// halves) to ggml's interleaved layout (pairs are adjacent rows 2i, 2i+1) with
//   permute(w, n_head) = w.reshape(n_head, 2, head_dim/2, *rest).swapaxes(1, 2).reshape(w.shape)
// i.e. GGUF row h*head_dim + 2*i + j == HF row h*head_dim + j*head_dim/2 + i  (j in {0, 1}).
// This function is the inverse:
//   w.reshape(n_head, head_dim/2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
// `w` is [n_head * head_dim, ...] (a weight [out, in] or a bias [out]); pass n_q_heads for attn_q
// and n_kv_heads for attn_k (the converter permutes k with the KV head count). Returns a
// contiguous tensor of the same shape.
at::Tensor gguf_unpermute_qk(const at::Tensor& w, int n_heads);
// The forward permutation (HF -> GGUF), for tests and writers.
at::Tensor gguf_permute_qk(const at::Tensor& w, int n_heads);

}  // namespace kvlab
