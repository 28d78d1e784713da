// check_object_header: HDF5 object headers read from the file's bytes, so that no corrupted
// header message reaches HDF5's own decoders (see capture_hdf5.h). Layouts from the HDF5 File
// Format Specification (version-1 object headers and the messages kvlab's files hold).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <vector>

#include "kvlab/io/capture_hdf5.h"

namespace kvlab::capture_detail {
namespace {

constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 20;  // an object header chunk kvlab writes is < 4 KB
constexpr size_t kMaxChunks = 256;
constexpr uint16_t kContinuation = 0x0010, kAttribute = 0x000c;  // header message types

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
size_t pad8(size_t n) { return (n + 7) & ~size_t(7); }

// The datatype message (also inside an attribute message), [p, p + len): a plain integer, float or
// fixed-length string, as the writer makes them, or a variable-length string (version 1 wrote
// those; HDF5 decodes the message without visiting the global heap). Its element size goes to *elem.
std::string check_datatype(const uint8_t* p, size_t len, uint64_t* elem) {
  if (len < 8) return fmt::format("a {}-byte datatype", len);
  const unsigned cls = p[0] & 0x0f;
  if (cls == 9) {  // variable-length string (version 1's): accepted here, refused unread by the reader
    const bool ok = (p[1] & 0x0f) == 1 && len >= 8 + 12 && (p[8] & 0x0f) == 0 && le(p + 12, 4) == 1;
    *elem = le(p + 4, 4);
    if (!ok || *elem != 16) return "a variable-length datatype other than a string";
    return "";
  }
  const size_t props = cls == 0 ? 4 : cls == 1 ? 12 : cls == 3 ? 0 : 1000;
  if (props == 1000) return fmt::format("a datatype of class {} (kvlab writes integers, floats, strings)", cls);
  if (len < 8 + props) return fmt::format("a class-{} datatype of {} bytes, not {}", cls, len, 8 + props);
  *elem = le(p + 4, 4);
  if (*elem == 0 || *elem > 65536) return fmt::format("a datatype of {}-byte elements", *elem);
  return "";
}

// The dataspace message (also inside an attribute message), [p, p + len): version 1 or 2, rank at
// most max_rank, dimensions inside. The element count (saturated at 2^62) goes to *n.
std::string check_dataspace(const uint8_t* p, size_t len, unsigned max_rank, uint64_t* n) {
  if (len < 4) return fmt::format("a {}-byte dataspace", len);
  const unsigned version = p[0], rank = p[1], flags = p[2];
  if (version != 1 && version != 2) return fmt::format("a dataspace of version {}", version);
  if (rank > max_rank) return fmt::format("a dataspace of rank {} (at most {} here)", rank, max_rank);
  const size_t head = version == 1 ? 8 : 4;
  const size_t need = head + rank * 8 * ((flags & 1) ? 2 : 1) + (version == 1 && (flags & 2) ? rank * 8 : 0);
  if (need > len) return fmt::format("a dataspace of {} bytes that needs {}", len, need);
  *n = version == 2 && p[3] == 2 ? 0 : 1;  // type 2: null
  for (unsigned i = 0; i < rank; ++i) *n = std::min<uint64_t>(*n * std::min<uint64_t>(le(p + head + 8 * i, 8), 1ull << 31), 1ull << 62);
  return "";
}

// One attribute message's body, [p, p + size).
std::string check_attribute(const uint8_t* p, size_t size) {
  if (size < 8) return fmt::format("{} bytes, shorter than its header", size);
  const unsigned version = p[0];
  if (version < 1 || version > 3) return fmt::format("version {}", version);
  if (version >= 2 && (p[1] & 3) != 0) return "a shared datatype or dataspace (kvlab writes none)";
  const size_t name_len = le(p + 2, 2), dt_len = le(p + 4, 2), ds_len = le(p + 6, 2);
  size_t at = version == 3 ? 9 : 8;
  auto field = [&](size_t len) {
    const size_t start = at;
    at += version == 1 ? pad8(len) : len;
    return start;
  };
  const size_t name = field(name_len), dt = field(dt_len), ds = field(ds_len);
  if (at > size) return fmt::format("name, datatype and dataspace of {} bytes in a {}-byte message", at, size);
  if (name_len == 0 || p[name + name_len - 1] != 0) return "a name without its terminating NUL";
  uint64_t elem = 0, n = 0;
  if (auto e = check_datatype(p + dt, dt_len, &elem); !e.empty()) return e;
  if (auto e = check_dataspace(p + ds, ds_len, 1, &n); !e.empty()) return e;
  if (n > 65536 || elem * n > size - at) return fmt::format("{} x {} bytes of data where {} remain", n, elem, size - at);
  return "";
}

// Fill value messages: old (type 4) and new (type 5, versions 1 to 3); the value must fit.
std::string check_fill(const uint8_t* p, size_t size, bool old_style) {
  size_t at = 0;
  bool has_value = true;
  if (!old_style) {
    if (size < 2) return "truncated";
    const unsigned version = p[0];
    if (version < 1 || version > 3) return fmt::format("version {}", version);
    if (version == 3) has_value = (p[1] & 0x20) != 0, at = 2;
    else if (size < 4) return "truncated";
    else has_value = version == 1 || p[3] != 0, at = 4;
  }
  if (!has_value) return "";
  if (at + 4 > size) return "truncated";
  const uint64_t n = le(p + at, 4);
  return n > size - at - 4 ? fmt::format("a {}-byte value in {} bytes", n, size - at - 4) : "";
}

// Data layout message, version 3 (what HDF5 1.8 to 1.14 write with default bounds).
std::string check_layout(const uint8_t* p, size_t size) {
  if (size < 2 || p[0] != 3) return fmt::format("version {} (kvlab writes version 3)", size ? p[0] : 0);
  switch (p[1]) {
    case 0: return size >= 4 && le(p + 2, 2) <= size - 4 ? "" : "compact data past the message's end";
    case 1: return size >= 18 ? "" : "truncated";
    case 2: {
      if (size < 3) return "truncated";
      const size_t ndims = p[2];
      if (ndims < 2 || ndims > 33) return fmt::format("{} chunk dimensions", ndims);
      return 3 + 8 + 4 * ndims <= size ? "" : "chunk dimensions past the message's end";
    }
    default: return fmt::format("layout class {}", p[1]);
  }
}

// Filter pipeline message, versions 1 and 2: every filter's name (NUL-terminated) and parameters
// inside the message.
std::string check_pipeline(const uint8_t* p, size_t size) {
  if (size < 2) return "truncated";
  const unsigned version = p[0], nfilters = p[1];
  if (version != 1 && version != 2) return fmt::format("version {}", version);
  if (nfilters > 32) return fmt::format("{} filters", nfilters);
  size_t at = version == 1 ? 8 : 2;
  for (unsigned f = 0; f < nfilters; ++f) {
    if (at + 2 > size) return "truncated";
    const uint64_t id = le(p + at, 2);
    const bool named = version == 1 || id >= 256;
    const size_t head = named ? 8 : 6;
    if (at + head > size) return "truncated";
    const size_t name_len = named ? le(p + at + 2, 2) : 0;
    const size_t ncd = le(p + at + head - 2, 2);
    if (ncd > 64) return fmt::format("filter {} with {} parameters", id, ncd);
    at += head;
    if (name_len) {
      if (name_len > size - at || std::find(p + at, p + at + name_len, 0) == p + at + name_len)
        return fmt::format("filter {}: a name without its terminating NUL", id);
      at += version == 1 ? pad8(name_len) : name_len;
    }
    at += 4 * ncd + (version == 1 && ncd % 2 ? 4 : 0);
    if (at > size) return fmt::format("filter {}: parameters past the message's end", id);
  }
  return "";
}

// One header message of a group or dataset: a type kvlab's files hold, its contents inside it.
std::string check_message(uint16_t type, const uint8_t* p, size_t size, bool dataset) {
  uint64_t elem = 0, n = 0;
  switch (type) {
    case 0x0000: return "";                                         // null (free space)
    case 0x0010: return size >= 16 ? "" : "a truncated continuation";
    case 0x0012: return size >= 8 ? "" : "a truncated modification time";
    case kAttribute: return check_attribute(p, size);
  }
  if (!dataset) {
    if (type == 0x0011) return size >= 16 ? "" : "a truncated symbol table";
  } else {
    switch (type) {
      case 0x0001: return check_dataspace(p, size, 32, &n);
      case 0x0003: return check_datatype(p, size, &elem);
      case 0x0004: return check_fill(p, size, true);
      case 0x0005: return check_fill(p, size, false);
      case 0x0008: return check_layout(p, size);
      case 0x000b: return check_pipeline(p, size);
    }
  }
  return fmt::format("a message of type {:#06x}, which a kvlab {} never holds", type, dataset ? "dataset" : "group");
}

}  // namespace

RawBytes RawBytes::of_file(const std::string& path, uint64_t base) {
  RawBytes r;
  r.path_ = path;
  r.base_ = base;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  r.size_ = in ? uint64_t(in.tellg()) : 0;
  return r;
}

RawBytes RawBytes::of_image(const void* data, size_t size, uint64_t base) {
  RawBytes r;
  r.is_image_ = true;
  r.image_.assign(static_cast<const char*>(data), size);
  r.base_ = base;
  r.size_ = size;
  return r;
}

bool RawBytes::read(uint64_t addr, size_t n, uint8_t* out) const {
  if (addr > size_ || base_ > size_ - addr || n > size_ - addr - base_) return false;
  const uint64_t at = base_ + addr;
  if (is_image_) {
    std::copy(image_.begin() + long(at), image_.begin() + long(at + n), out);
    return true;
  }
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(at));
  in.read(reinterpret_cast<char*>(out), std::streamsize(n));
  return bool(in);
}

std::string check_object_header(const RawBytes& bytes, uint64_t addr, bool dataset) {
  uint8_t prefix[16];
  if (!bytes.read(addr, sizeof prefix, prefix)) return fmt::format("object header at {} past the end of the file", addr);
  if (std::equal(prefix, prefix + 4, "OHDR")) return "a version-2 object header (kvlab writes version 1)";
  if (prefix[0] != 1) return fmt::format("an object header of version {} (kvlab writes version 1)", unsigned(prefix[0]));
  std::vector<std::pair<uint64_t, uint64_t>> chunks = {{addr + 16, le(prefix + 8, 4)}};  // {address, bytes}
  std::set<uint64_t> seen;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto [at, len] = chunks[c];
    if (!seen.insert(at).second || chunks.size() > kMaxChunks) return "object header chunks that loop";
    if (len > kMaxChunkBytes) return fmt::format("an object header chunk of {} bytes", len);
    std::vector<uint8_t> chunk(len);
    if (!bytes.read(at, len, chunk.data())) return fmt::format("an object header chunk past the end of the file");
    for (size_t off = 0, i = 0; off + 8 <= len; ++i) {
      const uint8_t* m = chunk.data() + off;
      const auto type = uint16_t(le(m, 2));
      const size_t size = le(m + 2, 2);
      if (size > len - off - 8) return fmt::format("header message {} of {} bytes past its chunk's end", i, size);
      if (type == kContinuation && size >= 16) chunks.emplace_back(le(m + 8, 8), le(m + 16, 8));
      if (auto e = check_message(type, m + 8, size, dataset); !e.empty())
        return fmt::format("header message {} (type {:#06x}): {}", i, type, e);
      off += 8 + size;
    }
  }
  return "";
}

}  // namespace kvlab::capture_detail
