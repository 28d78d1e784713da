#include "kvlab/io/capture.h"

#include <H5Cpp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"

namespace kvlab {
namespace {

// ---- storage dtypes ---------------------------------------------------------------------------
// float16 is IEEE half (h5py reads it as numpy float16); bfloat16 is stored as a 16-bit HDF5 float
// with bfloat16's layout (sign 15, exponent 7..14, mantissa 0..6, bias 127), which h5py reads
// through HDF5's float conversion (see docs/capture-format.md).
H5::FloatType half_type() {
  H5::FloatType t(H5::PredType::IEEE_F32LE);
  t.setFields(15, 10, 5, 0, 10);
  t.setSize(2);
  t.setEbias(15);
  return t;
}

H5::FloatType bf16_type() {
  H5::FloatType t(H5::PredType::IEEE_F32LE);
  t.setFields(15, 7, 8, 0, 7);
  t.setSize(2);
  t.setEbias(127);
  return t;
}

H5::DataType file_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return H5::PredType::IEEE_F32LE;
    case at::kHalf: return half_type();
    case at::kBFloat16: return bf16_type();
    default: KVLAB_FAIL("unsupported capture dtype {}", c10::toString(t));
  }
}

H5::StrType string_type() { return H5::StrType(H5::PredType::C_S1, H5T_VARIABLE); }

void silence_hdf5() {
  static bool done = [] {
    H5::Exception::dontPrint();
    return true;
  }();
  (void)done;
}

// ---- attributes -------------------------------------------------------------------------------
template <class Loc>
void put_str(Loc& loc, const std::string& name, const std::string& value) {
  auto st = string_type();
  auto a = loc.createAttribute(name, st, H5::DataSpace(H5S_SCALAR));
  a.write(st, value);
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

// Readers throw kvlab::Error naming the file and the object.
struct Where {
  const std::string& file;
  std::string object;
};

template <class Loc>
H5::Attribute open_attr(const Loc& loc, const std::string& name, const Where& w) {
  KVLAB_CHECK(loc.attrExists(name), "capture '{}': {} has no attribute '{}' (not a kvlab capture, or "
              "written by an incompatible version; re-run 'kvlab dump')", w.file, w.object, name);
  return loc.openAttribute(name);
}
template <class Loc>
std::string get_str(const Loc& loc, const std::string& name, const Where& w) {
  auto a = open_attr(loc, name, w);
  KVLAB_CHECK(a.getTypeClass() == H5T_STRING, "capture '{}': attribute {}/{}: expected a string",
              w.file, w.object, name);
  std::string s;
  a.read(a.getStrType(), s);
  return s;
}
template <class Loc>
int64_t get_int(const Loc& loc, const std::string& name, const Where& w) {
  auto a = open_attr(loc, name, w);
  KVLAB_CHECK(a.getTypeClass() == H5T_INTEGER && a.getSpace().getSimpleExtentNpoints() == 1,
              "capture '{}': attribute {}/{}: expected an integer", w.file, w.object, name);
  int64_t v = 0;
  a.read(H5::PredType::NATIVE_INT64, &v);
  return v;
}
template <class Loc>
double get_double(const Loc& loc, const std::string& name, const Where& w) {
  auto a = open_attr(loc, name, w);
  KVLAB_CHECK(a.getTypeClass() == H5T_FLOAT || a.getTypeClass() == H5T_INTEGER,
              "capture '{}': attribute {}/{}: expected a number", w.file, w.object, name);
  double v = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &v);
  return v;
}
template <class Loc>
std::vector<int> get_ints(const Loc& loc, const std::string& name, const Where& w) {
  auto a = open_attr(loc, name, w);
  KVLAB_CHECK(a.getTypeClass() == H5T_INTEGER, "capture '{}': attribute {}/{}: expected integers",
              w.file, w.object, name);
  auto n = a.getSpace().getSimpleExtentNpoints();
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (n) a.read(H5::PredType::NATIVE_INT64, v.data());
  return std::vector<int>(v.begin(), v.end());
}

std::string sample_name(int64_t i) { return fmt::format("sample_{:04d}", i); }
std::string layer_name(int l) { return fmt::format("layer_{:02d}", l); }

std::string shape_str(const std::vector<hsize_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace

at::ScalarType parse_storage_dtype(const std::string& name, const std::string& flag) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  KVLAB_FAIL("{}: expected float32, float16 or bfloat16, got '{}'", flag, name);
}

std::string storage_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

// ================================= writer ======================================================

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
    }
    auto ft = file_type(dtype);
    auto ds = g.createDataSet(name, ft, space, plist);
    if (c.numel() > 0) ds.write(c.data_ptr(), ft);
  }
};

CaptureWriter::CaptureWriter(const std::string& path, CaptureMeta meta) : impl_(new Impl) {
  silence_hdf5();
  auto& m = *impl_;
  m.path = path;
  m.partial = path + ".partial";
  m.meta = std::move(meta);
  m.dtype = parse_storage_dtype(m.meta.dtype, "--dtype");
  m.meta.dtype = storage_dtype_name(m.dtype);
  m.meta.kvlab_version = kvlab_version();
  m.meta.git_sha = git_sha();
  KVLAB_CHECK(m.meta.n_layers > 0 && m.meta.n_q_heads > 0 && m.meta.n_kv_heads > 0 &&
                  m.meta.head_dim > 0 && m.meta.n_q_heads % m.meta.n_kv_heads == 0,
              "capture '{}': invalid architecture n_layers={} n_q_heads={} n_kv_heads={} head_dim={}",
              path, m.meta.n_layers, m.meta.n_q_heads, m.meta.n_kv_heads, m.meta.head_dim);
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
    KVLAB_FAIL("capture '{}': cannot create '{}': {}", path, m.partial, e.getDetailMsg());
  }
}

CaptureWriter::~CaptureWriter() {
  if (!impl_ || impl_->finished) return;
  try {
    impl_->sample.reset();
    impl_->file.close();
  } catch (...) {
  }
  std::remove(impl_->partial.c_str());
}

void CaptureWriter::begin_sample(const std::string& sample_id, const at::Tensor& tokens, int64_t n_q) {
  auto& m = *impl_;
  KVLAB_CHECK(!m.sample, "capture '{}': begin_sample while sample {} is still open", m.path, m.n_samples);
  KVLAB_CHECK(tokens.dim() == 1, "capture: tokens must be [n_tokens], got {} dims", tokens.dim());
  const int64_t n = tokens.size(0);
  KVLAB_CHECK(n_q >= 1 && n_q <= n, "capture: n_q must be in [1, n_tokens={}], got {}", n, n_q);
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
    KVLAB_FAIL("capture '{}': writing sample {}: {}", m.path, m.n_samples, e.getDetailMsg());
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
    KVLAB_FAIL("capture '{}': writing layer {}: {}", m.path, layer, e.getDetailMsg());
  }
  m.written.insert(layer);
}

void CaptureWriter::end_sample() {
  auto& m = *impl_;
  KVLAB_CHECK(m.sample.has_value(), "capture '{}': end_sample without begin_sample", m.path);
  KVLAB_CHECK(m.written.size() == m.meta.layers.size(),
              "capture '{}': sample {} has {} of {} layers written", m.path, m.n_samples,
              m.written.size(), m.meta.layers.size());
  m.sample.reset();
  ++m.n_samples;
  m.file.flush(H5F_SCOPE_GLOBAL);
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
    KVLAB_FAIL("capture '{}': finishing: {}", m.path, e.getDetailMsg());
  }
  std::error_code ec;
  std::filesystem::rename(m.partial, m.path, ec);
  KVLAB_CHECK(!ec, "capture: cannot rename '{}' to '{}': {}", m.partial, m.path, ec.message());
  m.finished = true;
}

// ================================= reader ======================================================

struct CaptureReader::Impl {
  std::string path;
  H5::H5File file;
  CaptureMeta meta;
  std::vector<SampleInfo> samples;
  at::ScalarType dtype = at::kFloat;

  // Opens a dataset and checks it is a float of the capture's dtype with the expected shape.
  H5::DataSet open_checked(const std::string& name, const std::vector<hsize_t>& expected) const {
    KVLAB_CHECK(file.nameExists(name), "capture '{}': dataset '{}' is missing (truncated dump?)",
                path, name);
    auto ds = file.openDataSet(name);
    auto space = ds.getSpace();
    int rank = space.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
    if (rank > 0) space.getSimpleExtentDims(dims.data());
    KVLAB_CHECK(dims == expected, "capture '{}': dataset '{}': expected shape {}, found {}", path, name,
                shape_str(expected), shape_str(dims));
    if (name.size() > 7 && name.substr(name.size() - 7) == "/tokens") {
      KVLAB_CHECK(ds.getTypeClass() == H5T_INTEGER, "capture '{}': dataset '{}': expected integer "
                  "token ids, found another type", path, name);
    } else {
      bool ok = ds.getTypeClass() == H5T_FLOAT &&
                ds.getDataType().getSize() == static_cast<size_t>(c10::elementSize(dtype));
      KVLAB_CHECK(ok, "capture '{}': dataset '{}': expected {} (from the file's dtype attribute), "
                  "found a {}-byte {}", path, name, meta.dtype, ds.getDataType().getSize(),
                  ds.getTypeClass() == H5T_FLOAT ? "float" : "non-float");
    }
    return ds;
  }

  // Reads [h0, h0+nh) heads of a [heads, n, d] dataset into a float tensor.
  at::Tensor read_heads(const std::string& name, const std::vector<hsize_t>& dims, int64_t h0,
                        int64_t nh, at::ScalarType as) const {
    auto ds = open_checked(name, dims);
    auto out = at::empty({nh, int64_t(dims[1]), int64_t(dims[2])}, at::TensorOptions().dtype(dtype));
    if (out.numel() == 0) return out.to(as);
    hsize_t offset[3] = {hsize_t(h0), 0, 0}, count[3] = {hsize_t(nh), dims[1], dims[2]};
    auto fspace = ds.getSpace();
    fspace.selectHyperslab(H5S_SELECT_SET, count, offset);
    H5::DataSpace mspace(3, count);
    try {
      ds.read(out.data_ptr(), file_type(dtype), mspace, fspace);
    } catch (const H5::Exception& e) {
      KVLAB_FAIL("capture '{}': reading '{}' failed (corrupt or truncated file?): {}", path, name,
                 e.getDetailMsg());
    }
    return out.to(as);
  }
};

CaptureReader::CaptureReader(const std::string& path) : impl_(new Impl) {
  silence_hdf5();
  auto& m = *impl_;
  m.path = path;
  KVLAB_CHECK(std::filesystem::exists(path), "capture '{}': no such file", path);
  try {
    KVLAB_CHECK(H5::H5File::isHdf5(path), "capture '{}': not an HDF5 file (corrupt, truncated, or "
                "not a capture)", path);
    m.file = H5::H5File(path, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': cannot open as HDF5 (corrupt or truncated file?): {}", path,
               e.getDetailMsg());
  }
  try {
    Where root{path, "/"};
    auto& f = m.file;
    int64_t version = get_int(f, "kvlab_capture_version", root);
    KVLAB_CHECK(version == kCaptureVersion, "capture '{}': capture version {} unsupported (expected {}); "
                "re-run 'kvlab dump'", path, version, kCaptureVersion);
    KVLAB_CHECK(f.attrExists("complete") && get_int(f, "complete", root) == 1,
                "capture '{}': the writer did not finish (no 'complete' mark); re-run 'kvlab dump'", path);
    auto& md = m.meta;
    md.model_id = get_str(f, "model_id", root);
    md.architecture = get_str(f, "architecture", root);
    md.n_layers = static_cast<int>(get_int(f, "n_layers", root));
    md.n_q_heads = static_cast<int>(get_int(f, "n_q_heads", root));
    md.n_kv_heads = static_cast<int>(get_int(f, "n_kv_heads", root));
    md.head_dim = static_cast<int>(get_int(f, "head_dim", root));
    md.rope_theta = get_double(f, "rope_theta", root);
    md.rope_scaling = nlohmann::json::parse(get_str(f, "rope_scaling", root), nullptr, false);
    md.dtype = get_str(f, "dtype", root);
    md.layers = get_ints(f, "layers", root);
    md.queries = get_str(f, "queries", root);
    md.source_dataset = get_str(f, "source_dataset", root);
    md.kvlab_version = get_str(f, "kvlab_version", root);
    md.git_sha = get_str(f, "git_sha", root);
    KVLAB_CHECK(md.n_layers > 0 && md.n_q_heads > 0 && md.n_kv_heads > 0 && md.head_dim > 0 &&
                    md.n_q_heads % md.n_kv_heads == 0,
                "capture '{}': invalid architecture attributes n_layers={} n_q_heads={} n_kv_heads={} "
                "head_dim={}", path, md.n_layers, md.n_q_heads, md.n_kv_heads, md.head_dim);
    m.dtype = parse_storage_dtype(md.dtype, fmt::format("capture '{}': attribute dtype", path));
    for (int l : md.layers)
      KVLAB_CHECK(l >= 0 && l < md.n_layers, "capture '{}': captured layer {} outside 0..{}", path, l,
                  md.n_layers - 1);
    int64_t n_samples = get_int(f, "n_samples", root);
    KVLAB_CHECK(n_samples > 0 && n_samples < (1 << 24), "capture '{}': n_samples={} is invalid", path,
                n_samples);
    for (int64_t s = 0; s < n_samples; ++s) {
      std::string sg = "/" + sample_name(s);
      KVLAB_CHECK(f.nameExists(sg), "capture '{}': group '{}' is missing ({} samples expected)", path,
                  sg, n_samples);
      auto g = f.openGroup(sg);
      Where w{path, sg};
      SampleInfo info;
      info.sample_id = get_str(g, "sample_id", w);
      info.n_tokens = get_int(g, "n_tokens", w);
      info.n_q = get_int(g, "n_q", w);
      info.q_start = get_int(g, "q_start", w);
      KVLAB_CHECK(info.n_tokens > 0 && info.n_q > 0 && info.n_q <= info.n_tokens &&
                      info.q_start == info.n_tokens - info.n_q,
                  "capture '{}': {}: inconsistent n_tokens={} n_q={} q_start={}", path, sg,
                  info.n_tokens, info.n_q, info.q_start);
      m.open_checked(sg + "/tokens", {hsize_t(info.n_tokens)});
      for (int l : md.layers) {
        std::string lg = sg + "/" + layer_name(l);
        m.open_checked(lg + "/q", {hsize_t(md.n_q_heads), hsize_t(info.n_q), hsize_t(md.head_dim)});
        m.open_checked(lg + "/k", {hsize_t(md.n_kv_heads), hsize_t(info.n_tokens), hsize_t(md.head_dim)});
        m.open_checked(lg + "/v", {hsize_t(md.n_kv_heads), hsize_t(info.n_tokens), hsize_t(md.head_dim)});
      }
      m.samples.push_back(info);
    }
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': corrupt file: {}", path, e.getDetailMsg());
  }
}

CaptureReader::~CaptureReader() = default;
CaptureReader::CaptureReader(CaptureReader&&) noexcept = default;

const CaptureMeta& CaptureReader::meta() const { return impl_->meta; }
const std::string& CaptureReader::path() const { return impl_->path; }
int64_t CaptureReader::n_samples() const { return static_cast<int64_t>(impl_->samples.size()); }

const SampleInfo& CaptureReader::sample(int64_t i) const {
  KVLAB_CHECK(i >= 0 && i < n_samples(), "--samples: sample {} out of range: the capture has {}", i,
              n_samples());
  return impl_->samples[static_cast<size_t>(i)];
}

at::Tensor CaptureReader::tokens(int64_t s) const {
  const auto& info = sample(s);
  std::string name = "/" + sample_name(s) + "/tokens";
  auto ds = impl_->open_checked(name, {hsize_t(info.n_tokens)});
  auto out = at::empty({info.n_tokens}, at::kInt);
  try {
    ds.read(out.data_ptr<int32_t>(), H5::PredType::NATIVE_INT32);
  } catch (const H5::Exception& e) {
    KVLAB_FAIL("capture '{}': reading '{}' failed: {}", impl_->path, name, e.getDetailMsg());
  }
  return out.to(at::kLong);
}

LayerQKV CaptureReader::read_layer(int64_t s, int layer, at::ScalarType as) const {
  const auto& info = sample(s);
  const auto& md = impl_->meta;
  KVLAB_CHECK(std::find(md.layers.begin(), md.layers.end(), layer) != md.layers.end(),
              "--layers: layer {} was not captured in '{}' (captured: {})", layer, impl_->path,
              fmt::join(md.layers, ","));
  std::string lg = "/" + sample_name(s) + "/" + layer_name(layer);
  std::vector<hsize_t> qd = {hsize_t(md.n_q_heads), hsize_t(info.n_q), hsize_t(md.head_dim)};
  std::vector<hsize_t> kd = {hsize_t(md.n_kv_heads), hsize_t(info.n_tokens), hsize_t(md.head_dim)};
  return {impl_->read_heads(lg + "/q", qd, 0, md.n_q_heads, as),
          impl_->read_heads(lg + "/k", kd, 0, md.n_kv_heads, as),
          impl_->read_heads(lg + "/v", kd, 0, md.n_kv_heads, as)};
}

LayerQKV CaptureReader::read_kv_head(int64_t s, int layer, int kv_head, at::ScalarType as) const {
  const auto& info = sample(s);
  const auto& md = impl_->meta;
  KVLAB_CHECK(kv_head >= 0 && kv_head < md.n_kv_heads, "--heads: KV head {} out of range 0..{}", kv_head,
              md.n_kv_heads - 1);
  KVLAB_CHECK(std::find(md.layers.begin(), md.layers.end(), layer) != md.layers.end(),
              "--layers: layer {} was not captured in '{}'", layer, impl_->path);
  const int g = md.n_q_heads / md.n_kv_heads;
  std::string lg = "/" + sample_name(s) + "/" + layer_name(layer);
  std::vector<hsize_t> qd = {hsize_t(md.n_q_heads), hsize_t(info.n_q), hsize_t(md.head_dim)};
  std::vector<hsize_t> kd = {hsize_t(md.n_kv_heads), hsize_t(info.n_tokens), hsize_t(md.head_dim)};
  return {impl_->read_heads(lg + "/q", qd, int64_t(kv_head) * g, g, as),
          impl_->read_heads(lg + "/k", kd, kv_head, 1, as),
          impl_->read_heads(lg + "/v", kd, kv_head, 1, as)};
}

int64_t CaptureReader::file_bytes() const {
  return static_cast<int64_t>(std::filesystem::file_size(impl_->path));
}

int64_t CaptureReader::raw_bytes() const {
  const auto& md = impl_->meta;
  int64_t elems = 0;
  for (const auto& s : impl_->samples)
    elems += int64_t(md.layers.size()) * md.head_dim * (md.n_q_heads * s.n_q + 2 * md.n_kv_heads * s.n_tokens);
  return elems * static_cast<int64_t>(c10::elementSize(impl_->dtype));
}

}  // namespace kvlab
