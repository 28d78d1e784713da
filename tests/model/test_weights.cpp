// Weight loading: safetensors (checked against the independent llama2.c .bin of stories260K),
// GGUF (checked against gguf-py's numpy dequantization, golden files from
// data_scripts/make_gguf_fixtures.py), malformed and hostile files, and the q/k row permutation.
#include "kvlab/core/check.h"
#include "kvlab/io/gguf.h"
#include "kvlab/io/safetensors.h"
#include "kvlab/model/model.h"
#include "test_util.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using kvlab::Error;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
void put(std::string& b, T v) {
  b.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A safetensors file from a header JSON text and `data_bytes` bytes of data.
std::string make_safetensors(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
  std::string b;
  put<uint64_t>(b, claimed_len == UINT64_MAX ? header.size() : claimed_len);
  b += header;
  b.append(data_bytes, '\0');
  return b;
}

kvlab::SafetensorsHeader parse_st(const std::string& bytes) {
  return kvlab::parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.safetensors");
}

kvlab::GgufContents parse_gg(const std::string& bytes) {
  return kvlab::parse_gguf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.gguf");
}

// llama2.c's legacy checkpoint: 7 int32 then float32 weights in a fixed order.
struct Llama2c {
  int dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
  std::vector<float> w;
  size_t pos = 0;
  at::Tensor next(std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    REQUIRE(pos + n <= w.size());
    at::Tensor t = at::from_blob(w.data() + pos, shape, at::kFloat).clone();
    pos += n;
    return t;
  }
};

Llama2c read_llama2c(const std::string& path) {
  const std::string bytes = read_bytes(path);
  Llama2c m{};
  REQUIRE(bytes.size() > 28);
  std::memcpy(&m.dim, bytes.data(), 28);
  m.w.resize((bytes.size() - 28) / 4);
  std::memcpy(m.w.data(), bytes.data() + 28, m.w.size() * 4);
  m.vocab = std::abs(m.vocab);
  return m;
}

std::string smollm2_gguf() {
  const char* env = std::getenv("KVLAB_MODELS");
  fs::path dir = (env && *env) ? fs::path(env) : fs::path(KVLAB_SOURCE_DIR) / "models";
  dir /= "smollm2-135m";
  if (!fs::is_directory(dir)) return "";
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gguf") return e.path().string();
  return "";
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// safetensors

TEST_CASE("safetensors: stories260K matches the independent llama2.c checkpoint") {
  const std::string dir = kvlab::test::shared_dir() + "/models/stories260K";
  kvlab::SafetensorsCheckpoint ckpt(dir);
  CHECK(ckpt.n_files() == 1);
  CHECK(ckpt.names().size() == 47);  // embed + norm + 5 layers x 9 (tied: no lm_head)
  CHECK(ckpt.has("model.embed_tokens.weight"));
  CHECK_FALSE(ckpt.has("lm_head.weight"));
  CHECK(ckpt.view("model.layers.0.self_attn.k_proj.weight").shape == std::vector<int64_t>{32, 64});
  CHECK((ckpt.view("model.layers.4.mlp.down_proj.weight").dtype == at::kFloat));

  kvlab::SafetensorsFile file(dir + "/model.safetensors");
  CHECK(file.metadata().value("format", "") == "pt");
  CHECK(file.find("nope") == nullptr);

  Llama2c ref = read_llama2c(dir + "/stories260K.bin");
  REQUIRE(ref.dim == 64);
  REQUIRE(ref.n_layers == 5);
  const int64_t L = ref.n_layers, D = ref.dim, H = ref.hidden, head_dim = ref.dim / ref.n_heads;
  const int64_t kv_dim = head_dim * ref.n_kv_heads;
  at::Tensor embd = ref.next({ref.vocab, D});        // [vocab, dim]
  at::Tensor rms_att = ref.next({L, D});             // [n_layers, dim]
  at::Tensor wq = ref.next({L, D, D});               // [n_layers, out, in], interleaved RoPE rows
  at::Tensor wk = ref.next({L, kv_dim, D});          // [n_layers, kv_dim, dim]
  at::Tensor wv = ref.next({L, kv_dim, D});
  at::Tensor wo = ref.next({L, D, D});
  at::Tensor rms_ffn = ref.next({L, D});
  at::Tensor w1 = ref.next({L, H, D});               // gate [n_layers, hidden, dim]
  at::Tensor w2 = ref.next({L, D, H});               // down [n_layers, dim, hidden]
  at::Tensor w3 = ref.next({L, H, D});               // up
  at::Tensor rms_final = ref.next({D});

  at::Tensor e = ckpt.get("model.embed_tokens.weight");  // [512, 64]
  CHECK(e.sizes() == at::IntArrayRef{512, 64});
  CHECK(at::equal(e, embd));
  CHECK(at::equal(ckpt.get("model.norm.weight"), rms_final));
  for (int64_t l = 0; l < L; ++l) {
    CAPTURE(l);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    CHECK(at::equal(ckpt.get(p + "input_layernorm.weight"), rms_att[l]));
    CHECK(at::equal(ckpt.get(p + "post_attention_layernorm.weight"), rms_ffn[l]));
    CHECK(at::equal(ckpt.get(p + "self_attn.v_proj.weight"), wv[l]));
    CHECK(at::equal(ckpt.get(p + "self_attn.o_proj.weight"), wo[l]));
    CHECK(at::equal(ckpt.get(p + "mlp.gate_proj.weight"), w1[l]));
    CHECK(at::equal(ckpt.get(p + "mlp.down_proj.weight"), w2[l]));
    CHECK(at::equal(ckpt.get(p + "mlp.up_proj.weight"), w3[l]));
    // llama2.c stores q/k with interleaved RoPE pairs, like GGUF; the HF file is rotate-half.
    // So the GGUF un-permutation must turn llama2.c's rows into the HF rows.
    CHECK(at::equal(ckpt.get(p + "self_attn.q_proj.weight"), kvlab::gguf_unpermute_qk(wq[l], ref.n_heads)));
    CHECK(at::equal(ckpt.get(p + "self_attn.k_proj.weight"), kvlab::gguf_unpermute_qk(wk[l], ref.n_kv_heads)));
  }
  // Conversion on load.
  at::Tensor eh = ckpt.get("model.embed_tokens.weight", at::kHalf);
  CHECK((eh.scalar_type() == at::kHalf));
  CHECK(at::allclose(eh.to(at::kFloat), embd, 1e-3, 1e-3));
  CHECK_THROWS_WITH_AS(ckpt.get("model.layers.9.mlp.up_proj.weight"), doctest::Contains("no tensor 'model.layers.9"),
                       Error);
}

TEST_CASE("safetensors: F16/BF16 and a sharded index") {
  const std::string dir = kvlab::test::temp_dir("st_sharded");
  // shard 1: a [2, 3] F16 tensor; shard 2: a [3] BF16 tensor and a [2, 2] F32 tensor.
  std::string d1;
  for (float v : {1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -0.25f}) put<uint16_t>(d1, at::Half(v).x);
  std::string s1 = make_safetensors(
      R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"__metadata__":{"k":"v"}})", 0);
  write_bytes(dir + "/model-00001-of-00002.safetensors", s1 + d1);
  std::string d2;
  for (float v : {1.5f, -4.0f, 0.125f}) put<uint16_t>(d2, at::BFloat16(v).x);
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) put<float>(d2, v);
  std::string s2 = make_safetensors(
      R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"c":{"dtype":"F32","shape":[2,2],"data_offsets":[6,22]}})", 0);
  write_bytes(dir + "/model-00002-of-00002.safetensors", s2 + d2);
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");

  kvlab::SafetensorsCheckpoint ckpt(dir);
  CHECK(ckpt.n_files() == 2);
  CHECK(ckpt.names() == std::vector<std::string>{"a", "b", "c"});
  at::Tensor a = ckpt.get("a");  // [2, 3]
  CHECK((a.scalar_type() == at::kFloat));
  CHECK(at::equal(a, at::tensor({1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -0.25f}).reshape({2, 3})));
  CHECK(at::equal(ckpt.get("b"), at::tensor({1.5f, -4.0f, 0.125f})));
  CHECK(at::equal(ckpt.get("c"), at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2})));
  CHECK((ckpt.get("b", at::kBFloat16).scalar_type() == at::kBFloat16));

  // The index claims a tensor its shard lacks.
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"weight_map":{"a":"model-00002-of-00002.safetensors"}})");
  CHECK_THROWS_WITH_AS(kvlab::SafetensorsCheckpoint{dir}, doctest::Contains("does not hold it"), Error);
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  CHECK_THROWS_WITH_AS(kvlab::SafetensorsCheckpoint{dir}, doctest::Contains("same directory"), Error);
  CHECK_THROWS_WITH_AS(kvlab::SafetensorsCheckpoint{dir + "/missing"}, doctest::Contains("does not exist"), Error);
}

TEST_CASE("safetensors: malformed files give errors that name the problem") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  CHECK(parse_st(make_safetensors(ok, 16)).tensors.size() == 1);

  SUBCASE("truncated header") {
    CHECK_THROWS_WITH_AS(parse_st(std::string("\x10\x00\x00", 3)), doctest::Contains("truncated"), Error);
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(ok, 16).substr(0, 30)), doctest::Contains("beyond the end"), Error);
  }
  SUBCASE("header length beyond the file") {
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(ok, 16, 1000)), doctest::Contains("beyond the end of the file"),
                         Error);
  }
  SUBCASE("header length over the limit") {
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(ok, 16, uint64_t(1) << 40)), doctest::Contains("exceeds the limit"),
                         Error);
  }
  SUBCASE("invalid JSON") {
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(R"({"w":{"dtype":)", 0)), doctest::Contains("not valid JSON"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors("[1,2]", 0)), doctest::Contains("must be a JSON object"), Error);
  }
  SUBCASE("overlapping ranges") {
    const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h, 16)), doctest::Contains("overlap"), Error);
  }
  SUBCASE("offsets out of range") {
    const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h, 16)), doctest::Contains("out of range"), Error);
    const std::string h2 = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h2, 16)), doctest::Contains("begin > end"), Error);
    const std::string h3 = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[-1,15]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h3, 16)), doctest::Contains("non-negative"), Error);
  }
  SUBCASE("duplicate names") {
    const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h, 8)), doctest::Contains("tensor 'a' appears twice"), Error);
  }
  SUBCASE("unsupported dtype") {
    const std::string h = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h, 16)), doctest::Contains("tensor 'ids' has dtype I64"), Error);
  }
  SUBCASE("shape/byte mismatch") {
    const std::string h = R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[0,16]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h, 16)), doctest::Contains("shape/byte mismatch"), Error);
    const std::string h2 = R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}})";
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(h2, 16)), doctest::Contains("overflows"), Error);
  }
  SUBCASE("missing or mistyped fields") {
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(R"({"a":{"dtype":"F32","shape":[1]}})", 4)),
                         doctest::Contains("missing field 'data_offsets'"), Error);
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(R"({"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", 4)),
                         doctest::Contains("shape must be an array"), Error);
    CHECK_THROWS_WITH_AS(parse_st(make_safetensors(R"({"__metadata__":{"a":1}})", 0)),
                         doctest::Contains("__metadata__['a'] must be a string"), Error);
  }
  SUBCASE("errors from files name the file") {
    const std::string path = kvlab::test::temp_dir("st_bad") + "/bad.safetensors";
    write_bytes(path, make_safetensors(ok, 8));
    CHECK_THROWS_WITH_AS(kvlab::SafetensorsFile{path}, doctest::Contains("bad.safetensors: tensor 'w'"), Error);
  }
}

// ----------------------------------------------------------------------------------------------
// GGUF

TEST_CASE("gguf: dequantization matches gguf-py (numpy) on every supported type") {
  const std::string dir = kvlab::test::fixtures_dir() + "/gguf";
  kvlab::GgufFile g(dir + "/quants.gguf");
  kvlab::SafetensorsFile expected(dir + "/quants.expected.safetensors");
  CHECK(g.version() == 3);
  CHECK(g.alignment() == 32);
  REQUIRE(g.tensors().size() == expected.tensors().size());
  for (const kvlab::TensorView& ev : expected.tensors()) {
    const kvlab::GgufTensorInfo* info = g.find_tensor(ev.name);
    REQUIRE_MESSAGE(info, ev.name);
    at::Tensor want = kvlab::tensor_from_view(ev);  // [shape] float32
    at::Tensor got = g.get(ev.name);                // [shape] float32
    const double maxdiff = (got - want).abs().max().item<double>();
    CHECK_MESSAGE(got.sizes() == want.sizes(), "tensor=" << ev.name << " type=" << kvlab::ggml_type_name(info->type)
                                                         << " got " << got.sizes() << " want " << want.sizes());
    CHECK_MESSAGE(maxdiff <= 1e-6, "tensor=" << ev.name << " type=" << kvlab::ggml_type_name(info->type)
                                             << " maxdiff=" << maxdiff);
  }
  // GGUF dims are fastest-first; shapes are row-major.
  const kvlab::GgufTensorInfo* t3 = g.find_tensor("t.q4_1_3d");
  CHECK(t3->ne == std::vector<int64_t>{64, 3, 2});
  CHECK(t3->shape == std::vector<int64_t>{2, 3, 64});
  CHECK(t3->type == kvlab::GgmlType::Q4_1);
  CHECK((g.get("t.f16", at::kHalf).scalar_type() == at::kHalf));
  CHECK_THROWS_WITH_AS(g.get("nope"), doctest::Contains("no tensor 'nope'"), Error);
}

TEST_CASE("gguf: metadata getters") {
  kvlab::GgufFile g(kvlab::test::fixtures_dir() + "/gguf/quants.gguf");
  CHECK(g.architecture() == "llama");
  CHECK(g.get_string("general.name") == "kvlab-fixture");
  CHECK(g.get_int("test.u8") == 200);
  CHECK(g.get_int("test.i8") == -100);
  CHECK(g.get_int("test.u16") == 60000);
  CHECK(g.get_int("test.i16") == -30000);
  CHECK(g.get_int("test.u32") == 4000000000LL);
  CHECK(g.get_int("test.i32") == -2000000000LL);
  CHECK(g.get_int("test.u64") == (int64_t(1) << 40) + 3);
  CHECK(g.get_int("test.i64") == -(int64_t(1) << 40) - 3);
  CHECK(g.get_float("test.f32") == 0.25);
  CHECK(g.get_float("test.f64") == -1.5e-300);
  CHECK(g.get_float("test.u8") == 200.0);  // integers read as floats
  CHECK(g.get_bool("test.bool"));
  CHECK(g.get_string("test.str") == "h\xC3\xA9llo \xE2\x9C\x93");
  CHECK(g.get_int_array("test.arr_i32") == std::vector<int64_t>{1, -2, 3});
  CHECK(g.get_float_array("test.arr_f32") == std::vector<double>{0.5, -0.25});
  CHECK(g.get_float_array("test.arr_i32") == std::vector<double>{1, -2, 3});
  CHECK(g.get_string_array("test.arr_str") == std::vector<std::string>{"a", "", "\xC3\xBC"});
  const kvlab::GgufValue& nested = g.value("test.arr_nested");
  CHECK(nested.elem_type == kvlab::GgufType::ARRAY);
  REQUIRE(nested.arrays.size() == 2);
  CHECK(nested.arrays[0].ints == std::vector<int64_t>{1, 2});
  CHECK(nested.arrays[1].ints == std::vector<int64_t>{3});
  // The llama hparams and tokenizer arrays the model and tokenizer read.
  CHECK(g.get_int("llama.block_count") == 2);
  CHECK(g.get_int("llama.attention.head_count") == 8);
  CHECK(g.get_int("llama.attention.head_count_kv") == 4);
  CHECK(g.get_int("llama.embedding_length") == 64);
  CHECK(g.get_int("llama.feed_forward_length") == 172);
  CHECK(g.get_int("llama.context_length") == 512);
  CHECK(g.get_float("llama.rope.freq_base") == 10000.0);
  CHECK(g.get_float("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5));
  CHECK(g.get_string("tokenizer.ggml.model") == "llama");
  CHECK(g.get_string_array("tokenizer.ggml.tokens").size() == 5);
  CHECK(g.get_float_array("tokenizer.ggml.scores")[3] == -1.5);
  CHECK(g.get_int_array("tokenizer.ggml.token_type") == std::vector<int64_t>{2, 3, 3, 1, 6});
  CHECK(g.get_int("tokenizer.ggml.bos_token_id") == 1);
  CHECK(g.get_int("tokenizer.ggml.eos_token_id") == 2);
  CHECK(g.get_string("tokenizer.chat_template") == "{{ bos_token }}");
  // Defaults and errors.
  CHECK(g.get_int_or("llama.missing", 7) == 7);
  CHECK(g.get_string_or("general.name", "x") == "kvlab-fixture");
  CHECK(g.get_float_or("x.y", 0.5) == 0.5);
  CHECK_FALSE(g.get_bool_or("x.y", false));
  CHECK_THROWS_WITH_AS(g.get_int("llama.missing"), doctest::Contains("key 'llama.missing' not found"), Error);
  CHECK_THROWS_WITH_AS(g.get_int("general.name"), doctest::Contains("has type STRING, expected an integer"), Error);
  CHECK_THROWS_WITH_AS(g.get_string_array("test.arr_i32"), doctest::Contains("ARRAY of INT32, expected ARRAY of STRING"),
                       Error);
  CHECK_THROWS_WITH_AS(g.get_int_or("general.name", 1), doctest::Contains("expected an integer"), Error);
}

TEST_CASE("gguf: custom alignment and version 2") {
  const std::string path = kvlab::test::fixtures_dir() + "/gguf/aligned64.gguf";
  kvlab::GgufFile g(path);
  CHECK(g.alignment() == 64);
  CHECK(g.contents().data_offset % 64 == 0);
  CHECK(at::equal(g.get("a.f32"), at::arange(10, at::kFloat).reshape({2, 5})));
  CHECK(at::allclose(g.get("b.q8_0"), at::linspace(-1, 1, 64, at::kFloat).reshape({2, 32}), 0, 0.01));

  std::string bytes = read_bytes(path);
  bytes[4] = 2;  // v2 has the same layout as v3 (64-bit counts)
  CHECK(parse_gg(bytes).version == 2);
  bytes[4] = 1;
  CHECK_THROWS_WITH_AS(parse_gg(bytes), doctest::Contains("GGUF version 1 is not supported"), Error);
  bytes[0] = 'X';
  CHECK_THROWS_WITH_AS(parse_gg(bytes), doctest::Contains("bad magic"), Error);
}

TEST_CASE("gguf: every truncation of a valid file is an error, never a crash") {
  const std::string bytes = read_bytes(kvlab::test::fixtures_dir() + "/gguf/quants.gguf");
  const kvlab::GgufContents full = parse_gg(bytes);
  int n_errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      parse_gg(bytes.substr(0, n));
    } catch (const Error&) {
      ++n_errors;
    }
  }
  // Every prefix that cuts into the header or a tensor fails; only trailing padding after the last
  // tensor's bytes may be dropped.
  const auto& last = full.tensors.back();
  const size_t needed = full.data_offset + last.offset + last.nbytes;
  CHECK(n_errors == static_cast<int>(needed));
}

namespace {
// Hand-built GGUF pieces for hostile inputs.
struct GgufBuilder {
  std::string b;
  GgufBuilder(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b = "GGUF";
    put<uint32_t>(b, version);
    put<uint64_t>(b, n_tensors);
    put<uint64_t>(b, n_kv);
  }
  GgufBuilder& str(const std::string& s) {
    put<uint64_t>(b, s.size());
    b += s;
    return *this;
  }
  GgufBuilder& u32(uint32_t v) { put(b, v); return *this; }
  GgufBuilder& u64(uint64_t v) { put(b, v); return *this; }
  // A tensor info: name, ne (fastest first), ggml type, offset.
  GgufBuilder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  // Pads to 32 and appends `n` data bytes.
  std::string with_data(size_t n) const {
    std::string out = b;
    out.append((32 - out.size() % 32) % 32, '\0');
    out.append(n, '\x01');
    return out;
  }
};
}  // namespace

TEST_CASE("gguf: hostile headers") {
  // A sane file: one F32 [4] tensor.
  CHECK(parse_gg(GgufBuilder(1, 0).tensor("x", {4}, 0, 0).with_data(16)).tensors.size() == 1);

  SUBCASE("huge counts are rejected before allocating") {
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, uint64_t(1) << 60).b), doctest::Contains("claims"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(uint64_t(1) << 60, 0).b), doctest::Contains("claims"), Error);
    // An array claiming 2^60 INT32 elements, and 2^40 strings.
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("k").u32(9).u32(5).u64(uint64_t(1) << 60).b),
                         doctest::Contains("metadata key 'k' claims"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("k").u32(9).u32(8).u64(uint64_t(1) << 40).b),
                         doctest::Contains("claims"), Error);
  }
  SUBCASE("strings longer than the file") {
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).u64(uint64_t(1) << 62).u64(0).u64(0).b), doctest::Contains("truncated"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("k").u32(8).u64(~uint64_t(0)).b),
                         doctest::Contains("truncated GGUF file: metadata key 'k'"), Error);
  }
  SUBCASE("bad value types") {
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("k").u32(13).b), doctest::Contains("unknown value type 13"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("k").u32(9).u32(77).u64(0).b),
                         doctest::Contains("unknown array element type 77"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).b),
                         doctest::Contains("duplicate metadata key 'k'"), Error);
  }
  SUBCASE("deeply nested arrays") {
    GgufBuilder g(0, 1);
    g.str("k").u32(9);
    for (int d = 0; d < 20; ++d) g.u32(9).u64(1);
    g.u32(4).u64(0);
    CHECK_THROWS_WITH_AS(parse_gg(g.b), doctest::Contains("nested deeper"), Error);
  }
  SUBCASE("alignment") {
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("general.alignment").u32(4).u32(24).b),
                         doctest::Contains("power of two"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(0, 1).str("general.alignment").u32(4).u32(0).b),
                         doctest::Contains("power of two"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {4}, 0, 16).with_data(64)),
                         doctest::Contains("not a multiple of the alignment"), Error);
  }
  SUBCASE("tensor infos") {
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {1, 1, 1, 1, 1}, 0, 0).with_data(4)),
                         doctest::Contains("tensor 'x' has 5 dimensions"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {4}, 99, 0).with_data(16)),
                         doctest::Contains("tensor 'x' has unknown ggml type 99"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {uint64_t(1) << 62, 1 << 4}, 0, 0).with_data(16)),
                         doctest::Contains("overflow"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {~uint64_t(0)}, 0, 0).with_data(16)),
                         doctest::Contains("overflow"), Error);
    // A zero dimension makes the element count 0, but the others must not overflow either (ATen
    // refuses such a shape: fuzz_gguf, seed crash_zero_dim_overflow.gguf).
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {0, uint64_t(1) << 40, uint64_t(1) << 40}, 0, 0).with_data(16)),
                         doctest::Contains("overflow"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("q", {48}, 2, 0).with_data(64)),
                         doctest::Contains("not a multiple of the block size 32"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {1 << 20}, 0, 0).with_data(16)),
                         doctest::Contains("tensor 'x' (4194304 bytes at data offset 0) is out of range"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(1, 0).tensor("x", {4}, 0, ~uint64_t(0) << 5).with_data(16)),
                         doctest::Contains("out of range"), Error);
    CHECK_THROWS_WITH_AS(
        parse_gg(GgufBuilder(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).with_data(64)),
        doctest::Contains("tensors 'a' and 'b' overlap"), Error);
    CHECK_THROWS_WITH_AS(parse_gg(GgufBuilder(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).with_data(64)),
                         doctest::Contains("duplicate tensor name 'a'"), Error);
  }
  SUBCASE("types without a dequantizer are named") {
    const std::string bytes = GgufBuilder(1, 0).tensor("w", {256}, 16, 0).with_data(66);  // IQ2_XXS
    const kvlab::GgufContents c = parse_gg(bytes);
    CHECK_THROWS_WITH_AS(kvlab::gguf_dequantize(c.tensors[0]),
                         doctest::Contains("tensor 'w' has ggml type IQ2_XXS, which kvlab cannot dequantize"), Error);
  }
}

TEST_CASE("gguf: a huge block_count or a zero context_length names the file and the key") {
  // A llama GGUF holding token_embd.weight (F32 [vocab 8, n_embd 4]) and output_norm.weight (F32
  // [4]): all the loader reads before it sizes the layers; the config fails first.
  auto file = [](uint32_t block_count, uint32_t context) {
    GgufBuilder g(2, 6);
    g.str("general.architecture").u32(8).str("llama");
    g.str("llama.embedding_length").u32(4).u32(4);
    g.str("llama.block_count").u32(4).u32(block_count);
    g.str("llama.attention.head_count").u32(4).u32(2);
    g.str("llama.feed_forward_length").u32(4).u32(8);
    g.str("llama.context_length").u32(4).u32(context);
    g.tensor("token_embd.weight", {4, 8}, 0, 0);
    g.tensor("output_norm.weight", {4}, 0, 4 * 8 * 4);
    return g.with_data(4 * 8 * 4 + 4 * 4);
  };
  const std::string dir = kvlab::test::temp_dir("gguf_bounds");
  const std::string huge = dir + "/huge.gguf", zero_ctx = dir + "/ctx0.gguf";
  write_bytes(huge, file(2147483647u, 512));
  write_bytes(zero_ctx, file(2, 0));
  // Was a bare std::bad_alloc (one LayerWeights per claimed layer).
  CHECK_THROWS_WITH_AS(kvlab::load_model(huge),
                       doctest::Contains((huge + ": key 'llama.block_count' = 2147483647 is out of range").c_str()), Error);
  CHECK_THROWS_WITH_AS(kvlab::load_model(zero_ctx),
                       doctest::Contains((zero_ctx + ": key 'llama.context_length' must be a positive integer (the "
                                                     "model's context length), found 0").c_str()),
                       Error);
}

TEST_CASE("a NaN or Inf weight is an error at load naming the file and the tensor (issue 50)") {
  // Before: the model loaded and generate printed <unk> with exit 0.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  SUBCASE("safetensors (tiny qwen2)") {
    const std::string dir = kvlab::test::temp_dir("nonfinite_hf");
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(kvlab::test::fixtures_dir() + "/tiny_models/qwen2/" + f, dir + "/" + f);
    CHECK_NOTHROW(kvlab::load_model(dir));
    std::string bytes = read_bytes(dir + "/model.safetensors");
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
    const std::string name = "model.layers.1.mlp.down_proj.weight";
    REQUIRE(header.contains(name));
    REQUIRE(header[name]["dtype"] == "F32");
    for (float bad : {nan, inf}) {
      const size_t at = 8 + header_len + header[name]["data_offsets"][0].get<size_t>() + 4 * 7;
      std::memcpy(&bytes[at], &bad, 4);
      write_bytes(dir + "/model.safetensors", bytes);
      CHECK_THROWS_WITH_AS(kvlab::load_model(dir),
                           doctest::Contains((dir + ": tensor '" + name + "' holds a NaN or Inf value").c_str()), Error);
    }
  }
  SUBCASE("GGUF") {
    // token_embd.weight (F32 [vocab 8, n_embd 4]) is read first; its first value is NaN.
    GgufBuilder g(2, 6);
    g.str("general.architecture").u32(8).str("llama");
    g.str("llama.embedding_length").u32(4).u32(4);
    g.str("llama.block_count").u32(4).u32(1);
    g.str("llama.attention.head_count").u32(4).u32(2);
    g.str("llama.feed_forward_length").u32(4).u32(8);
    g.str("llama.context_length").u32(4).u32(64);
    g.tensor("token_embd.weight", {4, 8}, 0, 0);
    g.tensor("output_norm.weight", {4}, 0, 4 * 8 * 4);
    const size_t data_bytes = 4 * 8 * 4 + 4 * 4;
    std::string bytes = g.with_data(data_bytes);
    std::memcpy(&bytes[bytes.size() - data_bytes], &nan, 4);
    const std::string path = kvlab::test::temp_dir("nonfinite_gguf") + "/nan.gguf";
    write_bytes(path, bytes);
    CHECK_THROWS_WITH_AS(kvlab::load_model(path),
                         doctest::Contains((path + ": tensor 'token_embd.weight' holds a NaN or Inf value").c_str()),
                         Error);
  }
}

TEST_CASE("gguf: q/k row permutation") {
  // One head, head_dim 4: HF rows [0, 1 | 2, 3] (rotate-half) -> interleaved [0, 2, 1, 3].
  CHECK(at::equal(kvlab::gguf_permute_qk(at::arange(4, at::kFloat), 1), at::tensor({0.f, 2.f, 1.f, 3.f})));
  // head_dim 6: [0, 1, 2 | 3, 4, 5] -> [0, 3, 1, 4, 2, 5]; two heads permute independently.
  CHECK(at::equal(kvlab::gguf_permute_qk(at::arange(12, at::kFloat), 2),
                  at::tensor({0.f, 3.f, 1.f, 4.f, 2.f, 5.f, 6.f, 9.f, 7.f, 10.f, 8.f, 11.f})));
  at::Tensor w = at::randn({9 * 64, 65});  // [n_heads * head_dim, in]
  CHECK(at::equal(kvlab::gguf_unpermute_qk(kvlab::gguf_permute_qk(w, 9), 9), w));
  CHECK(at::equal(kvlab::gguf_permute_qk(kvlab::gguf_unpermute_qk(w, 3), 3), w));
  at::Tensor b = at::randn({3 * 64});  // a bias [n_kv_heads * head_dim]
  CHECK(at::equal(kvlab::gguf_unpermute_qk(kvlab::gguf_permute_qk(b, 3), 3), b));
  CHECK_THROWS_WITH_AS(kvlab::gguf_unpermute_qk(at::zeros({10, 4}), 3), doctest::Contains("divisible by 2 * n_heads"),
                       Error);
}

TEST_CASE("gguf: SmolLM2-135M-Instruct metadata (skips when data_scripts/get_smollm2.sh has not run)") {
  const std::string path = smollm2_gguf();
  if (path.empty()) {
    MESSAGE("skipped: no models/smollm2-135m/*.gguf (run data_scripts/get_smollm2.sh)");
    return;
  }
  kvlab::GgufFile g(path);
  CHECK(g.architecture() == "llama");
  CHECK(g.get_int("llama.block_count") == 30);
  CHECK(g.get_int("llama.attention.head_count") == 9);
  CHECK(g.get_int("llama.attention.head_count_kv") == 3);
  CHECK(g.get_int("llama.embedding_length") == 576);
  CHECK(g.get_int("llama.feed_forward_length") == 1536);
  CHECK(g.get_int("llama.context_length") == 8192);
  CHECK(g.get_float("llama.rope.freq_base") == 100000.0);
  CHECK(g.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(g.get_string_array("tokenizer.ggml.tokens").size() == 49152);
  CHECK(g.get_string_array("tokenizer.ggml.merges").size() > 40000);
  CHECK(g.tensors().size() == 2 + 30 * 9);  // token_embd + output_norm + 9 per layer (tied output)
  CHECK_FALSE(g.has_tensor("output.weight"));
  const kvlab::GgufTensorInfo* embd = g.find_tensor("token_embd.weight");
  REQUIRE(embd);
  CHECK(embd->shape == std::vector<int64_t>{49152, 576});
  at::Tensor wq = g.get("blk.0.attn_q.weight");  // [576, 576]
  CHECK(wq.sizes() == at::IntArrayRef{576, 576});
  CHECK(at::isfinite(wq).all().item<bool>());
  at::Tensor wk = g.get("blk.29.attn_k.weight");  // [192, 576]
  CHECK(wk.sizes() == at::IntArrayRef{192, 576});
  const double std = wk.std().item<double>();
  CHECK(std > 1e-3);
  CHECK(std < 1.0);
}
