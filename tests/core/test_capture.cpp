// The capture format: round trips, per-head reads, and one clear error per kind of bad file.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <H5Cpp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/io/capture.h"
#include "kvlab/io/capture_hdf5.h"
#include "kvlab/io/synthetic.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {
SyntheticSpec small_spec() {
  SyntheticSpec s;
  s.kind = "clustered";
  s.n_layers = 3;
  s.n_q_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 65;
  s.n_tokens = 127;
  s.n_q = 19;
  s.n_samples = 2;
  s.seed = 3;
  return s;
}
}  // namespace

TEST_CASE("capture round trip in float32, float16 and bfloat16") {
  auto spec = small_spec();
  for (std::string dtype : {"float32", "float16", "bfloat16"}) {
    INFO("dtype=" << dtype);
    auto path = test::temp_dir("cap") + "/c.h5";
    write_synthetic_capture(path, spec, dtype);
    CaptureReader r(path);
    CHECK(r.meta().n_layers == 3);
    CHECK(r.meta().n_q_heads == 6);
    CHECK(r.meta().n_kv_heads == 2);
    CHECK(r.meta().head_dim == 65);
    CHECK(r.meta().dtype == dtype);
    CHECK(r.meta().queries == "last:19");
    REQUIRE(r.n_samples() == 2);
    CHECK(r.sample(1).n_tokens == 127);
    CHECK(r.sample(1).q_start == 108);
    CHECK(r.tokens(0).equal(at::arange(127, at::kLong)));
    double tol = dtype == "float32" ? 0 : (dtype == "float16" ? 2e-3 : 1e-2);
    for (int s = 0; s < 2; ++s)
      for (int l = 0; l < 3; ++l) {
        auto ref = synthetic_layer(spec, s, l);
        auto got = r.read_layer(s, l);
        CHECK((got.q.sizes() == ref.q.sizes()));
        CHECK((got.k.sizes() == ref.k.sizes()));
        CHECK(test::max_rel_diff(got.k, ref.k, 1.0) <= tol);
        CHECK(test::max_rel_diff(got.v, ref.v, 1.0) <= tol);
        CHECK(test::max_rel_diff(got.q, ref.q, 1.0) <= tol);
        auto h1 = r.read_kv_head(s, l, 1);
        CHECK(h1.k.equal(got.k.narrow(0, 1, 1)));
        CHECK(h1.q.equal(got.q.narrow(0, 3, 3)));
      }
  }
}

TEST_CASE("tiny captures read back: a chunk that deflate grew is no corruption") {
  // stories260K's bfloat16 dump stores 183 bytes for a 176-byte [1, 11, 8] chunk.
  SyntheticSpec s;
  s.n_layers = 2, s.n_q_heads = 2, s.n_kv_heads = 1, s.head_dim = 8, s.n_tokens = 11, s.n_q = 11;
  for (std::string dtype : {"float32", "float16", "bfloat16"})
    for (uint64_t seed = 0; seed < 4; ++seed) {
      INFO(dtype << " seed " << seed);
      s.seed = seed;
      auto path = test::temp_dir("cap_tiny") + "/c.h5";
      write_synthetic_capture(path, s, dtype);
      CaptureReader r(path);
      CHECK(r.read_layer(0, 1).k.sizes() == at::IntArrayRef({1, 11, 8}));
    }
}

TEST_CASE("a failed write leaves no file and keeps an existing one") {
  auto dir = test::temp_dir("cap_fail");
  auto path = dir + "/c.h5";
  { std::ofstream(path) << "precious"; }
  {
    CaptureMeta m;
    m.n_layers = 2, m.n_q_heads = 2, m.n_kv_heads = 1, m.head_dim = 4;
    CaptureWriter w(path, m);
    w.begin_sample("s", at::arange(5), 5);
    CHECK_THROWS_WITH_AS(w.write_layer(0, at::zeros({2, 5, 4}), at::zeros({1, 6, 4}), at::zeros({1, 5, 4})),
                         doctest::Contains("expected [1, 5, 4]"), Error);
  }  // writer destroyed unfinished
  CHECK(!fs::exists(path + ".partial"));
  std::ifstream in(path);
  std::string s;
  in >> s;
  CHECK(s == "precious");
}

TEST_CASE("bad captures give one clear error naming the file and the problem") {
  auto spec = small_spec();
  auto dir = test::temp_dir("cap_bad");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, spec);

  SUBCASE("missing file") {
    CHECK_THROWS_WITH_AS(CaptureReader(dir + "/nope.h5"), doctest::Contains("no such file"), Error);
  }
  SUBCASE("not HDF5") {
    auto p = dir + "/text.h5";
    std::ofstream(p) << "hello";
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("not an HDF5 file"), Error);
  }
  SUBCASE("truncated") {
    auto p = dir + "/trunc.h5";
    fs::copy_file(good, p);
    fs::resize_file(p, fs::file_size(p) / 2);
    CHECK_THROWS_AS(CaptureReader{p}, Error);
    try {
      CaptureReader r{p};
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(p) != std::string::npos);
    }
  }
}

TEST_CASE("a missing dataset, a wrong dtype, a wrong shape, a wrong version: each named") {
  auto spec = small_spec();
  auto dir = test::temp_dir("cap_edit");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, spec);
  auto edited = [&](const std::string& name, auto&& edit) {
    auto p = dir + "/" + name + ".h5";
    fs::copy_file(good, p, fs::copy_options::overwrite_existing);
    H5::H5File f(p, H5F_ACC_RDWR);
    edit(f);
    f.close();
    return p;
  };
  SUBCASE("missing dataset") {
    auto p = edited("missing", [](H5::H5File& f) { f.unlink("/sample_0001/layer_02/v"); });
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("'/sample_0001/layer_02/v' is missing"), Error);
  }
  SUBCASE("wrong dtype") {
    auto p = edited("dtype", [](H5::H5File& f) {
      f.unlink("/sample_0000/layer_01/k");
      hsize_t dims[3] = {2, 127, 65};
      f.createDataSet("/sample_0000/layer_01/k", H5::PredType::STD_I32LE, H5::DataSpace(3, dims));
    });
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("'/sample_0000/layer_01/k': expected float32"), Error);
  }
  SUBCASE("wrong shape") {
    auto p = edited("shape", [](H5::H5File& f) {
      f.unlink("/sample_0000/layer_00/q");
      hsize_t dims[3] = {6, 18, 65};
      f.createDataSet("/sample_0000/layer_00/q", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims));
    });
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("expected shape [6, 19, 65], found [6, 18, 65]"), Error);
  }
  SUBCASE("version") {
    auto p = edited("version", [](H5::H5File& f) {
      auto a = f.openAttribute("kvlab_capture_version");
      int64_t v = 0;
      a.write(H5::PredType::NATIVE_INT64, &v);
    });
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("capture version 0 unsupported (expected 2)"), Error);
  }
}

// ---- corrupted and hostile captures (issue 14): one kvlab::Error naming the file, never a crash ----

namespace {
std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }
template <class T>
std::string le_bytes(T v) {
  std::string s(sizeof(T), '\0');
  for (size_t i = 0; i < sizeof(T); ++i) s[i] = char((uint64_t(v) >> (8 * i)) & 0xff);
  return s;
}
// The capture `good` copied to dir/name.h5 and edited with the HDF5 C++ API.
template <class Edit>
std::string edited_copy(const std::string& good, const std::string& dir, const std::string& name, Edit&& edit) {
  auto p = dir + "/" + name + ".h5";
  fs::copy_file(good, p, fs::copy_options::overwrite_existing);
  H5::H5File f(p, H5F_ACC_RDWR);
  edit(f);
  f.close();
  return p;
}
// The error CaptureReader(p) throws ("" if none), so one test can look for several words in it.
std::string open_error(const std::string& p) {
  try {
    CaptureReader r(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a variable-length string attribute with a bogus global-heap id: one error, no crash") {
  // What 3 of 145 mutated captures did to 'kvlab inspect' (H5HG_read <- H5Aread <- get_str): the
  // attribute's heap id points at a real heap collection but at an object index far beyond it.
  auto dir = test::temp_dir("cap_heap");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  const std::string marker = "kvlab-heap-marker-0123456789";
  auto p = edited_copy(good, dir, "heap", [&](H5::H5File& f) {
    f.removeAttr("model_id");
    H5::StrType vl(H5::PredType::C_S1, H5T_VARIABLE);
    f.createAttribute("model_id", vl, H5::DataSpace(H5S_SCALAR)).write(vl, marker);
  });
  std::string b = read_bytes(p);
  // In the file the attribute holds {u32 length, u64 collection address, u32 object index}; the
  // object itself sits in a "GCOL" collection behind a 16-byte header starting with its u16 index.
  size_t at = b.find(marker);
  REQUIRE(at != std::string::npos);
  size_t gcol = b.rfind("GCOL", at);
  REQUIRE(gcol != std::string::npos);
  uint16_t idx = uint16_t(uint8_t(b[at - 16]) | (uint8_t(b[at - 15]) << 8));
  std::string id = le_bytes<uint32_t>(uint32_t(marker.size())) + le_bytes<uint64_t>(gcol) + le_bytes<uint32_t>(idx);
  size_t where = b.find(id);
  REQUIRE(where != std::string::npos);
  b.replace(where + 12, 4, le_bytes<uint32_t>(0x7ffffff0u));
  write_bytes(p, b);
  std::string e = open_error(p);
  INFO(e);
  CHECK(e.find(p) != std::string::npos);
  CHECK(e.find("model_id") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("corrupted attribute bytes: one error naming the file and the attribute") {
  auto dir = test::temp_dir("cap_attr");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  SUBCASE("a string attribute's bytes flipped (not UTF-8)") {
    auto p = dir + "/flipped.h5";
    std::string b = read_bytes(good);
    size_t at = b.find("synthetic:clustered:seed=3");  // source_dataset
    REQUIRE(at != std::string::npos);
    for (size_t i = 0; i < 4; ++i) b[at + i] = char(b[at + i] ^ 0xa5);
    write_bytes(p, b);
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("/source_dataset") != std::string::npos);
  }
  SUBCASE("a number attribute holding 4096 values") {
    auto p = edited_copy(good, dir, "array", [](H5::H5File& f) {
      f.removeAttr("rope_theta");
      std::vector<double> v(4096, 1e4);
      hsize_t n = v.size();
      f.createAttribute("rope_theta", H5::PredType::IEEE_F64LE, H5::DataSpace(1, &n))
          .write(H5::PredType::NATIVE_DOUBLE, v.data());
    });
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("rope_theta") != std::string::npos);
    CHECK(e.find("4096") != std::string::npos);
  }
  SUBCASE("a string where an integer belongs") {
    auto p = edited_copy(good, dir, "class", [](H5::H5File& f) {
      f.openGroup("sample_0001").removeAttr("n_tokens");
      H5::StrType st(H5::PredType::C_S1, 3);
      f.openGroup("sample_0001").createAttribute("n_tokens", st, H5::DataSpace(H5S_SCALAR)).write(st, "127");
    });
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("/sample_0001/n_tokens") != std::string::npos);
  }
}

TEST_CASE("a version-1 capture (variable-length strings) is refused, saying which version is needed") {
  auto dir = test::temp_dir("cap_v1");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  auto p = edited_copy(good, dir, "v1", [](H5::H5File& f) {
    int64_t one = 1;
    f.openAttribute("kvlab_capture_version").write(H5::PredType::NATIVE_INT64, &one);
    f.removeAttr("model_id");
    H5::StrType vl(H5::PredType::C_S1, H5T_VARIABLE);
    f.createAttribute("model_id", vl, H5::DataSpace(H5S_SCALAR)).write(vl, std::string("synthetic"));
  });
  std::string e = open_error(p);
  INFO(e);
  CHECK(e.find(p) != std::string::npos);
  CHECK(e.find("version 1") != std::string::npos);
  CHECK(e.find("version 2") != std::string::npos);
}

TEST_CASE("dataset shapes are checked against the attributes before any read") {
  auto dir = test::temp_dir("cap_shape");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  SUBCASE("k one token short of n_tokens") {
    auto p = edited_copy(good, dir, "short", [](H5::H5File& f) {
      f.unlink("/sample_0001/layer_02/k");
      hsize_t dims[3] = {2, 126, 65};
      f.createDataSet("/sample_0001/layer_02/k", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims));
    });
    CHECK_THROWS_WITH_AS(CaptureReader{p},
                         doctest::Contains("'/sample_0001/layer_02/k': expected shape [2, 127, 65], found [2, 126, 65]"),
                         Error);
  }
  SUBCASE("an architecture attribute that does not fit the datasets (n_q_heads = 2^32 + 6)") {
    auto p = edited_copy(good, dir, "heads", [](H5::H5File& f) {
      int64_t v = (int64_t(1) << 32) + 6;
      f.openAttribute("n_q_heads").write(H5::PredType::NATIVE_INT64, &v);
    });
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("n_q_heads") != std::string::npos);
  }
  SUBCASE("attributes and empty datasets that agree on 2^46 tokens") {
    // No byte of the 2^46 tokens is stored; a reader that trusts the shapes allocates petabytes.
    const int64_t n = int64_t(1) << 46;
    auto p = edited_copy(good, dir, "huge", [&](H5::H5File& f) {
      auto g = f.openGroup("sample_0001");
      int64_t q_start = n - 19;
      g.openAttribute("n_tokens").write(H5::PredType::NATIVE_INT64, &n);
      g.openAttribute("q_start").write(H5::PredType::NATIVE_INT64, &q_start);
      g.unlink("tokens");
      hsize_t tdims[1] = {hsize_t(n)};
      g.createDataSet("tokens", H5::PredType::STD_I32LE, H5::DataSpace(1, tdims));
      for (int l = 0; l < 3; ++l)
        for (const char* t : {"k", "v"}) {
          std::string name = fmt::format("layer_{:02d}/{}", l, t);
          g.unlink(name);
          hsize_t dims[3] = {2, hsize_t(n), 65};
          g.createDataSet(name, H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims));
        }
    });
    std::string e;
    try {
      CaptureReader r(p);
      (void)r.read_layer(1, 0);
    } catch (const Error& err) {
      e = err.what();
    }
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("n_tokens") != std::string::npos);
  }
  SUBCASE("an external link in place of a dataset") {
    auto other = dir + "/other.h5";
    fs::copy_file(good, other);
    auto p = edited_copy(good, dir, "elink", [&](H5::H5File& f) {
      f.unlink("/sample_0000/layer_00/k");
      REQUIRE(H5Lcreate_external(other.c_str(), "/sample_0000/layer_00/k", f.getId(), "/sample_0000/layer_00/k",
                                 H5P_DEFAULT, H5P_DEFAULT) >= 0);
    });
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("'/sample_0000/layer_00/k'") != std::string::npos);
    CHECK(e.find("link") != std::string::npos);
  }
}

namespace {
uint64_t le_at(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | uint8_t(b[at + size_t(i)]);
  return v;
}
// File offsets of the header messages of `type` in the (version-1) object header of `object`:
// each points at the message's 8-byte header {u16 type, u16 size, u8 flags, 3 reserved}.
std::vector<size_t> header_messages(const std::string& path, const std::string& object, uint16_t type) {
  H5O_info_t info;
  {
    H5::H5File f(path, H5F_ACC_RDONLY);
    REQUIRE(H5Oget_info_by_name2(f.getId(), object.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0);
  }
  const std::string b = read_bytes(path);
  std::vector<std::pair<size_t, size_t>> chunks = {{size_t(info.addr) + 16, size_t(le_at(b, info.addr + 8, 4))}};
  std::vector<size_t> found;
  for (size_t c = 0; c < chunks.size(); ++c)
    for (size_t off = 0; off + 8 <= chunks[c].second;) {
      const size_t at = chunks[c].first + off, size = le_at(b, at + 2, 2);
      if (le_at(b, at, 2) == 0x10) chunks.emplace_back(le_at(b, at + 8, 8), le_at(b, at + 16, 8));
      if (le_at(b, at, 2) == type) found.push_back(at);
      off += 8 + size;
    }
  return found;
}
}  // namespace

TEST_CASE("header messages whose sizes lie are refused before HDF5 decodes them") {
  // What the capture fuzzer found HDF5 1.10 reading past (fuzz/README.md): it trusts the sizes
  // inside an object header's messages when it decodes them.
  auto dir = test::temp_dir("cap_hdr");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  auto p = dir + "/bad.h5";
  std::string b = read_bytes(good);
  SUBCASE("an attribute's name size running past its message (SEGV in H5Aexists)") {
    size_t name = b.find(std::string("kvlab_capture_version") + '\0');
    REQUIRE(name != std::string::npos);
    b.replace(name - 6, 2, le_bytes<uint16_t>(0xfff0));  // version-1 message: name size at +2, name at +8
    write_bytes(p, b);
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find("group '/'") != std::string::npos);
    CHECK(e.find("name, datatype and dataspace of 65552 bytes in a 64-byte message") != std::string::npos);
  }
  SUBCASE("a filter name without its NUL (heap over-read under H5Dopen)") {
    size_t name = b.find(std::string("deflate") + '\0');
    REQUIRE(name != std::string::npos);
    b[name + 7] = 'x';
    write_bytes(p, b);
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("dataset '/sample_0000/layer_00/q'") != std::string::npos);
    CHECK(e.find("a name without its terminating NUL") != std::string::npos);
  }
  SUBCASE("a chunked dataset whose filter pipeline became a null message (heap over-read in H5Dread)") {
    auto pipelines = header_messages(good, "/sample_0000/layer_01/k", 0x000b);
    REQUIRE(pipelines.size() == 1);
    b.replace(pipelines[0], 2, le_bytes<uint16_t>(0));
    write_bytes(p, b);
    CaptureReader r(p);  // the dataset is still a well-formed chunked float32 one
    std::string e;
    try {
      (void)r.read_layer(0, 1);
    } catch (const Error& err) {
      e = err.what();
    }
    INFO(e);
    CHECK(e.find("dataset '/sample_0000/layer_01/k'") != std::string::npos);
    CHECK(e.find("holds no Fletcher32 checksum") != std::string::npos);
  }
  SUBCASE("a message of a type no capture holds") {
    auto mtimes = header_messages(good, "/sample_0001/layer_02/v", 0x0012);
    REQUIRE(mtimes.size() == 1);
    b.replace(mtimes[0], 2, le_bytes<uint16_t>(0x0007));  // an external file list
    write_bytes(p, b);
    std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("dataset '/sample_0001/layer_02/v'") != std::string::npos);
    CHECK(e.find("type 0x0007") != std::string::npos);
  }
}

TEST_CASE("corrupted q/k/v bytes are detected by the Fletcher32 checksum, not computed on") {
  auto dir = test::temp_dir("cap_f32");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    H5::H5File f(good, H5F_ACC_RDONLY);
    auto ds = f.openDataSet("/sample_0000/layer_01/v");
    hsize_t offset[3];
    unsigned mask = 0;
    auto space = ds.getSpace();
    REQUIRE(H5Dget_chunk_info(ds.getId(), space.getId(), 1, offset, &mask, &addr, &size) >= 0);  // KV head 1
  }
  auto p = dir + "/bad.h5";
  std::string b = read_bytes(good);
  REQUIRE(addr + size <= b.size());
  b[addr + size / 2] = char(b[addr + size / 2] ^ 0x10);
  write_bytes(p, b);
  CaptureReader r(p);  // metadata is intact
  CHECK_NOTHROW(r.read_kv_head(0, 1, 0));
  std::string e;
  try {
    (void)r.read_layer(0, 1);
  } catch (const Error& err) {
    e = err.what();
  }
  INFO(e);
  CHECK(e.find(p) != std::string::npos);
  CHECK(e.find("'/sample_0000/layer_01/v'") != std::string::npos);
  CHECK(e.find("checksum") != std::string::npos);
}

TEST_CASE("a capture opens from a file image in memory as from disk") {
  auto dir = test::temp_dir("cap_image");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec(), "bfloat16");
  std::string b = read_bytes(good);
  CaptureReader disk(good);
  CaptureReader mem = CaptureReader::from_image(b.data(), b.size(), "image.h5");
  CHECK(mem.path() == "image.h5");
  CHECK(mem.n_samples() == 2);
  CHECK(mem.file_bytes() == int64_t(b.size()));
  CHECK(mem.read_layer(1, 2).v.equal(disk.read_layer(1, 2).v));
  CHECK(capture_summary(mem)["source_dataset"] == "synthetic:clustered:seed=3");
  auto spec = small_spec();
  spec.kind = "random";
  write_synthetic_capture(dir + "/other.h5", spec, "float16");
  std::string b2 = read_bytes(dir + "/other.h5");
  CaptureReader mem2 = CaptureReader::from_image(b2.data(), b2.size(), "image.h5");  // same name, other bytes
  CHECK(mem2.meta().dtype == "float16");
  CHECK(mem.meta().dtype == "bfloat16");
  CHECK_THROWS_WITH_AS(CaptureReader::from_image(b.data(), b.size() / 3, "cut.h5"), doctest::Contains("cut.h5"), Error);
  CHECK_THROWS_WITH_AS(CaptureReader::from_image("hello", 5, "text.h5"), doctest::Contains("text.h5"), Error);
}

// ---- non-finite q/k/v ----

namespace {
// Sets one element of a float32 q/k/v dataset in place.
void poke(const std::string& p, const std::string& name, int64_t head, int64_t row, int64_t dim, float value) {
  H5::H5File f(p, H5F_ACC_RDWR);
  auto ds = f.openDataSet(name);
  hsize_t dims[3];
  ds.getSpace().getSimpleExtentDims(dims);
  std::vector<float> all(dims[0] * dims[1] * dims[2]);
  ds.read(all.data(), H5::PredType::NATIVE_FLOAT);
  all[(head * dims[1] + row) * dims[2] + dim] = value;
  ds.write(all.data(), H5::PredType::NATIVE_FLOAT);
}
std::string check_finite_error(const CaptureReader& r, int64_t s, int l) {
  try {
    check_finite(r, s, l, r.read_layer(s, l));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("non-finite q/k/v: found, counted and named by sample, layer, tensor, head and position") {
  auto dir = test::temp_dir("cap_nan");
  auto spec = small_spec();  // 127 tokens, the last 19 queried (q_start 108), 6 query / 2 KV heads
  auto p = dir + "/c.h5";
  write_synthetic_capture(p, spec);
  {
    CaptureReader r(p);
    CHECK(find_nonfinite(r.read_layer(1, 2), r.sample(1).q_start).count == 0);
    CHECK(check_finite_error(r, 1, 2).empty());
  }
  SUBCASE("NaN in v") {
    poke(p, "/sample_0001/layer_02/v", 1, 17, 4, std::nanf(""));
    CaptureReader r(p);
    NonFinite nf = find_nonfinite(r.read_layer(1, 2), r.sample(1).q_start);
    CHECK(nf.count == 1);
    CHECK(nf.tensor == "v");
    CHECK(nf.head == 1);
    CHECK(nf.position == 17);
    CHECK(nf.dim == 4);
    CHECK(std::isnan(nf.value));
    std::string e = check_finite_error(r, 1, 2);
    INFO(e);
    for (const char* w : {"sample 1", "layer 2", "v", "KV head 1", "position 17", "nan"})
      CHECK(e.find(w) != std::string::npos);
    CHECK(e.find(p) != std::string::npos);
    CHECK(check_finite_error(r, 1, 1).empty());
    CHECK(check_finite_error(r, 0, 2).empty());
  }
  SUBCASE("+Inf in v, and a NaN in q before it") {
    poke(p, "/sample_0000/layer_00/v", 0, 5, 0, INFINITY);
    {
      CaptureReader r(p);
      NonFinite nf = find_nonfinite(r.read_layer(0, 0), r.sample(0).q_start);
      CHECK(nf.count == 1);
      CHECK(nf.tensor == "v");
      CHECK(nf.head == 0);
      CHECK(nf.position == 5);
      CHECK(nf.value == INFINITY);
      std::string e = check_finite_error(r, 0, 0);
      INFO(e);
      for (const char* w : {"sample 0", "layer 0", "v", "KV head 0", "position 5", "inf"})
        CHECK(e.find(w) != std::string::npos);
    }
    poke(p, "/sample_0000/layer_00/q", 4, 2, 7, std::nanf(""));
    CaptureReader r(p);
    NonFinite nf = find_nonfinite(r.read_layer(0, 0), r.sample(0).q_start);
    CHECK(nf.count == 2);
    CHECK(nf.tensor == "q");  // q is looked at first
    CHECK(nf.head == 4);
    CHECK(nf.position == 108 + 2);
    std::string e = check_finite_error(r, 0, 0);
    INFO(e);
    for (const char* w : {"query head 4", "position 110", "2 non-finite"}) CHECK(e.find(w) != std::string::npos);
    auto scan = scan_nonfinite(r);
    CHECK(scan.count == 2);
    CHECK(scan.units == 1);
    CHECK(scan.sample == 0);
    CHECK(scan.layer == 0);
  }
}

TEST_CASE("a group's local heap and a dataset's dimensions are checked before HDF5 follows them (the 10^6 run)") {
  // Two inputs of the 10^6-input fuzzer run (fuzz/README.md): a free list that returns to its own
  // block (HDF5 1.10 follows it forever, allocating: 2.2 GB before libFuzzer stopped it) and a
  // dimension past 2^63 (H5Dopen fails rounding it to a power of two and leaks ~5 KB a try).
  // check_object_header is asked first, so that the code before the check fails here, not hangs.
  auto dir = test::temp_dir("cap_heap");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());
  std::string b = read_bytes(good);
  auto header_error = [&](const std::string& object, bool dataset) {
    H5O_info_t info;
    {
      H5::H5File f(good, H5F_ACC_RDONLY);
      REQUIRE(H5Oget_info_by_name2(f.getId(), object.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0);
    }
    const auto raw = capture_detail::RawBytes::of_image(b.data(), b.size(), 0);
    return capture_detail::check_object_header(raw, info.addr, dataset);
  };
  REQUIRE(header_error("/", false).empty());
  const auto p = dir + "/bad.h5";
  SUBCASE("a free list that loops") {
    const auto tables = header_messages(good, "/", 0x0011);  // symbol table: B-tree, local heap
    REQUIRE(tables.size() == 1);
    const size_t heap = le_at(b, tables[0] + 16, 8);
    REQUIRE(b.compare(heap, 4, "HEAP") == 0);
    const size_t head = le_at(b, heap + 16, 8), data = le_at(b, heap + 24, 8);
    REQUIRE(head != 1);  // the writer's heap has a free block
    b.replace(data + head, 8, le_bytes<uint64_t>(head));  // its next block: itself
    const std::string direct = header_error("/", false);
    INFO(direct);
    REQUIRE(direct.find("free list that loops at offset " + std::to_string(head)) != std::string::npos);
    write_bytes(p, b);
    const std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("group '/'") != std::string::npos);
    CHECK(e.find("that loops") != std::string::npos);
  }
  SUBCASE("a free list past its segment") {
    const auto tables = header_messages(good, "/", 0x0011);
    const size_t heap = le_at(b, tables[0] + 16, 8);
    b.replace(heap + 16, 8, le_bytes<uint64_t>(le_at(b, heap + 8, 8)));  // the head at the segment's end
    CHECK(header_error("/", false).find("free list past its segment") != std::string::npos);
  }
  SUBCASE("a dimension past 2^63") {
    const std::string v = "/sample_0001/layer_00/v";
    const auto spaces = header_messages(good, v, 0x0001);  // version 1: rank at +1, dims at +8
    REQUIRE(spaces.size() == 1);
    REQUIRE(b[spaces[0] + 8] == 1);
    b.replace(spaces[0] + 16, 8, le_bytes<uint64_t>(0x8300000000000002ull));
    const std::string direct = header_error(v, true);
    INFO(direct);
    REQUIRE(direct.find("a dataspace dimension of 9439544818968559618") != std::string::npos);
    write_bytes(p, b);
    const std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("dataset '" + v + "'") != std::string::npos);
  }
  SUBCASE("what H5Dopen2 fails on, leaking 5 KB each: no layout, no filters, a shared message, data past the end") {
    const std::string k = "/sample_0000/layer_01/k";
    const std::string kept = b;
    auto after = [&](uint16_t type, size_t at, const std::string& bytes) {
      b = kept;
      const auto found = header_messages(good, k, type);
      REQUIRE(found.size() == 1);
      b.replace(found[0] + at, bytes.size(), bytes);
      return header_error(k, true);
    };
    CHECK(after(0x0008, 0, le_bytes<uint16_t>(0)).find("no layout message (type 0x0008)") != std::string::npos);
    CHECK(after(0x000b, 9, std::string(1, '\0')).find("0 filters") != std::string::npos);  // version 1, nfilters
    CHECK(after(0x000b, 4, std::string(1, '\x02')).find("shared (kvlab writes none)") != std::string::npos);
    CHECK(after(0x0008, 11, le_bytes<uint64_t>(uint64_t(b.size()) + 4096)).find("a chunk index at") !=
          std::string::npos);  // version 3, class 2, rank, then the chunk index's address
  }
  SUBCASE("a superblock whose end of file is not the file's, refused before HDF5 opens it") {
    write_bytes(p, b + std::string(92, '\0'));
    const std::string e = open_error(p);
    INFO(e);
    CHECK(e.find("a superblock whose end of file is 0 + " + std::to_string(b.size()) + " bytes, in a file of " +
                 std::to_string(b.size() + 92) + " bytes") != std::string::npos);
  }
  SUBCASE("a dimension above its maximum") {
    const std::string v = "/sample_0001/layer_00/v";
    const auto spaces = header_messages(good, v, 0x0001);
    REQUIRE(b[spaces[0] + 10] == 1);  // flags: maximum dimensions present
    b.replace(spaces[0] + 16, 8, le_bytes<uint64_t>(3));  // heads: 3 > its maximum 2
    CHECK(header_error(v, true).find("a dataspace dimension of 3 above its maximum 2") != std::string::npos);
  }
}

TEST_CASE("a capture whose chunks skip the checksum is refused before HDF5 inflates them (found by the 10^6 run)") {
  // crash_masked_checksum.h5: before the check, reading its last layer under ASan was a heap
  // over-read inside HDF5 (H5VM_memcpyvv under H5Dread: a chunk inflated to less than a chunk).
  const std::string p = test::fixtures_dir() + "/fuzz_corpus/fuzz_capture/crash_masked_checksum.h5";
  CaptureReader r(p);
  int refused = 0;
  for (int layer : r.meta().layers) {
    std::string e;
    try {
      (void)r.read_layer(0, layer);
    } catch (const Error& err) {
      e = err.what();
    }
    INFO("layer " << layer << ": " << e);
    CHECK(!e.empty());  // no layer of it reads as numbers
    refused += e.find("holds no Fletcher32 checksum") != std::string::npos ||
               e.find("skips filters") != std::string::npos;
  }
  CHECK(refused == int(r.meta().layers.size()));
}

TEST_CASE("q/k/v in chunks smaller than a writer's are refused before HDF5 reads them (fuzz_short, CI)") {
  // A capture of a few KB can declare millions of unwritten [1, 1, 1] chunks; HDF5 1.10 keeps a
  // record of each chunk a read touches: one 16 MB layer read took 9 s and 0.7 GB under ASan.
  auto dir = test::temp_dir("cap_chunks");
  auto good = dir + "/good.h5";
  write_synthetic_capture(good, small_spec());  // k, v [2, 127, 65] float32: 33,020 bytes a head
  const at::Tensor k = CaptureReader(good).read_layer(1, 2).k;
  auto rechunked = [&](const std::string& name, std::vector<hsize_t> chunk) {
    return edited_copy(good, dir, name, [&](H5::H5File& f) {
      f.unlink("/sample_0001/layer_02/k");
      hsize_t dims[3] = {2, 127, 65};
      H5::DSetCreatPropList pl;
      pl.setChunk(3, chunk.data());
      pl.setShuffle();
      pl.setDeflate(1);
      pl.setFletcher32();
      f.createDataSet("/sample_0001/layer_02/k", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims), pl)
          .write(k.data_ptr(), H5::PredType::NATIVE_FLOAT);
    });
  };
  auto read_error = [](const std::string& p) -> std::string {
    try {
      (void)CaptureReader(p).read_layer(1, 2);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SUBCASE("one value a chunk") {
    const std::string e = read_error(rechunked("tiny", {1, 1, 1}));
    INFO(e);
    CHECK(e.find("'/sample_0001/layer_02/k'") != std::string::npos);
    CHECK(e.find("chunks of shape [1, 1, 1] hold 4 bytes of a head, fewer than 4096") != std::string::npos);
  }
  SUBCASE("one position a chunk") {
    const std::string e = read_error(rechunked("row", {1, 1, 65}));
    INFO(e);
    CHECK(e.find("chunks of shape [1, 1, 65] hold 260 bytes of a head, fewer than 4096") != std::string::npos);
  }
  SUBCASE("both heads in a chunk of 8 positions: 4,160 bytes, 2,080 of each head") {
    // A one-head read would touch as many chunks as [1, 8, 65] ones: the floor is per head.
    const std::string e = read_error(rechunked("two_heads", {2, 8, 65}));
    INFO(e);
    CHECK(e.find("chunks of shape [2, 8, 65] hold 2080 bytes of a head, fewer than 4096") != std::string::npos);
  }
  SUBCASE("16 positions a chunk (4,160 bytes), not the writer's shape: read as written") {
    const auto p = rechunked("sixteen", {1, 16, 65});
    CHECK(read_error(p).empty());
    CHECK(at::equal(CaptureReader(p).read_layer(1, 2).k, k));
  }
}
