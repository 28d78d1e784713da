// check_object_header: HDF5 object headers read from the file's bytes, so that no corrupted
// header message reaches HDF5's own decoders (see capture_hdf5.h). Layouts from the HDF5 File
// Format Specification (version-1 object headers and the messages kvlab's files hold).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "kvlab/io/capture_hdf5.h"

namespace kvlab::capture_detail {
namespace {

constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 20;  // an object header chunk kvlab writes is < 4 KB
constexpr size_t kMaxChunks = 256;
constexpr uint16_t kContinuation = 0x0010, kAttribute = 0x000c, kSymbolTable = 0x0011;  // header message types
constexpr uint64_t kMaxDim = uint64_t(1) << 40, kUnlimited = ~uint64_t(0);  // dataspace dimensions
constexpr uint64_t kUndefined = ~uint64_t(0);  // an address not yet allocated (HADDR_UNDEF)
constexpr uint64_t kFreeNull = 1;  // a local heap's free list's end (H5HL_FREE_NULL)
constexpr uint64_t kMaxHeapBytes = uint64_t(1) << 24;  // a group's names: 16 bytes a member

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
  for (unsigned i = 0; i < rank; ++i) {
    // HDF5 1.10 rounds dimensions up to powers of two when it opens a chunked dataset; one past
    // 2^63 fails there and leaks what the open had allocated (about 5 KB a try: the 10^6-input
    // fuzzer run's memory). A capture's largest dimension is a sample's tokens (< 2^26).
    const uint64_t dim = le(p + head + 8 * i, 8), max = (flags & 1) ? le(p + head + 8 * (rank + i), 8) : dim;
    if (dim > kMaxDim) return fmt::format("a dataspace dimension of {} (at most {} here)", dim, kMaxDim);
    if (max != kUnlimited && dim > max) return fmt::format("a dataspace dimension of {} above its maximum {}", dim, max);
    *n = std::min<uint64_t>(*n * std::min<uint64_t>(dim, 1ull << 31), 1ull << 62);
  }
  return "";
}

// The local heap of a group (its members' names), at addr: the header inside the file, the data
// segment inside the file, and the free list inside the segment, ending. HDF5 1.10 follows the
// free list until it ends, allocating a record per block: one that returns to a block it visited
// never ends (a fuzzer input: 68 million records, 2.2 GB, before libFuzzer stopped it).
std::string check_local_heap(const RawBytes& bytes, uint64_t addr) {
  uint8_t h[32];
  if (!bytes.read(addr, sizeof h, h)) return fmt::format("a local heap at {} past the end of the file", addr);
  if (!std::equal(h, h + 4, "HEAP") || h[4] != 0) return fmt::format("no version-0 local heap at {}", addr);
  const uint64_t size = le(h + 8, 8), data = le(h + 24, 8);
  uint8_t block[16];
  if (size < 16 || size > kMaxHeapBytes || !bytes.read(data, 1, block) || !bytes.read(data + size - 1, 1, block))
    return fmt::format("a local heap's {}-byte data segment at {} past the end of the file", size, data);
  std::set<uint64_t> seen;
  for (uint64_t off = le(h + 16, 8); off != kFreeNull;) {
    if (off > size - 16 || !seen.insert(off).second)
      return fmt::format("a local heap's free list {} at offset {} (of a {}-byte segment)",
                         off > size - 16 ? "past its segment" : "that loops", off, size);
    bytes.read(data + off, 16, block);
    const uint64_t next = le(block, 8), len = le(block + 8, 8);
    if (len > size - off) return fmt::format("a local heap's free block of {} bytes at offset {} past its segment", len, off);
    off = next;
  }
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

// Data layout message, version 3 (what HDF5 1.8 to 1.14 write with default bounds); the data's
// address (contiguous: with its size; chunked: the chunk index's) inside a file of `file_size`
// bytes, or undefined (nothing written yet). HDF5 1.10 fails an open on an address past the end of
// the file, leaking the half-opened dataset (5 KB a try).
std::string check_layout(const uint8_t* p, size_t size, uint64_t file_size) {
  if (size < 2 || p[0] != 3) return fmt::format("version {} (kvlab writes version 3)", size ? p[0] : 0);
  auto outside = [&](uint64_t addr, uint64_t len) { return addr != kUndefined && (addr > file_size || len > file_size - addr); };
  switch (p[1]) {
    case 0: return size >= 4 && le(p + 2, 2) <= size - 4 ? "" : "compact data past the message's end";
    case 1:
      if (size < 18) return "truncated";
      return outside(le(p + 2, 8), le(p + 10, 8)) ? fmt::format("{} bytes of data at {} past the end of the file",
                                                                  le(p + 10, 8), le(p + 2, 8)) : "";
    case 2: {
      if (size < 3) return "truncated";
      const size_t ndims = p[2];
      if (ndims < 2 || ndims > 33) return fmt::format("{} chunk dimensions", ndims);
      if (3 + 8 + 4 * ndims > size) return "chunk dimensions past the message's end";
      return outside(le(p + 3, 8), 1) ? fmt::format("a chunk index at {} past the end of the file", le(p + 3, 8)) : "";
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
  // no filter: HDF5 1.10 asks for a zero-byte array, takes the NULL as a failed allocation and
  // leaks its half-opened dataset (5 KB an H5Dopen2; kvlab writes shuffle, deflate, Fletcher32)
  if (nfilters == 0 || nfilters > 32) return fmt::format("{} filters", nfilters);
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
std::string check_message(uint16_t type, const uint8_t* p, size_t size, bool dataset, uint64_t file_size) {
  uint64_t elem = 0, n = 0;
  switch (type) {
    case 0x0000: return "";                                         // null (free space)
    case 0x0010: return size >= 16 ? "" : "a truncated continuation";
    case 0x0012: return size >= 8 ? "" : "a truncated modification time";
    case kAttribute: return check_attribute(p, size);
  }
  if (!dataset) {
    if (type == kSymbolTable) return size >= 16 ? "" : "a truncated symbol table";
  } else {
    switch (type) {
      case 0x0001: return check_dataspace(p, size, 32, &n);
      case 0x0003: return check_datatype(p, size, &elem);
      case 0x0004: return check_fill(p, size, true);
      case 0x0005: return check_fill(p, size, false);
      case 0x0008: return check_layout(p, size, file_size);
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

std::string check_superblock(RawBytes& bytes, uint64_t* root) {
  uint8_t head[80];
  const uint64_t file_size = bytes.size();
  if (!bytes.read(0, sizeof head, head) || std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) != 0)
    return "";  // not HDF5 (or a superblock elsewhere): HDF5 says what it is not
  if (head[8] > 1) return fmt::format("a version-{} superblock (kvlab writes version 0)", unsigned(head[8]));
  if (head[13] != 8 || head[14] != 8)
    return fmt::format("{}-byte addresses and {}-byte lengths (kvlab writes 8 and 8)", head[13], head[14]);
  const size_t at = head[8] == 0 ? 24 : 28;  // version 1 adds the indexed storage K
  const uint64_t base = le(head + at, 8), eof = le(head + at + 16, 8);
  if (base > file_size || eof != file_size - base)
    return fmt::format("a superblock whose end of file is {} + {} bytes, in a file of {} bytes", base, eof, file_size);
  bytes.set_base(base);
  *root = le(head + at + 40, 8);  // the root group's symbol table entry: name offset, object header
  return "";
}

uint64_t RawBytes::size() const { return size_ - std::min(base_, size_); }
void RawBytes::set_base(uint64_t base) { base_ = base; }

std::string check_object_header(const RawBytes& bytes, uint64_t addr, bool dataset) {
  uint8_t prefix[16];
  if (!bytes.read(addr, sizeof prefix, prefix)) return fmt::format("object header at {} past the end of the file", addr);
  if (std::equal(prefix, prefix + 4, "OHDR")) return "a version-2 object header (kvlab writes version 1)";
  if (prefix[0] != 1) return fmt::format("an object header of version {} (kvlab writes version 1)", unsigned(prefix[0]));
  std::vector<std::pair<uint64_t, uint64_t>> chunks = {{addr + 16, le(prefix + 8, 4)}};  // {address, bytes}
  std::set<uint64_t> seen;
  std::set<uint16_t> types;
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
      // a shared message is an address of another object's (HDF5 follows it); kvlab writes none
      if (m[4] & 0x02) return fmt::format("header message {} (type {:#06x}) shared (kvlab writes none)", i, type);
      if (type == kContinuation && size >= 16) chunks.emplace_back(le(m + 8, 8), le(m + 16, 8));
      std::string e = check_message(type, m + 8, size, dataset, bytes.size());
      if (e.empty() && type == kSymbolTable && !dataset) e = check_local_heap(bytes, le(m + 16, 8));
      if (!e.empty()) return fmt::format("header message {} (type {:#06x}): {}", i, type, e);
      types.insert(type);
      off += 8 + size;
    }
  }
  // What H5Dopen2 reads without asking whether it is there; one missing fails the open, which in
  // HDF5 1.10 leaks the half-opened dataset (5 KB a try).
  const std::pair<uint16_t, const char*> required[] = {{0x0001, "dataspace"}, {0x0003, "datatype"}, {0x0008, "layout"}};
  for (const auto& [type, what] : required)
    if (dataset && !types.count(type)) return fmt::format("no {} message (type {:#06x})", what, type);
  if (!dataset && !types.count(kSymbolTable)) return "no symbol table message (type 0x0011)";
  return "";
}

}  // namespace kvlab::capture_detail
