// A method with a new kind of input, added from its own file: this file, the context input it
// provides and one add_compressor call are all it takes (issue 49: nothing else in the library
// changes). Its own binary, so the library's every-method tests keep seeing kvlab's list alone.
//
// "importance" keeps, per KV head, the positions of highest score in an input no kvlab method
// reads: "test_importance" [n_kv_heads, n] float64, given by whoever compresses.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "kvlab/cache/compressed_cache.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

constexpr const char* kImportance = "test_importance";  // [n_kv_heads, n] float64

class Importance : public Compressor {
 public:
  explicit Importance(const nlohmann::json& params) {
    Params p(params, "importance");
    p.finish();
    params_ = p.effective();
  }
  std::string name() const override { return "importance"; }
  nlohmann::json params() const override { return params_; }
  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const at::Tensor& s = kv.context.get(kImportance);  // [Hkv, n] on the region
    KVLAB_CHECK(s.dim() == 2 && s.size(0) == kv.n_kv_heads() && s.size(1) == kv.n_tokens(),
                "importance: scores must be [{}, {}], got {}", kv.n_kv_heads(), kv.n_tokens(), s.sizes());
    const int64_t b = std::min(resolve_budget(opt, kv.n_tokens()), kv.n_tokens());
    at::Tensor idx = std::get<0>(std::get<1>(s.topk(b, 1)).sort(1));  // [Hkv, b]
    return gather_kept(kv, idx);
  }

 private:
  nlohmann::json params_;
};

CompressorInfo method_importance() {
  CompressorInfo m;
  m.name = "importance";
  m.description = "test-only: the positions of highest score in the context input test_importance";
  m.make = [](const nlohmann::json& p) -> std::unique_ptr<Compressor> { return std::make_unique<Importance>(p); };
  m.paper = [] { return MethodPreset{nlohmann::json::object(), 0, 0, "test-only", "", ""}; };
  m.cost = {1.0, "a top-k", "test-only"};
  m.inputs = {kImportance};
  return m;
}

// The naive rule: per head, the b region positions of highest score, ascending.
std::vector<int64_t> naive_top(const at::Tensor& scores, int64_t h, int64_t begin, int64_t end, int64_t b) {
  std::vector<int64_t> pos(end - begin);
  std::iota(pos.begin(), pos.end(), begin);
  auto s = scores.accessor<double, 2>();
  std::stable_sort(pos.begin(), pos.end(), [&](int64_t x, int64_t y) { return s[h][x] > s[h][y]; });
  pos.resize(b);
  std::sort(pos.begin(), pos.end());
  return pos;
}

}  // namespace

TEST_CASE("a method reading a new context input, added from its own file, compresses through the cache path") {
  add_compressor(method_importance());
  CHECK(compressor_info("importance").reads(kImportance));
  CHECK_FALSE(compressor_info("importance").needs_model());
  CHECK_THROWS_WITH_AS(add_compressor(method_importance()), doctest::Contains("exists"), Error);

  const int64_t h_kv = 2, n = 40, d = 8, keep_first = 3, keep_last = 5, b = 12;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor k = at::randn({h_kv, n, d}, gen, f64), v = at::randn({h_kv, n, d}, gen, f64);
  at::Tensor scores = at::rand({h_kv, n}, gen, f64);  // over the whole layer

  int made = 0;
  Context context;  // the whole layer's inputs, as generation gives them
  context.provide(kImportance, [&] { ++made; return scores; }, /*position_dim=*/1);

  auto c = make_compressor("importance", nlohmann::json::object());
  CompressOptions opt;
  opt.budget = Budget::of_entries(b);
  CompressedLayer out = compress_layer(*c, opt, k, v, at::Tensor(), keep_first, keep_last, 0, 1, nullptr, false,
                                       false, context);
  CHECK(made == 1);
  // The method saw the input narrowed to the region [keep_first, n - keep_last), as the keys.
  for (int64_t h = 0; h < h_kv; ++h) {
    std::vector<int64_t> want(keep_first);
    std::iota(want.begin(), want.end(), 0);
    for (int64_t p : naive_top(scores, h, keep_first, n - keep_last, b)) want.push_back(p);
    for (int64_t p = n - keep_last; p < n; ++p) want.push_back(p);
    at::Tensor o = out.origin[h].contiguous();
    CHECK(std::vector<int64_t>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel()) == want);
  }

  // Made on demand only: a method that does not read it never makes it.
  made = 0;
  Context fresh;
  fresh.provide(kImportance, [&] { ++made; return scores; }, 1);
  compress_layer(*make_compressor("knorm", nlohmann::json::object()), opt, k, v, at::Tensor(), keep_first,
                 keep_last, 0, 1, nullptr, false, false, fresh);
  CHECK(made == 0);

  // A command that does not give it: the error names the input.
  CHECK_THROWS_WITH_AS(compress_layer(*c, opt, k, v, at::Tensor(), keep_first, keep_last, 0, 1),
                       doctest::Contains("test_importance"), Error);
}

}  // namespace kvlab
