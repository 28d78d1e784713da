#include "kvlab/io/gguf.h"
#include "kvlab/io/gguf_dequant.h"

#include "kvlab/core/check.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvlab {

namespace {

constexpr int kMaxArrayDepth = 8;   // nested metadata arrays deeper than this are rejected
constexpr uint32_t kMaxDims = 4;    // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = 1u << 20;

// ------------------------------------------------------------------ ggml type table
struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;  // elements per block
  size_t type_size;    // bytes per block
};

// From ggml.c's type_traits (block sizes in elements, sizes in bytes).
constexpr TypeTraits kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},          {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},      {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},      {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},      {GgmlType::Q8_1, "Q8_1", 32, 36},
    {GgmlType::Q2_K, "Q2_K", 256, 84},     {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},    {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98}, {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18},  {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},   {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::I8, "I8", 1, 1},            {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},          {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},          {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::BF16, "BF16", 1, 2},        {GgmlType::TQ1_0, "TQ1_0", 256, 54},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66},   {GgmlType::MXFP4, "MXFP4", 32, 17},
};

const TypeTraits* find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8;   // at least the length prefix
    case GgufType::ARRAY: return 12;   // at least element type + count
  }
  return 1;
}

bool valid_gguf_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

// ------------------------------------------------------------------ bounded reader
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  std::string context;  // what is being read, for error messages

  void need(uint64_t n) {
    KVLAB_CHECK(n <= remaining(), "{}: truncated GGUF file: {} needs {} bytes at offset {}, only {} left",
                source_, context, n, pos_, remaining());
  }
  template <class T>
  T read() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // GGUF is little-endian, like every host kvlab targets
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string() {
    const uint64_t len = read<uint64_t>();
    need(len);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  // Checks that `count` items of at least `min_size` bytes each can still be in the file, so that
  // vectors are never reserved from an unchecked count.
  void need_items(uint64_t count, size_t min_size, const char* what) {
    KVLAB_CHECK(count <= remaining() / min_size,
                "{}: {} claims {} {} but only {} bytes are left in the file (corrupt count?)", source_,
                context, count, what, remaining());
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& source_;
};

int64_t read_int_scalar(Reader& r, GgufType t, uint64_t* u_out, bool* u_only) {
  switch (t) {
    case GgufType::UINT8: return r.read<uint8_t>();
    case GgufType::INT8: return r.read<int8_t>();
    case GgufType::UINT16: return r.read<uint16_t>();
    case GgufType::INT16: return r.read<int16_t>();
    case GgufType::UINT32: return r.read<uint32_t>();
    case GgufType::INT32: return r.read<int32_t>();
    case GgufType::BOOL: return r.read<uint8_t>() != 0;
    case GgufType::INT64: return r.read<int64_t>();
    case GgufType::UINT64: {
      const uint64_t v = r.read<uint64_t>();
      if (u_out) *u_out = v;
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        if (u_only) *u_only = true;
        return 0;
      }
      return static_cast<int64_t>(v);
    }
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "not an integer type");
  return 0;
}

GgufValue read_value(Reader& r, GgufType type, int depth, const std::string& source) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::FLOAT32: v.f = r.read<float>(); break;
    case GgufType::FLOAT64: v.f = r.read<double>(); break;
    case GgufType::STRING: v.s = r.read_string(); break;
    case GgufType::ARRAY: {
      const uint32_t et = r.read<uint32_t>();
      KVLAB_CHECK(valid_gguf_type(et), "{}: {}: unknown array element type {}", source, r.context, et);
      v.elem_type = static_cast<GgufType>(et);
      const uint64_t count = r.read<uint64_t>();
      r.need_items(count, scalar_size(v.elem_type), "array elements");
      const size_t n = static_cast<size_t>(count);
      switch (v.elem_type) {
        case GgufType::FLOAT32:
          v.floats.reserve(n);
          for (size_t k = 0; k < n; ++k) v.floats.push_back(r.read<float>());
          break;
        case GgufType::FLOAT64:
          v.floats.reserve(n);
          for (size_t k = 0; k < n; ++k) v.floats.push_back(r.read<double>());
          break;
        case GgufType::STRING:
          v.strings.reserve(n);
          for (size_t k = 0; k < n; ++k) v.strings.push_back(r.read_string());
          break;
        case GgufType::ARRAY:
          KVLAB_CHECK(depth + 1 < kMaxArrayDepth, "{}: {}: arrays nested deeper than {} levels", source,
                      r.context, kMaxArrayDepth);
          v.arrays.reserve(n);
          for (size_t k = 0; k < n; ++k) v.arrays.push_back(read_value(r, GgufType::ARRAY, depth + 1, source));
          break;
        default: {
          v.ints.reserve(n);
          for (size_t k = 0; k < n; ++k) {
            bool too_big = false;
            v.ints.push_back(read_int_scalar(r, v.elem_type, nullptr, &too_big));
            KVLAB_CHECK(!too_big, "{}: {}: UINT64 array element {} does not fit in int64", source, r.context, k);
          }
        }
      }
      break;
    }
    default: v.i = read_int_scalar(r, type, &v.u, &v.u_only); break;
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const char* gguf_type_name(GgufType t) {
  static const char* names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "UNKNOWN";
}

bool GgufValue::is_integer() const {
  return type != GgufType::FLOAT32 && type != GgufType::FLOAT64 && type != GgufType::STRING &&
         type != GgufType::ARRAY;
}

size_t GgufValue::array_size() const {
  return ints.size() + floats.size() + strings.size() + arrays.size();
}

std::string ggml_type_name(GgmlType t) {
  const TypeTraits* tt = find_type(static_cast<uint32_t>(t));
  return tt ? tt->name : fmt::format("type#{}", static_cast<uint32_t>(t));
}

namespace gguf_detail {
int64_t block_elems(GgmlType t) {
  const TypeTraits* tt = find_type(static_cast<uint32_t>(t));
  return tt ? tt->block_size : 0;
}
int64_t block_bytes(GgmlType t) {
  const TypeTraits* tt = find_type(static_cast<uint32_t>(t));
  return tt ? static_cast<int64_t>(tt->type_size) : 0;
}
}  // namespace gguf_detail

bool ggml_type_dequantizable(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || gguf_detail::block_dequantizer(t) != nullptr;
}

GgufContents parse_gguf(const uint8_t* data, size_t size, const std::string& source) {
  GgufContents out;
  out.source = source;
  Reader r(data, size, source);

  r.context = "the magic";
  r.need(4);
  KVLAB_CHECK(std::memcmp(data, "GGUF", 4) == 0, "{}: not a GGUF file (bad magic; expected 'GGUF')", source);
  r.read<uint32_t>();
  r.context = "the version";
  out.version = r.read<uint32_t>();
  KVLAB_CHECK(out.version == 2 || out.version == 3,
              "{}: GGUF version {} is not supported (expected 2 or 3; re-convert with a recent llama.cpp)",
              source, out.version);
  r.context = "the header counts";
  const uint64_t n_tensors = r.read<uint64_t>();
  const uint64_t n_kv = r.read<uint64_t>();

  // Metadata: key, type, value.
  r.context = "the metadata";
  r.need_items(n_kv, 12, "metadata entries");
  for (uint64_t k = 0; k < n_kv; ++k) {
    r.context = fmt::format("metadata entry {}", k);
    std::string key = r.read_string();
    r.context = fmt::format("metadata key '{}'", key);
    const uint32_t type = r.read<uint32_t>();
    KVLAB_CHECK(valid_gguf_type(type), "{}: metadata key '{}' has unknown value type {}", source, key, type);
    GgufValue value = read_value(r, static_cast<GgufType>(type), 0, source);
    KVLAB_CHECK(!out.metadata.count(key), "{}: duplicate metadata key '{}'", source, key);
    out.keys.push_back(key);
    out.metadata.emplace(std::move(key), std::move(value));
  }

  if (auto it = out.metadata.find("general.alignment"); it != out.metadata.end()) {
    const GgufValue& a = it->second;
    KVLAB_CHECK(a.is_integer() && a.type != GgufType::BOOL && !a.u_only && a.i > 0 &&
                    static_cast<uint64_t>(a.i) <= kMaxAlignment && (a.i & (a.i - 1)) == 0,
                "{}: general.alignment must be a power of two in [1, {}], found {} ({})", source, kMaxAlignment,
                a.is_integer() ? std::to_string(a.i) : "non-integer", gguf_type_name(a.type));
    out.alignment = static_cast<uint64_t>(a.i);
  }

  // Tensor infos.
  r.context = "the tensor infos";
  r.need_items(n_tensors, 24, "tensors");
  out.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    r.context = fmt::format("tensor info {}", k);
    t.name = r.read_string();
    r.context = fmt::format("tensor '{}'", t.name);
    const uint32_t n_dims = r.read<uint32_t>();
    KVLAB_CHECK(n_dims <= kMaxDims, "{}: tensor '{}' has {} dimensions, at most {} allowed", source, t.name,
                n_dims, kMaxDims);
    uint64_t numel = 1;
    // The product of the non-zero dimensions, in float64 bytes: a zero dimension makes numel 0
    // whatever follows, but ATen still refuses a shape whose other dimensions overflow (found by
    // fuzz_gguf), so that product must fit too.
    uint64_t span = 8;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.read<uint64_t>();
      KVLAB_CHECK(ne <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, ne, &numel) &&
                      numel <= static_cast<uint64_t>(INT64_MAX) &&
                      !__builtin_mul_overflow(span, std::max<uint64_t>(ne, 1), &span) &&
                      span <= static_cast<uint64_t>(INT64_MAX),
                  "{}: tensor '{}': dimension {} = {} makes the element count overflow", source, t.name, d, ne);
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    t.numel = static_cast<int64_t>(numel);
    const uint32_t type_id = r.read<uint32_t>();
    const TypeTraits* tt = find_type(type_id);
    KVLAB_CHECK(tt, "{}: tensor '{}' has unknown ggml type {}", source, t.name, type_id);
    t.type = tt->type;
    t.offset = r.read<uint64_t>();
    const int64_t row = t.ne.empty() ? 1 : t.ne[0];
    KVLAB_CHECK(row % tt->block_size == 0,
                "{}: tensor '{}' ({}): first dimension {} is not a multiple of the block size {}", source, t.name,
                tt->name, row, tt->block_size);
    uint64_t nbytes = 0;
    KVLAB_CHECK(!__builtin_mul_overflow(numel / static_cast<uint64_t>(tt->block_size),
                                        static_cast<uint64_t>(tt->type_size), &nbytes),
                "{}: tensor '{}': byte size overflows", source, t.name);
    t.nbytes = static_cast<size_t>(nbytes);
    KVLAB_CHECK(t.offset % out.alignment == 0, "{}: tensor '{}': offset {} is not a multiple of the alignment {}",
                source, t.name, t.offset, out.alignment);
    KVLAB_CHECK(!out.tensor_index.count(t.name), "{}: duplicate tensor name '{}'", source, t.name);
    out.tensor_index[t.name] = out.tensors.size();
    out.tensors.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  const uint64_t data_offset = (header_end + out.alignment - 1) / out.alignment * out.alignment;
  out.data_offset = static_cast<size_t>(data_offset);
  if (out.tensors.empty()) return out;
  KVLAB_CHECK(data_offset <= size, "{}: truncated GGUF file: data section would start at {} but the file has {} bytes",
              source, data_offset, size);
  const uint64_t data_size = size - data_offset;

  struct Range { uint64_t begin, end; size_t idx; };
  std::vector<Range> ranges;
  ranges.reserve(out.tensors.size());
  for (size_t k = 0; k < out.tensors.size(); ++k) {
    GgufTensorInfo& t = out.tensors[k];
    KVLAB_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
                "{}: tensor '{}' ({} bytes at data offset {}) is out of range: the data section has {} bytes "
                "(truncated file?)",
                source, t.name, t.nbytes, t.offset, data_size);
    t.data = data + data_offset + t.offset;
    if (t.nbytes) ranges.push_back({t.offset, t.offset + t.nbytes, k});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < ranges.size(); ++k)
    KVLAB_CHECK(ranges[k].begin >= ranges[k - 1].end, "{}: tensors '{}' and '{}' overlap in the data section",
                source, out.tensors[ranges[k - 1].idx].name, out.tensors[ranges[k].idx].name);
  return out;
}

at::Tensor gguf_dequantize(const GgufTensorInfo& info) {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  switch (info.type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: {
      const at::ScalarType st = info.type == GgmlType::F32 ? at::kFloat
                                : info.type == GgmlType::F16 ? at::kHalf : at::kBFloat16;
      at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(st));  // [info.shape]
      TORCH_INTERNAL_ASSERT(static_cast<size_t>(t.nbytes()) == info.nbytes);
      if (info.nbytes) std::memcpy(t.data_ptr(), info.data, info.nbytes);  // copy: mapped bytes may be unaligned
      return st == at::kFloat ? t : t.to(at::kFloat);
    }
    default: break;
  }
  const gguf_detail::BlockFn fn = gguf_detail::block_dequantizer(info.type);
  KVLAB_CHECK(fn, "tensor '{}' has ggml type {}, which kvlab cannot dequantize (supported: F32, F16, BF16, Q8_0, "
              "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
              info.name, ggml_type_name(info.type));
  const TypeTraits* tt = find_type(static_cast<uint32_t>(info.type));
  at::Tensor out = at::empty(info.shape, opts);  // [info.shape] float32
  float* y = out.data_ptr<float>();
  const int64_t n_blocks = info.numel / tt->block_size;
  TORCH_INTERNAL_ASSERT(static_cast<size_t>(n_blocks) * tt->type_size == info.nbytes);
  at::parallel_for(0, n_blocks, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) fn(info.data + b * tt->type_size, y + b * tt->block_size);
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// GgufFile

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  contents_ = parse_gguf(file_->data(), file_->size(), path);
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = contents_.metadata.find(key);
  KVLAB_CHECK(it != contents_.metadata.end(), "{}: GGUF metadata key '{}' not found", path(), key);
  return it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v,
                             const char* expected) {
  std::string found = gguf_type_name(v.type);
  if (v.type == GgufType::ARRAY) found += fmt::format(" of {}", gguf_type_name(v.elem_type));
  KVLAB_FAIL("{}: GGUF metadata key '{}' has type {}, expected {}", path, key, found, expected);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::STRING) wrong_type(path(), key, v, "STRING");
  return v.s;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!v.is_integer()) wrong_type(path(), key, v, "an integer");
  KVLAB_CHECK(!v.u_only, "{}: GGUF metadata key '{}' = {} does not fit in int64", path(), key, v.u);
  return v.i;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.is_float()) return v.f;
  if (v.is_integer() && v.type != GgufType::BOOL) return v.u_only ? static_cast<double>(v.u) : static_cast<double>(v.i);
  wrong_type(path(), key, v, "a number");
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::BOOL) wrong_type(path(), key, v, "BOOL");
  return v.i != 0;
}

std::string GgufFile::get_string_or(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}
int64_t GgufFile::get_int_or(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }
double GgufFile::get_float_or(const std::string& key, double def) const {
  return has(key) ? get_float(key) : def;
}
bool GgufFile::get_bool_or(const std::string& key, bool def) const { return has(key) ? get_bool(key) : def; }

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::STRING) wrong_type(path(), key, v, "ARRAY of STRING");
  return v.strings;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = value(key);
  const bool ok = v.type == GgufType::ARRAY && v.elem_type != GgufType::STRING && v.elem_type != GgufType::ARRAY &&
                  v.elem_type != GgufType::FLOAT32 && v.elem_type != GgufType::FLOAT64;
  if (!ok) wrong_type(path(), key, v, "ARRAY of integers");
  return v.ints;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::ARRAY || v.elem_type == GgufType::STRING || v.elem_type == GgufType::ARRAY)
    wrong_type(path(), key, v, "ARRAY of numbers");
  if (!v.floats.empty() || v.ints.empty()) return v.floats;
  return std::vector<double>(v.ints.begin(), v.ints.end());
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = contents_.tensor_index.find(name);
  return it == contents_.tensor_index.end() ? nullptr : &contents_.tensors[it->second];
}

std::vector<std::string> GgufFile::tensor_names() const {
  std::vector<std::string> out;
  out.reserve(contents_.tensors.size());
  for (const auto& t : contents_.tensors) out.push_back(t.name);
  return out;
}

at::Tensor GgufFile::get(const std::string& name, at::ScalarType to) const {
  const GgufTensorInfo* t = find_tensor(name);
  KVLAB_CHECK(t, "{}: GGUF file has no tensor '{}' ({} tensors)", path(), name, contents_.tensors.size());
  try {
    at::Tensor w = gguf_dequantize(*t);  // [t->shape] float32
    return to == at::kFloat ? w : w.to(to);
  } catch (const Error& e) {
    KVLAB_FAIL("{}: {}", path(), e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// q/k row permutation

namespace {
at::Tensor permute_rows(const at::Tensor& w, int n_heads, bool inverse) {
  KVLAB_CHECK(w.dim() >= 1 && n_heads > 0 && w.size(0) % (2 * n_heads) == 0,
              "gguf q/k permutation: first dimension {} must be divisible by 2 * n_heads = {} (shape {})",
              w.dim() ? w.size(0) : 0, 2 * n_heads, c10::str(w.sizes()));
  const int64_t half = w.size(0) / n_heads / 2;
  std::vector<int64_t> split = {n_heads, inverse ? half : 2, inverse ? 2 : half};
  for (int64_t d = 1; d < w.dim(); ++d) split.push_back(w.size(d));
  return w.reshape(split).transpose(1, 2).reshape(w.sizes()).contiguous();
}
}  // namespace

at::Tensor gguf_unpermute_qk(const at::Tensor& w, int n_heads) { return permute_rows(w, n_heads, true); }
at::Tensor gguf_permute_qk(const at::Tensor& w, int n_heads) { return permute_rows(w, n_heads, false); }

}  // namespace kvlab
