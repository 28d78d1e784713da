// CaptureWriter: streams a capture to "<path>.partial" and renames it into place when complete
// (the reader is capture_reader.cpp; the format is docs/capture-format.md).
#include "kvlab/io/capture.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"
#include "kvlab/io/capture_hdf5.h"

namespace kvlab {
namespace {
using namespace capture_detail;

// "<what HDF5's C++ API says>: <the innermost HDF5 messages>", on one line.
std::string h5_message(const H5::Exception& e) {
  std::string inner = take_hdf5_error();
  return inner.empty() ? e.getDetailMsg() : e.getDetailMsg() + ": " + inner;
}

// fsync of a file or a directory; a failure (a full disk that the close did not report) is an error.
void sync_file(const std::string& p, const std::string& capture) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  KVLAB_CHECK(rc == 0 || err == EINVAL, "capture '{}': fsync of '{}' failed: {}", capture, p, std::strerror(err));
}

// ---- attributes -------------------------------------------------------------------------------
// Strings are fixed-length (see capture.h: version 2), so no reader ever visits the global heap.
// What the reader accepts in a string attribute (checked before anything is written).
void check_string(const std::string& path, const std::string& name, const std::string& value) {
  KVLAB_CHECK(is_utf8(value), "capture '{}': {} is not valid UTF-8: '{}'", path, name, value);
  KVLAB_CHECK(int64_t(value.size()) <= CaptureLimits::max_string_bytes,
              "capture '{}': {} has {} bytes, more than the {} a capture allows", path, name, value.size(),
              CaptureLimits::max_string_bytes);
}
template <class Loc>
void put_str(Loc& loc, const std::string& name, const std::string& value) {
  auto st = fixed_string_type(value.size());
  std::string padded = value;
  padded.resize(st.getSize(), '\0');
  auto a = loc.createAttribute(name, st, H5::DataSpace(H5S_SCALAR));
  a.write(st, padded.data());
}
template <class Loc>
void put_int(Loc& loc, const std::string& name, int64_t value) {
  auto a = loc.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_INT64, &value);
}
template <class Loc>
void put_double(Loc& loc, const std::string& name, double value) {
  auto a = loc.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_DOUBLE, &value);
}
template <class Loc>
void put_ints(Loc& loc, const std::string& name, const std::vector<int>& values) {
  std::vector<int64_t> v(values.begin(), values.end());
  hsize_t n = v.size();
  auto a = loc.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(1, &n));
  if (n) a.write(H5::PredType::NATIVE_INT64, v.data());
}

}  // namespace

struct CaptureWriter::Impl {
  std::string path, partial;
  CaptureMeta meta;
  at::ScalarType dtype;
  H5::H5File file;
  std::optional<H5::Group> sample;
  SampleInfo info;
  std::set<int> written;
  int64_t n_samples = 0;
  bool finished = false;

  void write_tensor(H5::Group& g, const std::string& name, const at::Tensor& t) {
    // t [heads, n, head_dim]; chunked per head so one head reads without the rest.
    auto c = t.detach().to(at::kCPU).to(dtype).contiguous();
    std::vector<hsize_t> dims = {hsize_t(c.size(0)), hsize_t(c.size(1)), hsize_t(c.size(2))};
    H5::DataSpace space(3, dims.data());
    H5::DSetCreatPropList plist;
    if (c.numel() > 0) {
      std::vector<hsize_t> chunk = {1, std::min<hsize_t>(dims[1], 4096), std::max<hsize_t>(dims[2], 1)};
      plist.setChunk(3, chunk.data());
      plist.setShuffle();
      plist.setDeflate(1);
      plist.setFletcher32();  // last: checked first on read, before the bytes reach inflate
    }
    auto ft = float_file_type(dtype);
    auto ds = g.createDataSet(name, ft, space, plist);
    if (c.numel() > 0) ds.write(c.data_ptr(), ft);
    ds.close();  // chunks reach the disk here: a full disk throws now, in write_layer's catch
  }
};

CaptureWriter::CaptureWriter(const std::string& path, CaptureMeta meta) : impl_(new Impl) {
  init_hdf5();
  auto& m = *impl_;
  m.path = path;
  m.partial = path + ".partial";
  m.meta = std::move(meta);
  m.dtype = parse_storage_dtype(m.meta.dtype, "--dtype");
  m.meta.dtype = storage_dtype_name(m.dtype);
  m.meta.kvlab_version = kvlab_version();
  m.meta.git_sha = git_sha();
  using L = CaptureLimits;
  const auto& a = m.meta;
  KVLAB_CHECK(a.n_layers > 0 && a.n_layers <= L::max_layers && a.n_q_heads > 0 && a.n_q_heads <= L::max_heads &&
                  a.n_kv_heads > 0 && a.n_kv_heads <= L::max_heads && a.head_dim > 0 &&
                  a.head_dim <= L::max_head_dim && a.n_q_heads % a.n_kv_heads == 0,
              "capture '{}': invalid architecture n_layers={} n_q_heads={} n_kv_heads={} head_dim={} (at most "
              "{} layers, {} heads, head_dim {}; n_q_heads a multiple of n_kv_heads)", path, a.n_layers,
              a.n_q_heads, a.n_kv_heads, a.head_dim, L::max_layers, L::max_heads, L::max_head_dim);
  KVLAB_CHECK(std::isfinite(a.rope_theta) && a.rope_theta > 0, "capture '{}': rope_theta must be positive, got {}",
              path, a.rope_theta);
  for (const auto& [name, value] : {std::pair<const char*, std::string>{"model_id", a.model_id},
                                    {"architecture", a.architecture}, {"rope_scaling", a.rope_scaling.dump()},
                                    {"queries", a.queries}, {"source_dataset", a.source_dataset},
                                    {"kvlab_version", a.kvlab_version}, {"git_sha", a.git_sha}})
    check_string(path, name, value);
  if (m.meta.layers.empty())
    for (int l = 0; l < m.meta.n_layers; ++l) m.meta.layers.push_back(l);
  std::sort(m.meta.layers.begin(), m.meta.layers.end());
  for (int l : m.meta.layers)
    KVLAB_CHECK(l >= 0 && l < m.meta.n_layers, "--layers: layer {} out of range: the model has {} layers",
                l, m.meta.n_layers);
  namespace fs = std::filesystem;
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  try {
    m.file = H5::H5File(m.partial, H5F_ACC_TRUNC);
    const auto& md = m.meta;
    put_int(m.file, "kvlab_capture_version", kCaptureVersion);
    put_str(m.file, "model_id", md.model_id);
    put_str(m.file, "architecture", md.architecture);
    put_int(m.file, "n_layers", md.n_layers);
    put_int(m.file, "n_q_heads", md.n_q_heads);
    put_int(m.file, "n_kv_heads", md.n_kv_heads);
    put_int(m.file, "head_dim", md.head_dim);
    put_double(m.file, "rope_theta", md.rope_theta);
    put_str(m.file, "rope_scaling", md.rope_scaling.dump());
    put_str(m.file, "dtype", md.dtype);
    put_ints(m.file, "layers", md.layers);
    put_str(m.file, "queries", md.queries);
    put_str(m.file, "source_dataset", md.source_dataset);
    put_str(m.file, "kvlab_version", md.kvlab_version);
    put_str(m.file, "git_sha", md.git_sha);
    put_int(m.file, "rope_applied", 1);
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': cannot create '{}': {}", path, m.partial, h5_message(e));
  }
}

CaptureWriter::~CaptureWriter() {
  if (!impl_ || impl_->finished) return;
  const std::string partial = impl_->partial;
  try {
    impl_->sample.reset();
    impl_->file.close();
  } catch (...) {
    // HDF5 1.10 keeps the id of a file whose close failed (a full disk), and closing it again from
    // H5File's destructor crashes inside H5F__close: the handles are left to the process's exit.
    impl_.release();
  }
  std::remove(partial.c_str());
}

void CaptureWriter::begin_sample(const std::string& sample_id, const at::Tensor& tokens, int64_t n_q) {
  auto& m = *impl_;
  KVLAB_CHECK(!m.sample, "capture '{}': begin_sample while sample {} is still open", m.path, m.n_samples);
  KVLAB_CHECK(tokens.dim() == 1, "capture: tokens must be [n_tokens], got {} dims", tokens.dim());
  const int64_t n = tokens.size(0);
  KVLAB_CHECK(n_q >= 1 && n_q <= n, "capture: n_q must be in [1, n_tokens={}], got {}", n, n_q);
  KVLAB_CHECK(n <= CaptureLimits::max_tokens, "capture '{}': sample {} has {} tokens, more than the {} a "
              "capture allows", m.path, m.n_samples, n, CaptureLimits::max_tokens);
  check_string(m.path, "sample_id", sample_id);
  m.info = SampleInfo{sample_id, n, n_q, n - n_q};
  m.written.clear();
  try {
    m.sample = m.file.createGroup(sample_name(m.n_samples));
    put_str(*m.sample, "sample_id", sample_id);
    put_int(*m.sample, "n_tokens", n);
    put_int(*m.sample, "n_q", n_q);
    put_int(*m.sample, "q_start", n - n_q);
    auto t = tokens.to(at::kCPU).to(at::kInt).contiguous();
    hsize_t dims[1] = {hsize_t(n)};
    auto ds = m.sample->createDataSet("tokens", H5::PredType::STD_I32LE, H5::DataSpace(1, dims));
    ds.write(t.data_ptr<int32_t>(), H5::PredType::NATIVE_INT32);
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': writing sample {}: {}", m.path, m.n_samples, h5_message(e));
  }
}

void CaptureWriter::write_layer(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto& m = *impl_;
  KVLAB_CHECK(m.sample.has_value(), "capture '{}': write_layer outside a sample", m.path);
  KVLAB_CHECK(std::binary_search(m.meta.layers.begin(), m.meta.layers.end(), layer),
              "capture '{}': layer {} is not among the captured layers", m.path, layer);
  KVLAB_CHECK(!m.written.count(layer), "capture '{}': layer {} written twice", m.path, layer);
  const auto& md = m.meta;
  const int64_t n = m.info.n_tokens;
  auto expect = [&](const at::Tensor& t, const char* name, int64_t heads, int64_t len) {
    bool ok = t.dim() == 3 && t.size(0) == heads && t.size(1) == len && t.size(2) == md.head_dim;
    KVLAB_CHECK(ok, "capture '{}': layer {} {}: expected [{}, {}, {}], got {}", m.path, layer, name,
                heads, len, md.head_dim, t.sizes());
  };
  KVLAB_CHECK(q.dim() == 3 && (q.size(1) == n || q.size(1) == m.info.n_q),
              "capture '{}': layer {} q: expected [{}, {} or {}, {}], got {}", m.path, layer,
              md.n_q_heads, n, m.info.n_q, md.head_dim, q.sizes());
  auto q_tail = q.size(1) == n ? q.narrow(1, n - m.info.n_q, m.info.n_q) : q;
  expect(q_tail, "q", md.n_q_heads, m.info.n_q);
  expect(k, "k", md.n_kv_heads, n);
  expect(v, "v", md.n_kv_heads, n);
  try {
    auto g = m.sample->createGroup(layer_name(layer));
    m.write_tensor(g, "q", q_tail);
    m.write_tensor(g, "k", k);
    m.write_tensor(g, "v", v);
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': writing layer {}: {}", m.path, layer, h5_message(e));
  }
  m.written.insert(layer);
}

void CaptureWriter::end_sample() {
  auto& m = *impl_;
  KVLAB_CHECK(m.sample.has_value(), "capture '{}': end_sample without begin_sample", m.path);
  KVLAB_CHECK(m.written.size() == m.meta.layers.size(),
              "capture '{}': sample {} has {} of {} layers written", m.path, m.n_samples,
              m.written.size(), m.meta.layers.size());
  try {
    m.sample.reset();
    m.file.flush(H5F_SCOPE_GLOBAL);  // a write error here is one kvlab::Error, not std::terminate
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': writing sample {}: {}", m.path, m.n_samples, h5_message(e));
  }
  ++m.n_samples;
}

void CaptureWriter::finish() {
  auto& m = *impl_;
  KVLAB_CHECK(!m.sample, "capture '{}': finish() while a sample is open", m.path);
  KVLAB_CHECK(m.n_samples > 0, "capture '{}': no samples were written", m.path);
  try {
    put_int(m.file, "n_samples", m.n_samples);
    put_int(m.file, "complete", 1);
    m.file.close();
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': finishing: {}", m.path, h5_message(e));
  }
  // On disk before the rename, so that the name never points at a capture a crash could lose.
  sync_file(m.partial, m.path);
  std::error_code ec;
  std::filesystem::rename(m.partial, m.path, ec);
  KVLAB_CHECK(!ec, "capture: cannot rename '{}' to '{}': {}", m.partial, m.path, ec.message());
  m.finished = true;
  const std::filesystem::path dir = std::filesystem::path(m.path).parent_path();
  sync_file(dir.empty() ? "." : dir.string(), m.path);
}

}  // namespace kvlab
