#include "kvlab/io/safetensors.h"

#include "kvlab/core/check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace kvlab {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KVLAB_CHECK(fd >= 0, "cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    KVLAB_FAIL("'{}' is not a regular file ({})", path, err ? std::strerror(err) : "not a file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    KVLAB_CHECK(p != MAP_FAILED, "cannot memory-map '{}' ({} bytes): {}", path, size_, std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---------------------------------------------------------------------------------------------
// Header parsing

namespace {

// Supported dtypes -> (ATen type, bytes per element). Other known safetensors dtypes are
// recognised only to give a precise error.
bool parse_dtype(const std::string& s, at::ScalarType* dtype, size_t* elem_size) {
  if (s == "F32") { *dtype = at::kFloat; *elem_size = 4; return true; }
  if (s == "F16") { *dtype = at::kHalf; *elem_size = 2; return true; }
  if (s == "BF16") { *dtype = at::kBFloat16; *elem_size = 2; return true; }
  return false;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// JSON text for error messages; never throws on invalid UTF-8 inside strings.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A JSON value that must be a non-negative integer fitting in uint64.
uint64_t as_u64(const nlohmann::json& j, const std::string& source, const std::string& name,
                const char* field) {
  KVLAB_CHECK(j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0),
              "{}: tensor '{}': {} must hold non-negative integers, found {}", source, name, field,
              dump(j));
  return j.get<uint64_t>();
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    default: return std::string(c10::toString(dtype));
  }
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& source) {
  KVLAB_CHECK(size >= 8, "{}: truncated safetensors file: {} bytes, expected at least 8 (header length)",
              source, size);
  const uint64_t header_len = read_u64_le(data);
  KVLAB_CHECK(header_len <= kSafetensorsMaxHeaderBytes,
              "{}: safetensors header length {} exceeds the limit of {} bytes (corrupt file?)", source,
              header_len, kSafetensorsMaxHeaderBytes);
  KVLAB_CHECK(header_len <= size - 8,
              "{}: safetensors header length {} goes beyond the end of the file ({} bytes after the length)",
              source, header_len, size - 8);
  KVLAB_CHECK(header_len >= 2, "{}: safetensors header length {} is too short for a JSON object", source,
              header_len);

  const char* json_begin = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header;
  // nlohmann/json keeps the last of duplicate keys; a tensor listed twice must be an error instead.
  std::set<std::string> top_keys;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string() &&
        !top_keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = nlohmann::json::parse(json_begin, json_begin + header_len, on_event);
  } catch (const nlohmann::json::exception& e) {
    KVLAB_FAIL("{}: safetensors header is not valid JSON: {}", source, e.what());
  }
  KVLAB_CHECK(header.is_object(), "{}: safetensors header must be a JSON object, found {}", source,
              header.type_name());
  KVLAB_CHECK(duplicate.empty(), "{}: tensor '{}' appears twice in the safetensors header", source, duplicate);

  SafetensorsHeader out;
  out.data_offset = 8 + static_cast<size_t>(header_len);
  const uint8_t* data_begin = data + out.data_offset;
  const uint64_t data_size = size - out.data_offset;

  struct Range { uint64_t begin, end; size_t idx; };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      KVLAB_CHECK(entry.is_object(), "{}: __metadata__ must be an object of strings, found {}", source,
                  entry.type_name());
      for (auto m = entry.begin(); m != entry.end(); ++m)
        KVLAB_CHECK(m.value().is_string(), "{}: __metadata__['{}'] must be a string, found {}", source,
                    m.key(), m.value().type_name());
      out.metadata = entry;
      continue;
    }
    KVLAB_CHECK(entry.is_object(), "{}: tensor '{}': entry must be an object, found {}", source, name,
                entry.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      KVLAB_CHECK(entry.contains(field), "{}: tensor '{}': missing field '{}'", source, name, field);
    const auto& jdtype = entry["dtype"];
    const auto& jshape = entry["shape"];
    const auto& joffsets = entry["data_offsets"];
    KVLAB_CHECK(jdtype.is_string(), "{}: tensor '{}': dtype must be a string, found {}", source, name,
                jdtype.type_name());

    TensorView view;
    view.name = name;
    size_t elem_size = 0;
    const std::string dtype_str = jdtype.get<std::string>();
    KVLAB_CHECK(parse_dtype(dtype_str, &view.dtype, &elem_size),
                "{}: tensor '{}' has dtype {}; kvlab reads F32, F16 and BF16 only", source, name, dtype_str);

    KVLAB_CHECK(jshape.is_array(), "{}: tensor '{}': shape must be an array, found {}", source, name,
                jshape.type_name());
    KVLAB_CHECK(jshape.size() <= 8, "{}: tensor '{}': shape has {} dimensions, at most 8 supported", source,
                name, jshape.size());
    uint64_t numel = 1;
    for (const auto& d : jshape) {
      const uint64_t dim = as_u64(d, source, name, "shape");
      KVLAB_CHECK(dim <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, dim, &numel),
                  "{}: tensor '{}': shape {} overflows", source, name, dump(jshape));
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t expected_bytes = 0;
    KVLAB_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &expected_bytes),
                "{}: tensor '{}': shape {} overflows", source, name, dump(jshape));

    KVLAB_CHECK(joffsets.is_array() && joffsets.size() == 2,
                "{}: tensor '{}': data_offsets must be [begin, end], found {}", source, name,
                dump(joffsets));
    const uint64_t begin = as_u64(joffsets[0], source, name, "data_offsets");
    const uint64_t end = as_u64(joffsets[1], source, name, "data_offsets");
    KVLAB_CHECK(begin <= end, "{}: tensor '{}': data_offsets [{}, {}] has begin > end", source, name, begin,
                end);
    KVLAB_CHECK(end <= data_size,
                "{}: tensor '{}': data_offsets [{}, {}] out of range: the data section has {} bytes", source,
                name, begin, end, data_size);
    KVLAB_CHECK(end - begin == expected_bytes,
                "{}: tensor '{}': shape {} x {} ({} bytes/element) needs {} bytes but data_offsets [{}, {}] "
                "cover {} (shape/byte mismatch)",
                source, name, dump(jshape), dtype_str, elem_size, expected_bytes, begin, end, end - begin);
    view.data = data_begin + begin;
    view.nbytes = static_cast<size_t>(end - begin);
    ranges.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(view));
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev)
      KVLAB_CHECK(r.begin >= prev->end,
                  "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data section", source,
                  out.tensors[prev->idx].name, prev->begin, prev->end, out.tensors[r.idx].name, r.begin, r.end);
    prev = &r;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  header_ = parse_safetensors_header(file_.data(), file_.size(), path);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

at::Tensor tensor_from_view(const TensorView& view, at::ScalarType to) {
  // memcpy into an owned tensor first: the mapped bytes are not necessarily aligned.
  at::Tensor t = at::empty(view.shape, at::TensorOptions().dtype(view.dtype));  // [view.shape]
  TORCH_INTERNAL_ASSERT(static_cast<size_t>(t.nbytes()) == view.nbytes);
  if (view.nbytes) std::memcpy(t.data_ptr(), view.data, view.nbytes);
  return view.dtype == to ? t : t.to(to);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  fs::path p(path);
  KVLAB_CHECK(fs::exists(p), "checkpoint '{}' does not exist", path);
  fs::path index_path, single_path;
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors.index.json")) index_path = p / "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors")) single_path = p / "model.safetensors";
    else KVLAB_FAIL("'{}' holds neither model.safetensors nor model.safetensors.index.json", path);
  } else if (p.extension() == ".json") {
    index_path = p;
  } else {
    single_path = p;
  }

  auto add_file = [&](const fs::path& file) -> SafetensorsFile& {
    files_.push_back(std::make_unique<SafetensorsFile>(file.string()));
    return *files_.back();
  };

  if (!single_path.empty()) {
    SafetensorsFile& f = add_file(single_path);
    for (const TensorView& v : f.tensors()) views_[v.name] = &v;
    return;
  }

  // Sharded: {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}
  nlohmann::json index;
  {
    std::ifstream in(index_path);
    KVLAB_CHECK(in, "cannot open '{}'", index_path.string());
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      KVLAB_FAIL("{}: not valid JSON: {}", index_path.string(), e.what());
    }
  }
  KVLAB_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              "{}: expected an object with a 'weight_map' object", index_path.string());
  const auto& weight_map = index["weight_map"];
  std::map<std::string, SafetensorsFile*> shards;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    KVLAB_CHECK(it.value().is_string(), "{}: weight_map['{}'] must be a file name", index_path.string(),
                it.key());
    const std::string shard = it.value().get<std::string>();
    KVLAB_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
                "{}: weight_map['{}'] = '{}' must be a file name in the same directory", index_path.string(),
                it.key(), shard);
    if (!shards.count(shard)) shards[shard] = &add_file(index_path.parent_path() / shard);
    const TensorView* v = shards[shard]->find(it.key());
    KVLAB_CHECK(v, "{}: weight_map says '{}' is in '{}', but that file does not hold it", index_path.string(),
                it.key(), shard);
    views_[it.key()] = v;
  }
  // Tensors present in a shard but missing from the map are still reachable (first wins).
  for (const auto& f : files_)
    for (const TensorView& v : f->tensors()) views_.emplace(v.name, &v);
}

bool SafetensorsCheckpoint::has(const std::string& name) const { return views_.count(name) != 0; }

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(views_.size());
  for (const auto& kv : views_) out.push_back(kv.first);
  return out;
}

const TensorView& SafetensorsCheckpoint::view(const std::string& name) const {
  auto it = views_.find(name);
  KVLAB_CHECK(it != views_.end(), "checkpoint '{}' has no tensor '{}' ({} tensors)", path_, name,
              views_.size());
  return *it->second;
}

at::Tensor SafetensorsCheckpoint::get(const std::string& name, at::ScalarType to) const {
  return tensor_from_view(view(name), to);
}

}  // namespace kvlab
