// The capture format: round trips, per-head reads, and one clear error per kind of bad file.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

#include "kvlab/core/check.h"
#include "kvlab/io/capture.h"
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

#include <H5Cpp.h>

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
    CHECK_THROWS_WITH_AS(CaptureReader{p}, doctest::Contains("capture version 0 unsupported (expected 1)"), Error);
  }
}
