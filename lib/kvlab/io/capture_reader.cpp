// CaptureReader: opens a capture (a file, or a file image in memory) and checks everything HDF5
// will be asked to read before it is read; the non-finite checks; the summary 'kvlab inspect' prints.
//
// The reader trusts no byte of the file. Before HDF5 decodes an object's header, the header is
// checked from the file's bytes (check_object_header: HDF5 1.10 reads past corrupted message
// sizes); before HDF5 reads (or converts) an attribute, its type class, size, string kind and value
// count are checked; before it reads a dataset, the link kind of every part of its path, its shape
// against the attributes, its type, layout, filters, chunk size and each chunk's stored size.
// What is left, HDF5 failing on corrupt metadata or data, is caught at one boundary (Impl::guard,
// around every public entry point) and becomes one kvlab::Error naming the file and the object
// HDF5 was working on.
#include <H5Cpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>

#include "kvlab/core/check.h"
#include "kvlab/io/capture.h"
#include "kvlab/io/capture_hdf5.h"

namespace kvlab {
namespace {
using namespace capture_detail;
using Limits = CaptureLimits;

std::string shape_str(const std::vector<hsize_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// "a 4-byte integer", "a variable-length string", ... for "expected X, found Y".
std::string describe_type(const H5::DataType& t) {
  const char* names[] = {"integer", "float", "time", "string", "bitfield", "opaque", "compound",
                         "reference", "enum", "variable-length sequence", "array"};
  const H5T_class_t c = t.getClass();
  std::string name = c >= 0 && c < H5T_NCLASSES ? names[c] : "unknown";
  if (c == H5T_STRING && t.isVariableStr()) return "a variable-length string";
  return fmt::format("a {}-byte {}", t.getSize(), name);
}

// The standard integer and float types: HDF5's conversions between them are its plainest, and a
// capture never needs another (a hostile file can describe integers and floats of any shape).
bool is_standard_int(const H5::DataType& t) {
  if (t.getClass() != H5T_INTEGER) return false;
  for (const H5::PredType* p : {&H5::PredType::STD_I8LE, &H5::PredType::STD_I16LE, &H5::PredType::STD_I32LE,
                                &H5::PredType::STD_I64LE, &H5::PredType::STD_U8LE, &H5::PredType::STD_U16LE,
                                &H5::PredType::STD_U32LE, &H5::PredType::STD_U64LE, &H5::PredType::STD_I8BE,
                                &H5::PredType::STD_I16BE, &H5::PredType::STD_I32BE, &H5::PredType::STD_I64BE,
                                &H5::PredType::STD_U8BE, &H5::PredType::STD_U16BE, &H5::PredType::STD_U32BE,
                                &H5::PredType::STD_U64BE})
    if (t == *p) return true;
  return false;
}
bool is_standard_float(const H5::DataType& t) {
  if (t.getClass() != H5T_FLOAT) return false;
  for (const H5::PredType* p : {&H5::PredType::IEEE_F32LE, &H5::PredType::IEEE_F64LE, &H5::PredType::IEEE_F32BE,
                                &H5::PredType::IEEE_F64BE})
    if (t == *p) return true;
  return false;
}

std::string child(const std::string& parent, const std::string& name) {
  return parent == "/" ? "/" + name : parent + "/" + name;
}

// a * b, or -1 past `limit` (no overflow).
int64_t mul_bounded(int64_t a, int64_t b, int64_t limit) {
  if (a < 0 || b < 0 || (b != 0 && a > limit / b)) return -1;
  return a * b;
}

}  // namespace

struct CaptureReader::Impl {
  std::string path;  // or the name of a file image
  H5::H5File file;
  int64_t image_bytes = -1;  // a file image's size; -1 for a file on disk
  RawBytes raw;              // the same bytes, for check_header
  CaptureMeta meta;
  std::vector<SampleInfo> samples;
  at::ScalarType dtype = at::kFloat;
  mutable std::string at = "the file";  // what HDF5 is working on: "attribute '/n_q'", ...

  // ---- the boundary ---------------------------------------------------------------------------
  // Runs f; HDF5's exceptions become one kvlab::Error naming the file and `at`.
  template <class F>
  auto guard(F&& f) const -> decltype(f()) {
    take_hdf5_error();
    try {
      return f();
    } catch (const H5::Exception& e) {
      std::string inner = take_hdf5_error();
      KVLAB_FAIL("capture '{}': {}: HDF5 cannot read it ({}{}{}); the file is corrupt or truncated", path, at,
                 e.getDetailMsg(), inner.empty() ? "" : ": ", inner);
    }
  }
  // Throws "capture '<path>': <at>: <message>" unless ok.
  template <class... Args>
  void expect(bool ok, const char* format, const Args&... args) const {
    if (!ok) KVLAB_FAIL("capture '{}': {}: {}", path, at, fmt::format(fmt::runtime(format), args...));
  }

  // ---- objects --------------------------------------------------------------------------------
  // Every prefix of `name` ("/a", "/a/b", ...) must be a hard link: a capture holds no soft or
  // external links, and following one would read another file or loop.
  void require_hard_links(const std::string& name, const char* kind) const {
    for (size_t i = name.find('/', 1);; i = name.find('/', i + 1)) {
      std::string prefix = name.substr(0, i);
      htri_t exists = H5Lexists(file.getId(), prefix.c_str(), H5P_DEFAULT);
      if (exists < 0) throw H5::Exception("H5Lexists", "cannot look up '" + prefix + "'");
      KVLAB_CHECK(exists > 0, "capture '{}': {} '{}' is missing (truncated dump?)", path, kind, name);
      H5L_info_t info;
      if (H5Lget_info(file.getId(), prefix.c_str(), &info, H5P_DEFAULT) < 0)
        throw H5::Exception("H5Lget_info", "cannot look up '" + prefix + "'");
      expect(info.type == H5L_TYPE_HARD, "'{}' is {} link; a capture holds only groups and datasets", prefix,
             info.type == H5L_TYPE_SOFT ? "a soft" : info.type == H5L_TYPE_EXTERNAL ? "an external" : "a user-defined");
      if (i == std::string::npos) break;
    }
  }

  // The header of the object at a path (type and address; HDF5 decodes no message for these),
  // checked from the file's bytes (check_object_header) to be a `kind` before HDF5 decodes it.
  void check_header(const std::string& name, H5O_type_t kind) const {
    H5O_info_t info;
    if (H5Oget_info_by_name2(file.getId(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
      throw H5::Exception("H5Oget_info_by_name2", "cannot read the object header of '" + name + "'");
    expect(info.type == kind, "expected a {}, found another kind of object",
           kind == H5O_TYPE_GROUP ? "group" : "dataset");
    const std::string e = check_object_header(raw, info.addr, kind == H5O_TYPE_DATASET);
    expect(e.empty(), "{} (corrupt file?)", e);
  }

  H5::Group open_group(const std::string& name) const {
    at = fmt::format("group '{}'", name);
    require_hard_links(name, "group");
    check_header(name, H5O_TYPE_GROUP);
    return file.openGroup(name);
  }

  // Before HDF5 opens the file: the superblock (sets raw's base address) and the root group's
  // object header, which the open reads.
  void check_before_open() {
    uint64_t root = 0;
    std::string e = check_superblock(raw, &root);
    if (e.empty() && root) {
      at = "group '/'";
      e = check_object_header(raw, root, false);
    }
    expect(e.empty(), "{} (corrupt or truncated file?)", e);
    at = "the file";
  }

  // ---- attributes -----------------------------------------------------------------------------
  // Opens an attribute and checks it holds between lo and hi values (a scalar holds one) and as
  // many bytes as its type says; sets `at`.
  H5::Attribute open_attr(const H5::H5Object& loc, const std::string& obj, const std::string& name) const {
    at = fmt::format("attribute '{}'", child(obj, name));
    KVLAB_CHECK(loc.attrExists(name), "capture '{}': {} is missing (not a kvlab capture, or written by an "
                "incompatible version; re-run 'kvlab dump')", path, at);
    return loc.openAttribute(name);
  }
  hssize_t count_values(const H5::Attribute& a, const H5::DataType& t, hssize_t lo, hssize_t hi) const {
    auto space = a.getSpace();
    const H5S_class_t c = space.getSimpleExtentType();
    expect(c == H5S_SCALAR || c == H5S_SIMPLE, "expected {} value{}, found no dataspace", lo, lo == 1 ? "" : "s");
    const hssize_t n = c == H5S_SCALAR ? 1 : space.getSimpleExtentNpoints();
    if (lo == hi) expect(n == lo, "expected {} value{}, found {}", lo, lo == 1 ? "" : "s", n);
    else expect(n >= lo && n <= hi, "expected {} to {} values, found {}", lo, hi, n);
    const hsize_t bytes = a.getStorageSize();
    expect(bytes == hsize_t(n) * t.getSize(), "{} value(s) of {} bytes stored in {} bytes", n, t.getSize(), bytes);
    return n;
  }

  int64_t attr_int(const H5::H5Object& loc, const std::string& obj, const std::string& name, int64_t lo,
                   int64_t hi) const {
    auto a = open_attr(loc, obj, name);
    auto t = a.getDataType();
    expect(is_standard_int(t), "expected an integer, found {}", describe_type(t));
    count_values(a, t, 1, 1);
    int64_t v = 0;
    a.read(H5::PredType::NATIVE_INT64, &v);
    expect(v >= lo && v <= hi, "{} is out of range [{}, {}]", v, lo, hi);
    return v;
  }

  double attr_double(const H5::H5Object& loc, const std::string& obj, const std::string& name) const {
    auto a = open_attr(loc, obj, name);
    auto t = a.getDataType();
    expect(is_standard_float(t) || is_standard_int(t), "expected a number, found {}", describe_type(t));
    count_values(a, t, 1, 1);
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  }

  std::vector<int64_t> attr_ints(const H5::H5Object& loc, const std::string& obj, const std::string& name,
                                 hssize_t max_count) const {
    auto a = open_attr(loc, obj, name);
    auto t = a.getDataType();
    expect(is_standard_int(t), "expected integers, found {}", describe_type(t));
    const hssize_t n = count_values(a, t, 1, max_count);
    std::vector<int64_t> v(static_cast<size_t>(n));
    a.read(H5::PredType::NATIVE_INT64, v.data());
    return v;
  }

  // A fixed-length string: read in place, no global heap. Variable-length ones are refused
  // unread (see capture.h on version 1).
  std::string attr_str(const H5::H5Object& loc, const std::string& obj, const std::string& name) const {
    auto a = open_attr(loc, obj, name);
    auto t = a.getDataType();
    expect(t.getClass() == H5T_STRING, "expected a string, found {}", describe_type(t));
    expect(!t.isVariableStr(), "a variable-length string, which only capture version 1 wrote and this kvlab "
           "does not read (a corrupted one crashes HDF5); it reads version {}: re-run 'kvlab dump'", kCaptureVersion);
    const size_t size = t.getSize();
    expect(size >= 1 && int64_t(size) <= Limits::max_string_bytes, "a {}-byte string, outside [1, {}]", size,
           Limits::max_string_bytes);
    count_values(a, t, 1, 1);
    std::string s(size, '\0');
    a.read(t, s.data());  // the file's own type: no conversion
    if (size_t nul = s.find('\0'); nul != std::string::npos) s.resize(nul);
    if (a.getStrType().getStrpad() == H5T_STR_SPACEPAD) s.erase(s.find_last_not_of(' ') + 1);
    expect(is_utf8(s), "not valid UTF-8");
    return s;
  }

  // ---- datasets -------------------------------------------------------------------------------
  // Opens a dataset and checks its shape, type and storage before anything is read.
  H5::DataSet open_dataset(const std::string& name, const std::vector<hsize_t>& expected,
                           const H5::DataType& type, const std::string& type_name) const {
    at = fmt::format("dataset '{}'", name);
    require_hard_links(name, "dataset");
    check_header(name, H5O_TYPE_DATASET);
    auto ds = file.openDataSet(name);
    auto space = ds.getSpace();
    expect(space.getSimpleExtentType() == H5S_SIMPLE, "expected shape {}, found a scalar or empty dataspace",
           shape_str(expected));
    const int rank = space.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<size_t>(std::clamp(rank, 0, H5S_MAX_RANK)));
    if (!dims.empty()) space.getSimpleExtentDims(dims.data());
    expect(dims == expected, "expected shape {}, found {}", shape_str(expected), shape_str(dims));
    auto t = ds.getDataType();
    expect(t == type, "expected {}, found {}", type_name, describe_type(t));
    check_storage(ds, dims, t.getSize());
    return ds;
  }

  // Layout, filters and chunk size as the writer makes them: contiguous or chunked, in this file,
  // filtered by shuffle, deflate and Fletcher32 only (no other filter code runs on file bytes).
  void check_storage(const H5::DataSet& ds, const std::vector<hsize_t>& dims, size_t elem) const {
    auto pl = ds.getCreatePlist();
    const H5D_layout_t layout = pl.getLayout();
    expect(layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED,
           "storage layout {} is not one a capture uses (contiguous or chunked)", int(layout));
    expect(pl.getExternalCount() == 0, "stored in external files, which a capture never is");
    int64_t nbytes = int64_t(elem);
    for (hsize_t d : dims) nbytes = mul_bounded(nbytes, int64_t(d), std::numeric_limits<int64_t>::max());
    if (layout == H5D_CONTIGUOUS) {
      const hsize_t stored = ds.getStorageSize();
      expect(stored == 0 || int64_t(stored) == nbytes, "{} bytes stored for {} bytes of data", stored, nbytes);
      return;
    }
    hsize_t chunk[H5S_MAX_RANK];
    const int crank = pl.getChunk(H5S_MAX_RANK, chunk);
    expect(crank == int(dims.size()), "chunks of rank {} for a rank-{} dataset", crank, dims.size());
    int64_t cbytes = int64_t(elem);
    for (int i = 0; i < crank; ++i) {
      expect(chunk[i] >= 1 && chunk[i] <= std::max<hsize_t>(dims[i], 1), "chunk shape {} does not fit shape {}",
             shape_str({chunk, chunk + crank}), shape_str(dims));
      cbytes = mul_bounded(cbytes, int64_t(chunk[i]), Limits::max_chunk_bytes);
    }
    expect(cbytes >= 0, "chunks of shape {} exceed {} bytes", shape_str({chunk, chunk + crank}),
           Limits::max_chunk_bytes);
    // HDF5 1.10 keeps a record of every chunk a read touches (H5D__chunk_io_init), and a file of a
    // few KB can declare millions of unwritten ones: [1, 1, 1] chunks made one 16 MB layer read take
    // 9 s and 0.7 GB under ASan. The part of a chunk in one head (a read may be of one head) holds
    // at least min_chunk_bytes, or the whole head: a read then touches at most 8 chunks per
    // min_chunk_bytes it reads (each chunk fits its dataset, so at most 2 per axis are partly outside).
    const int64_t all = nbytes < 0 ? std::numeric_limits<int64_t>::max() : nbytes;  // < 0: overflowed
    const bool heads = dims.size() == 3 && dims[0] > 0;  // [heads, n, head_dim]
    const int64_t head = heads ? all / int64_t(dims[0]) : all;
    const int64_t least = std::min(Limits::min_chunk_bytes, head);
    const int64_t in_head = heads ? cbytes / int64_t(chunk[0]) : cbytes;
    expect(in_head >= least, "chunks of shape {} hold {} bytes of a head, fewer than {} (a capture's chunks hold {} "
           "bytes of a head or the whole head)", shape_str({chunk, chunk + crank}), in_head, least,
           Limits::min_chunk_bytes);
    for (int i = 0, n = pl.getNfilters(); i < n; ++i) {
      unsigned flags = 0, config = 0, cd[8] = {0};
      size_t ncd = 8;
      char name[64] = {0};
      const H5Z_filter_t id = pl.getFilter(i, flags, ncd, cd, sizeof name, name, config);
      const bool ok = id == H5Z_FILTER_FLETCHER32 || (id == H5Z_FILTER_DEFLATE && ncd == 1 && cd[0] <= 9) ||
                      (id == H5Z_FILTER_SHUFFLE && ncd == 1 && cd[0] == elem);
      expect(ok, "filter {} with {} parameter(s) is not one a capture uses (shuffle of {}-byte values, deflate, "
             "fletcher32)", int(id), ncd, elem);
    }
  }

  // Reads heads [h0, h0 + nh) of a [heads, n, head_dim] q/k/v dataset.
  at::Tensor read_heads(const std::string& name, const std::vector<hsize_t>& dims, int64_t h0, int64_t nh,
                        at::ScalarType as) const {
    const auto ft = float_file_type(dtype);
    auto ds = open_dataset(name, dims, ft, meta.dtype + " (the file's dtype attribute)");
    auto out = allocate({nh, int64_t(dims[1]), int64_t(dims[2])}, dtype);
    if (out.numel() > 0) {
      hsize_t offset[3] = {hsize_t(h0), 0, 0}, count[3] = {hsize_t(nh), dims[1], dims[2]};
      auto fspace = ds.getSpace();
      fspace.selectHyperslab(H5S_SELECT_SET, count, offset);
      H5::DataSpace mspace(3, count);
      check_chunks(ds, dims, h0, nh, ft.getSize());
      ds.read(out.data_ptr(), ft, mspace, fspace);  // the file's own type: no conversion
    }
    return as == dtype ? out : allocate(out.sizes().vec(), as).copy_(out);
  }

  // The chunks of heads [h0, h0 + nh) of a chunked [heads, n, head_dim] dataset, from the chunk
  // index, before HDF5 reads them: a chunk that no filter touches (none in the pipeline, or all
  // masked off for it) must be stored at exactly the chunk's size (HDF5 1.10 copies a full chunk
  // out of what is stored, reading past a short one); one that Fletcher32 checks holds at least
  // its 4-byte checksum; none holds much more than the chunk (deflate can grow a small chunk by a
  // few bytes: seen 183 stored for 176).
  void check_chunks(const H5::DataSet& ds, const std::vector<hsize_t>& dims, int64_t h0, int64_t nh,
                    size_t elem) const {
    auto pl = ds.getCreatePlist();
    if (pl.getLayout() != H5D_CHUNKED) return;
    hsize_t chunk[3];
    pl.getChunk(3, chunk);  // rank 3, checked by check_storage
    const int nfilters = pl.getNfilters();
    int fletcher = -1;
    for (int i = 0; i < nfilters; ++i) {
      unsigned flags = 0, config = 0;
      size_t ncd = 0;
      if (pl.getFilter(i, flags, ncd, nullptr, 0, nullptr, config) == H5Z_FILTER_FLETCHER32) fletcher = i;
    }
    // kvlab writes every chunk through shuffle, deflate and Fletcher32 (capture.cpp) and never masks
    // a filter off: the checksum is checked first on read, so corrupted stored bytes never reach
    // inflate. A pipeline without it, or a chunk that skips a filter, is corruption (seen: a chunk
    // whose mask skipped the checksum inflated to less than a chunk, and HDF5 1.10 copied a full
    // chunk out of it: a heap over-read in H5VM_memcpyvv).
    expect(fletcher >= 0, "its filter pipeline holds no Fletcher32 checksum (kvlab writes shuffle, deflate and "
           "Fletcher32)");
    const hsize_t bytes = chunk[0] * chunk[1] * chunk[2] * elem;  // <= max_chunk_bytes
    for (hsize_t a = hsize_t(h0) / chunk[0] * chunk[0]; a < hsize_t(h0 + nh); a += chunk[0])
      for (hsize_t b = 0; b < dims[1]; b += chunk[1])
        for (hsize_t c = 0; c < dims[2]; c += chunk[2]) {
          hsize_t offset[3] = {a, b, c}, size = 0;
          unsigned mask = 0;
          haddr_t addr = HADDR_UNDEF;
          if (H5Dget_chunk_info_by_coord(ds.getId(), offset, &mask, &addr, &size) < 0)
            throw H5::Exception("H5Dget_chunk_info_by_coord", "cannot look up a chunk");
          if (addr == HADDR_UNDEF) continue;  // never written: reads as the fill value
          const uint64_t all = (uint64_t(1) << nfilters) - 1;  // nfilters <= 32 (H5Z_MAX_NFILTERS)
          const bool unfiltered = (mask & all) == all;
          const bool checksummed = fletcher >= 0 && !(mask & (1u << fletcher));
          expect(mask == 0, "the chunk at [{}, {}, {}] skips filters (mask {:#x}); kvlab applies every one", a, b, c,
                 mask);
          const hsize_t most = bytes + bytes / 100 + 64;  // deflate's worst case: a few bytes more
          expect((!unfiltered || size == bytes) && (!checksummed || size >= 4) && size <= most,
                 "the chunk at [{}, {}, {}] holds {} bytes for a {}-byte chunk{}", a, b, c, size, bytes,
                 unfiltered ? " that no filter decodes" : "");
        }
  }

  at::Tensor allocate(const std::vector<int64_t>& sizes, at::ScalarType t) const {
    try {
      return at::empty(sizes, at::TensorOptions().dtype(t));
    } catch (const c10::Error&) {
      KVLAB_FAIL("capture '{}': {}: cannot allocate a {} tensor of shape [{}]", path, at, c10::toString(t),
                 fmt::join(sizes, ", "));
    }
  }

  // ---- opening --------------------------------------------------------------------------------
  void load();
  void load_meta();
  SampleInfo load_sample(int64_t s) const;
  std::vector<hsize_t> q_dims(const SampleInfo& s) const {
    return {hsize_t(meta.n_q_heads), hsize_t(s.n_q), hsize_t(meta.head_dim)};
  }
  std::vector<hsize_t> kv_dims(const SampleInfo& s) const {
    return {hsize_t(meta.n_kv_heads), hsize_t(s.n_tokens), hsize_t(meta.head_dim)};
  }
};

void CaptureReader::Impl::load() {
  guard([&] {
    load_meta();
    const int64_t n = attr_int(file, "/", "n_samples", 1, Limits::max_samples);
    for (int64_t s = 0; s < n; ++s) samples.push_back(load_sample(s));
  });
}

void CaptureReader::Impl::load_meta() {
  const std::string r = "/";
  const H5::H5File& f = file;
  at = "group '/'";
  check_header("/", H5O_TYPE_GROUP);
  const int64_t version = attr_int(f, r, "kvlab_capture_version", 0, std::numeric_limits<int64_t>::max());
  KVLAB_CHECK(version != 1, "capture '{}' is capture format version 1, whose variable-length string attributes "
              "this kvlab no longer reads (a corrupted one crashes HDF5); it reads version {}: re-run 'kvlab dump' "
              "(or 'kvlab synth') to write it again", path, kCaptureVersion);
  KVLAB_CHECK(version == kCaptureVersion, "capture '{}': capture version {} unsupported (expected {}); re-run "
              "'kvlab dump'", path, version, kCaptureVersion);
  KVLAB_CHECK(f.attrExists("complete") && attr_int(f, r, "complete", 0, 1) == 1,
              "capture '{}': the writer did not finish (no 'complete' mark); re-run 'kvlab dump'", path);
  auto& md = meta;
  md.model_id = attr_str(f, r, "model_id");
  md.architecture = attr_str(f, r, "architecture");
  md.n_layers = int(attr_int(f, r, "n_layers", 1, Limits::max_layers));
  md.n_q_heads = int(attr_int(f, r, "n_q_heads", 1, Limits::max_heads));
  md.n_kv_heads = int(attr_int(f, r, "n_kv_heads", 1, Limits::max_heads));
  expect(md.n_q_heads % md.n_kv_heads == 0, "n_q_heads={} is not a multiple of n_kv_heads={}", md.n_q_heads,
         md.n_kv_heads);
  md.head_dim = int(attr_int(f, r, "head_dim", 1, Limits::max_head_dim));
  md.rope_theta = attr_double(f, r, "rope_theta");
  expect(std::isfinite(md.rope_theta) && md.rope_theta > 0, "expected a positive number, found {}", md.rope_theta);
  md.rope_scaling = nlohmann::json::parse(attr_str(f, r, "rope_scaling"), nullptr, false);
  expect(!md.rope_scaling.is_discarded(), "expected JSON (null or the config's rope_scaling object)");
  md.dtype = attr_str(f, r, "dtype");
  dtype = parse_storage_dtype(md.dtype, fmt::format("capture '{}': {}", path, at));
  for (int64_t l : attr_ints(f, r, "layers", md.n_layers)) {
    expect(l >= 0 && l < md.n_layers, "captured layer {} outside 0..{}", l, md.n_layers - 1);
    const int64_t previous = md.layers.empty() ? -1 : md.layers.back();
    expect(l > previous, "layers are not strictly ascending: {} after {}", l, previous);
    md.layers.push_back(int(l));
  }
  md.queries = attr_str(f, r, "queries");
  md.source_dataset = attr_str(f, r, "source_dataset");
  md.kvlab_version = attr_str(f, r, "kvlab_version");
  md.git_sha = attr_str(f, r, "git_sha");
}

SampleInfo CaptureReader::Impl::load_sample(int64_t s) const {
  const std::string sg = "/" + sample_name(s);
  auto g = open_group(sg);
  SampleInfo info;
  info.sample_id = attr_str(g, sg, "sample_id");
  info.n_tokens = attr_int(g, sg, "n_tokens", 1, Limits::max_tokens);
  info.n_q = attr_int(g, sg, "n_q", 1, info.n_tokens);
  info.q_start = attr_int(g, sg, "q_start", 0, info.n_tokens - 1);
  expect(info.q_start == info.n_tokens - info.n_q, "q_start={} is not n_tokens - n_q = {} - {}", info.q_start,
         info.n_tokens, info.n_q);
  open_dataset(sg + "/tokens", {hsize_t(info.n_tokens)}, H5::PredType::STD_I32LE, "int32 token ids");
  const auto ft = float_file_type(dtype);
  const std::string what = meta.dtype + " (the file's dtype attribute)";
  for (int l : meta.layers) {
    const std::string lg = sg + "/" + layer_name(l);
    open_dataset(lg + "/q", q_dims(info), ft, what);
    open_dataset(lg + "/k", kv_dims(info), ft, what);
    open_dataset(lg + "/v", kv_dims(info), ft, what);
  }
  return info;
}

// ================================= CaptureReader ===============================================

CaptureReader::CaptureReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CaptureReader::CaptureReader(const std::string& path) : impl_(new Impl) {
  init_hdf5();
  auto& m = *impl_;
  m.path = path;
  KVLAB_CHECK(std::filesystem::exists(path), "capture '{}': no such file", path);
  m.guard([&] {
    KVLAB_CHECK(H5::H5File::isHdf5(path), "capture '{}': not an HDF5 file (corrupt, truncated, or not a "
                "capture)", path);
    m.raw = RawBytes::of_file(path, 0);
    m.check_before_open();
    m.file = H5::H5File(path, H5F_ACC_RDONLY);
  });
  m.load();
}

CaptureReader CaptureReader::from_image(const void* data, size_t size, const std::string& name) {
  init_hdf5();
  auto m = std::make_unique<Impl>();
  m->path = name;
  m->image_bytes = int64_t(size);
  KVLAB_CHECK(data && size >= 8, "capture '{}': not an HDF5 file ({} bytes)", name, size);
  m->guard([&] {
    m->raw = RawBytes::of_image(data, size, 0);
    m->check_before_open();
    // The core driver, without a backing store, on a copy of the image: nothing touches disk.
    H5::FileAccPropList fapl;
    fapl.setCore(1 << 16, false);
    if (H5Pset_file_image(fapl.getId(), const_cast<void*>(data), size) < 0)
      throw H5::Exception("H5Pset_file_image", "cannot use the file image");
    // HDF5 takes two open core files of the same name for one file: a name of its own per image.
    static std::atomic<uint64_t> counter{0};
    const std::string h5name = fmt::format("kvlab-image-{}:{}", counter++, name);
    m->file = H5::H5File(h5name, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
  });
  m->load();
  return CaptureReader(std::move(m));
}

CaptureReader::~CaptureReader() = default;
CaptureReader::CaptureReader(CaptureReader&&) noexcept = default;

const CaptureMeta& CaptureReader::meta() const { return impl_->meta; }
const std::string& CaptureReader::path() const { return impl_->path; }
int64_t CaptureReader::n_samples() const { return static_cast<int64_t>(impl_->samples.size()); }

const SampleInfo& CaptureReader::sample(int64_t i) const {
  KVLAB_CHECK(i >= 0 && i < n_samples(), "--samples: sample {} out of range: the capture has {}", i, n_samples());
  return impl_->samples[static_cast<size_t>(i)];
}

at::Tensor CaptureReader::tokens(int64_t s) const {
  const auto& info = sample(s);
  const auto& m = *impl_;
  return m.guard([&] {
    const std::string name = "/" + sample_name(s) + "/tokens";
    auto ds = m.open_dataset(name, {hsize_t(info.n_tokens)}, H5::PredType::STD_I32LE, "int32 token ids");
    auto out = m.allocate({info.n_tokens}, at::kInt);
    ds.read(out.data_ptr<int32_t>(), H5::PredType::STD_I32LE);
    return out.to(at::kLong);
  });
}

LayerQKV CaptureReader::read_layer(int64_t s, int layer, at::ScalarType as) const {
  const auto& info = sample(s);
  const auto& m = *impl_;
  const auto& md = m.meta;
  KVLAB_CHECK(std::find(md.layers.begin(), md.layers.end(), layer) != md.layers.end(),
              "--layers: layer {} was not captured in '{}' (captured: {})", layer, m.path, fmt::join(md.layers, ","));
  const std::string lg = "/" + sample_name(s) + "/" + layer_name(layer);
  return m.guard([&] {
    return LayerQKV{m.read_heads(lg + "/q", m.q_dims(info), 0, md.n_q_heads, as),
                    m.read_heads(lg + "/k", m.kv_dims(info), 0, md.n_kv_heads, as),
                    m.read_heads(lg + "/v", m.kv_dims(info), 0, md.n_kv_heads, as)};
  });
}

LayerQKV CaptureReader::read_kv_head(int64_t s, int layer, int kv_head, at::ScalarType as) const {
  const auto& info = sample(s);
  const auto& m = *impl_;
  const auto& md = m.meta;
  KVLAB_CHECK(kv_head >= 0 && kv_head < md.n_kv_heads, "--heads: KV head {} out of range 0..{}", kv_head,
              md.n_kv_heads - 1);
  KVLAB_CHECK(std::find(md.layers.begin(), md.layers.end(), layer) != md.layers.end(),
              "--layers: layer {} was not captured in '{}'", layer, m.path);
  const int g = md.n_q_heads / md.n_kv_heads;
  const std::string lg = "/" + sample_name(s) + "/" + layer_name(layer);
  return m.guard([&] {
    return LayerQKV{m.read_heads(lg + "/q", m.q_dims(info), int64_t(kv_head) * g, g, as),
                    m.read_heads(lg + "/k", m.kv_dims(info), kv_head, 1, as),
                    m.read_heads(lg + "/v", m.kv_dims(info), kv_head, 1, as)};
  });
}

int64_t CaptureReader::file_bytes() const {
  if (impl_->image_bytes >= 0) return impl_->image_bytes;
  return static_cast<int64_t>(std::filesystem::file_size(impl_->path));
}

int64_t CaptureReader::raw_bytes() const {
  const auto& md = impl_->meta;
  int64_t elems = 0;
  for (const auto& s : impl_->samples)
    elems += int64_t(md.layers.size()) * md.head_dim * (md.n_q_heads * s.n_q + 2 * md.n_kv_heads * s.n_tokens);
  return elems * static_cast<int64_t>(c10::elementSize(impl_->dtype));
}

// ================================= summary =====================================================

nlohmann::json capture_summary(const CaptureReader& r) {
  const auto& m = r.meta();
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t i = 0; i < r.n_samples(); ++i) {
    const auto& s = r.sample(i);
    samples.push_back({{"index", i}, {"sample_id", s.sample_id}, {"n_tokens", s.n_tokens}, {"n_q", s.n_q},
                       {"q_start", s.q_start}});
  }
  return {{"file", r.path()},
          {"kvlab_capture_version", kCaptureVersion},
          {"model_id", m.model_id},
          {"architecture", m.architecture},
          {"n_layers", m.n_layers},
          {"n_q_heads", m.n_q_heads},
          {"n_kv_heads", m.n_kv_heads},
          {"head_dim", m.head_dim},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", m.rope_scaling},
          {"dtype", m.dtype},
          {"layers", m.layers},
          {"queries", m.queries},
          {"source_dataset", m.source_dataset},
          {"kvlab_version", m.kvlab_version},
          {"git_sha", m.git_sha},
          {"n_samples", r.n_samples()},
          {"samples", samples},
          {"shapes", {{"q", {m.n_q_heads, "n_q", m.head_dim}},
                      {"k", {m.n_kv_heads, "n_tokens", m.head_dim}},
                      {"v", {m.n_kv_heads, "n_tokens", m.head_dim}}}},
          {"file_bytes", r.file_bytes()},
          {"raw_bytes", r.raw_bytes()}};
}

// ================================= non-finite values ===========================================

NonFinite find_nonfinite(const LayerQKV& qkv, int64_t q_start) {
  NonFinite nf;
  const std::pair<const char*, const at::Tensor*> parts[] = {{"q", &qkv.q}, {"k", &qkv.k}, {"v", &qkv.v}};
  for (const auto& [name, t] : parts) {
    if (!t->defined() || t->numel() == 0) continue;
    KVLAB_CHECK(t->dim() == 3, "find_nonfinite: {} must be [heads, positions, head_dim], got {}", name, t->sizes());
    auto bad = at::isfinite(*t).logical_not().flatten();  // [heads * positions * head_dim]
    const int64_t c = bad.sum().item<int64_t>();
    if (c == 0) continue;
    if (nf.count == 0) {
      const int64_t n = t->size(1), d = t->size(2);
      const int64_t i = bad.to(at::kByte).argmax().item<int64_t>();  // the first true
      nf.tensor = name;
      nf.head = int(i / (n * d));
      nf.position = (i / d) % n + (nf.tensor == "q" ? q_start : 0);
      nf.dim = i % d;
      nf.value = t->flatten()[i].item<double>();
    }
    nf.count += c;
  }
  return nf;
}

std::string describe_nonfinite(const NonFinite& nf) {
  return fmt::format("{} = {} at {} head {}, position {} (dim {})", nf.tensor, nf.value,
                     nf.tensor == "q" ? "query" : "KV", nf.head, nf.position, nf.dim);
}

void check_finite(const CaptureReader& cap, int64_t sample, int layer, const LayerQKV& qkv) {
  const SampleInfo& info = cap.sample(sample);
  const NonFinite nf = find_nonfinite(qkv, info.q_start);
  KVLAB_CHECK(nf.count == 0, "capture '{}': sample {} ('{}'), layer {}: {} non-finite value{} in q/k/v; the first "
              "is {}", cap.path(), sample, info.sample_id, layer, nf.count, nf.count == 1 ? "" : "s",
              describe_nonfinite(nf));
}

CaptureNonFinite scan_nonfinite(const CaptureReader& cap) {
  CaptureNonFinite out;
  for (int64_t s = 0; s < cap.n_samples(); ++s)
    for (int layer : cap.meta().layers) {
      const NonFinite nf = find_nonfinite(cap.read_layer(s, layer), cap.sample(s).q_start);
      if (nf.count == 0) continue;
      if (out.units == 0) {
        out.sample = s;
        out.layer = layer;
        out.first = nf;
      }
      ++out.units;
      out.count += nf.count;
    }
  return out;
}

}  // namespace kvlab
