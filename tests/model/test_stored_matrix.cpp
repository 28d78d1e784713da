// Weights as stored (issue 51): stored_linear's per-block kernels against dequantize-then-multiply,
// on random blocks of every type it takes and on real GGUF matrices where a model is at hand.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/io/gguf.h"
#include "kvlab/io/gguf_dequant.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/model/model.h"
#include "kvlab/model/stored_matrix.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-30, b.abs().max().item<double>());
}

// fp16 bits of a float in [2^-14, 2) (normal, no rounding concerns for the test's purpose).
uint16_t half_bits(float f) { return at::Half(f).x; }

// Where each type keeps its fp16 scales (byte offsets in a block): random bytes there could be
// inf/NaN, so they are set to small normal values; every other byte stays random.
std::vector<int> scale_offsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

// A rows x cols matrix of type t with random blocks (its bytes as a GGUF tensor would hold them).
StoredMatrix random_stored(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  const bool plain = t == GgmlType::F16 || t == GgmlType::BF16;
  const int64_t be = plain ? 1 : gguf_detail::block_elems(t), bb = plain ? 2 : gguf_detail::block_bytes(t);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols / be * bb));
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), value(-1.f, 1.f);
  if (plain) {
    for (size_t i = 0; i < bytes.size(); i += 2) {
      const float v = value(gen);
      uint16_t h = half_bits(v);
      if (t == GgmlType::BF16) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        h = static_cast<uint16_t>(bits >> 16);
      }
      std::memcpy(bytes.data() + i, &h, 2);
    }
  } else {
    for (auto& b : bytes) b = static_cast<uint8_t>(byte(gen));
    for (size_t blk = 0; blk < bytes.size(); blk += static_cast<size_t>(bb))
      for (int off : scale_offsets(t)) {
        const uint16_t h = half_bits(scale(gen));
        std::memcpy(bytes.data() + blk + off, &h, 2);
      }
  }
  GgufTensorInfo info;
  info.name = "random";
  info.type = t;
  info.shape = {rows, cols};
  info.ne = {cols, rows};
  info.numel = rows * cols;
  info.nbytes = bytes.size();
  info.data = bytes.data();
  StoredMatrix m = stored_matrix(info);
  // The reference decoder is gguf_dequantize's, the one the fp32 path loads with.
  CHECK(m.dequantize().equal(gguf_dequantize(info).view({rows, cols})));
  return m;
}

}  // namespace

TEST_CASE("stored_linear equals dequantize-then-multiply for every type it takes (random blocks)") {
  const std::vector<GgmlType> types = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                       GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                       GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16,  GgmlType::BF16};
  const int saved = at::get_num_threads();
  at::manual_seed(11);
  uint32_t seed = 1;
  for (GgmlType t : types)
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      const int64_t cols = 512, rows = 37;  // 2 K-blocks or 16 small blocks; rows off every split
      const StoredMatrix w = random_stored(t, rows, cols, seed++);
      REQUIRE(stored_applies(t, cols));
      for (int64_t B : {1, 2, 5, 64}) {
        CAPTURE(ggml_type_name(t));
        CAPTURE(threads);
        CAPTURE(B);
        const at::Tensor x = at::randn({B, cols});  // [B, cols]
        const at::Tensor want = at::mm(x.to(at::kDouble), w.dequantize().to(at::kDouble).t());  // [B, rows]
        CHECK(rel_diff(stored_linear(x, w).to(at::kDouble), want) < 2e-6);
        CHECK(rel_diff(stored_linear_reference(x, w).to(at::kDouble), want) < 2e-6);
      }
    }
  at::set_num_threads(saved);
}

TEST_CASE("stored matrices: rows taken and stacked as the fp32 rows are; what does not apply is refused") {
  const StoredMatrix a = random_stored(GgmlType::Q4_1, 6, 64, 3), b = random_stored(GgmlType::Q4_1, 4, 64, 4);
  const at::Tensor idx = at::tensor(std::vector<int64_t>{5, 0, 3, 3});
  CHECK(a.take_rows(idx).dequantize().equal(a.dequantize().index_select(0, idx)));
  const StoredMatrix ab = stored_cat({&a, &b});
  CHECK(ab.rows == 10);
  CHECK(ab.dequantize().equal(at::cat({a.dequantize(), b.dequantize()}, 0)));
  CHECK(ab.nbytes() == 10 * 2 * 20);  // two Q4_1 blocks of 20 bytes a row
  const StoredMatrix c = random_stored(GgmlType::Q8_0, 4, 64, 5);
  CHECK_THROWS_WITH_AS(stored_cat({&a, &c}), doctest::Contains("Q8_0"), Error);
  CHECK_FALSE(stored_applies(GgmlType::Q4_K, 64 + 32));  // not a whole number of 256-blocks
  CHECK_FALSE(stored_applies(GgmlType::F32, 64));        // fp32 stays an at::Tensor
  CHECK_FALSE(stored_applies(GgmlType::IQ2_XS, 256));    // no decoder
  CHECK_THROWS_WITH_AS(stored_linear(at::randn({2, 63}), a), doctest::Contains("[B, 64]"), Error);
}

// The matrices of the GGUF files kvlab runs (SmolLM2: Q4_1 and a Q8_0 embedding; Qwen2.5-Coder:
// Q5_0, Q8_0, Q4_K, Q6_K), one token and a batch of 10.
TEST_CASE("stored_linear on real GGUF matrices equals their dequantized product") {
  const char* env = std::getenv("KVLAB_MODELS");
  const fs::path models = env && *env ? env : std::string(KVLAB_SOURCE_DIR) + "/models";
  int seen = 0;
  for (const std::string name : {"smollm2-135m", "qwen2.5-coder-0.5b"}) {
    std::string path;
    if (fs::is_directory(models / name))
      for (const auto& e : fs::directory_iterator(models / name))
        if (e.path().extension() == ".gguf") path = e.path().string();
    if (path.empty()) {
      MESSAGE("skipped: no GGUF under " << (models / name).string());
      continue;
    }
    const GgufFile f(path);
    std::set<GgmlType> done;
    for (const auto& info : f.tensors()) {
      if (info.shape.size() != 2 || !stored_applies(info.type, info.shape[1]) || done.count(info.type)) continue;
      if (info.shape[0] > 20000) continue;  // the embeddings: tested by type elsewhere, slow to dequantize here
      done.insert(info.type);
      const StoredMatrix w = stored_matrix(info);
      CHECK(w.dequantize().equal(gguf_dequantize(info)));
      for (int64_t B : {1, 10}) {
        CAPTURE(info.name);
        CAPTURE(B);
        const at::Tensor x = at::randn({B, w.cols});
        const at::Tensor want = at::mm(x.to(at::kDouble), w.dequantize().to(at::kDouble).t());
        CHECK(rel_diff(stored_linear(x, w).to(at::kDouble), want) < 2e-6);
      }
      ++seen;
    }
  }
  MESSAGE(seen << " (file, type) matrices compared");
}

// --weights stored against --weights fp32 on the same GGUF: the projections, embedding and lm_head
// held as the file's blocks (in less memory), the same parameter count, the prefill (decoded per
// call, a GEMM) and the decode steps (stored_linear, one row and a batch of three) within float
// rounding of the fp32 model, and the same greedy tokens.
TEST_CASE("a model loaded with its weights as stored decodes as the fp32 model does") {
  const char* env = std::getenv("KVLAB_MODELS");
  const fs::path models = env && *env ? env : std::string(KVLAB_SOURCE_DIR) + "/models";
  int seen = 0;
  for (const std::string name : {"smollm2-135m", "qwen2.5-coder-0.5b"}) {
    if (!fs::is_directory(models / name)) {
      MESSAGE("skipped: " << (models / name).string() << " not found");
      continue;
    }
    CAPTURE(name);
    c10::InferenceMode guard;
    ModelLoadOptions so;
    so.stored_weights = true;
    const Model fp = load_model(name), st = load_model(name, so);  // names resolve under KVLAB_MODELS
    CHECK(n_parameters(st) == n_parameters(fp));
    // Held as stored: every projection of every layer, and the embedding.
    int64_t stored_bytes = st.weights.tok_embd_s.nbytes();
    CHECK(st.weights.tok_embd_s.defined());
    CHECK_FALSE(st.weights.tok_embd.defined());
    for (const auto& l : st.weights.layers) {
      for (const StoredMatrix* s : {&l.wq_s, &l.wk_s, &l.wv_s, &l.wo_s, &l.w_gate_s, &l.w_up_s, &l.w_down_s})
        CHECK(s->defined());
      for (const at::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) CHECK_FALSE(t->defined());
      stored_bytes += l.wo_s.nbytes() + l.w_down_s.nbytes() +
                      (l.wqkv_s.defined() ? l.wqkv_s.nbytes() : l.wq_s.nbytes() + l.wk_s.nbytes() + l.wv_s.nbytes()) +
                      (l.w_gate_up_s.defined() ? l.w_gate_up_s.nbytes() : l.w_gate_s.nbytes() + l.w_up_s.nbytes());
    }
    if (!st.weights.lm_head_s.data.is_same(st.weights.tok_embd_s.data)) stored_bytes += st.weights.lm_head_s.nbytes();
    const int64_t file_bytes = static_cast<int64_t>(fs::file_size(st.source.path));
    MESSAGE(name << ": matrices held in " << stored_bytes / 1e6 << " MB (file " << file_bytes / 1e6 << " MB)");
    CHECK(stored_bytes < file_bytes);
    // A 100-token prompt (the prefill's GEMM path), then 12 greedy steps (stored_linear, one row).
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < 100; ++i) prompt.push_back(100 + (i * 7919) % 20000);
    std::vector<at::Tensor> lf, ls;
    GenerateOptions go;
    go.max_new_tokens = 12;
    go.stop_at_eos = false;
    go.on_logits = [&](int64_t, const at::Tensor& l) { lf.push_back(l.clone()); };
    ExactAttention a1(fp.config.n_layers), a2(st.config.n_layers);
    const auto ids_fp = generate_greedy(fp, prompt, a1, go);
    go.on_logits = [&](int64_t, const at::Tensor& l) { ls.push_back(l.clone()); };
    const auto ids_st = generate_greedy(st, prompt, a2, go);
    CHECK(ids_st == ids_fp);
    REQUIRE(lf.size() == ls.size());
    double worst = 0;
    for (size_t i = 0; i < lf.size(); ++i) worst = std::max(worst, rel_diff(ls[i], lf[i]));
    MESSAGE(name << ": logits within " << worst << " (relative to the largest) of the fp32 model's");
    CHECK(worst < 1e-4);
    // Three sequences decoded together (stored_linear with three rows).
    const at::Tensor three = at::tensor(std::vector<int64_t>{5, 77, 901}, at::kLong).view({3, 1});  // [B, T]
    std::vector<ExactAttention> e1, e2;
    for (int b = 0; b < 3; ++b) e1.emplace_back(fp.config.n_layers), e2.emplace_back(st.config.n_layers);
    std::vector<AttentionBackend*> p1, p2;
    for (int b = 0; b < 3; ++b) p1.push_back(&e1[b]), p2.push_back(&e2[b]);
    CHECK(rel_diff(forward_batch(st, three, 0, p2), forward_batch(fp, three, 0, p1)) < 1e-4);
    ++seen;
  }
  // What the stored kernels cannot do is refused before anything loads.
  ModelLoadOptions bad;
  bad.stored_weights = true;
  bad.dtype = at::kBFloat16;
  const std::string stories = test::shared_dir() + "/models/stories260K";
  CHECK_THROWS_WITH_AS(load_model(stories, bad), doctest::Contains("--weights stored runs on the CPU in fp32"), Error);
  bad.dtype = at::kFloat;  // a Hugging Face directory has no blocks to keep
  CHECK_THROWS_WITH_AS(load_model(stories, bad), doctest::Contains("needs a .gguf"), Error);
  CHECK_THROWS_WITH_AS(parse_weights_flag("int4"), doctest::Contains("--weights 'int4': expected stored or fp32"), Error);
  MESSAGE(seen << " models compared");
}
