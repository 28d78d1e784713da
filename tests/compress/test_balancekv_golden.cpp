// balancekv: kvlab's practical halving against an independent golden. The golden
// (tests/fixtures/balancekv_golden/golden.json) comes from data_scripts/balancekv_reference.py, a
// numpy float64 re-implementation written from the paper (§4), docs/methods.md §3 and the release's
// src/balanced_walk.py `balanced_walk` (and checked there against a line-by-line transliteration
// of it), not from kvlab's code. The reference's uniforms are fed to kvlab through the
// balancekv::halve(…, UniformSource) seam, so the two must select the same tokens exactly.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "kvlab/compress/balancekv.h"

namespace {

namespace bk = kvlab::balancekv;

nlohmann::json load_golden() {
  const std::string path =
      std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/balancekv_golden/golden.json";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot open ", path);
  return nlohmann::json::parse(f);
}

// Flattens a nested JSON array of integers (row-major) and returns it as int64 with `shape`.
void flatten(const nlohmann::json& j, std::vector<int64_t>& out) {
  if (j.is_array()) {
    for (const auto& e : j) flatten(e, out);
  } else {
    out.push_back(j.get<int64_t>());
  }
}
at::Tensor int_tensor(const nlohmann::json& j, std::vector<int64_t> shape) {
  std::vector<int64_t> flat;
  flatten(j, flat);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  REQUIRE(static_cast<int64_t>(flat.size()) == numel);
  return at::tensor(flat, at::kLong).view(shape).clone();
}
// integers × a power-of-two scale: exact in float64 (and in float32 for these magnitudes).
at::Tensor scaled(const nlohmann::json& j, std::vector<int64_t> shape, double scale,
                  at::ScalarType dt) {
  return (int_tensor(j, std::move(shape)).to(at::kDouble) * scale).to(dt);
}

struct Case {
  std::string name;
  at::Tensor keys, values;         // [H, n, d], [H, n, dv]
  std::vector<at::Tensor> u;       // per round [H·nb_r, b]
  bk::HalvingOptions opt;
  std::vector<at::Tensor> round_idx, round_weight;  // per round [H, m_r]
  at::Tensor idx, weight;                           // [H, m_T]
};

std::vector<Case> load_cases(at::ScalarType dt) {
  const nlohmann::json g = load_golden();
  const double ks = g.at("key_scale").get<double>(), vs = g.at("value_scale").get<double>(),
               us = g.at("u_scale").get<double>();
  std::vector<Case> out;
  for (const auto& c : g.at("cases")) {
    Case k;
    k.name = c.at("name").get<std::string>();
    const int64_t H = c.at("n_kv_heads"), n = c.at("n"), d = c.at("head_dim"),
                  dv = c.at("value_dim"), b = c.at("block");
    const int T = c.at("halvings");
    k.opt.halvings = T;
    k.opt.block = b;
    k.opt.temp = c.at("temp");
    k.opt.gamma = c.at("gamma");
    k.opt.value_offset = c.at("value_offset");
    k.keys = scaled(c.at("key_int"), {H, n, d}, ks, dt);
    k.values = scaled(c.at("value_int"), {H, n, dv}, vs, dt);
    int64_t m = n;
    for (int r = 0; r < T; ++r) {
      const int64_t nb = (m + b - 1) / b;
      k.u.push_back(scaled(c.at("u_int").at(r), {H * nb, b}, us, dt));
      m /= 2;
      k.round_idx.push_back(int_tensor(c.at("round_idx").at(r), {H, m}));
      k.round_weight.push_back(int_tensor(c.at("round_weight").at(r), {H, m}).to(at::kDouble));
    }
    k.idx = int_tensor(c.at("idx"), {H, m});
    k.weight = int_tensor(c.at("weight"), {H, m}).to(at::kDouble);
    out.push_back(std::move(k));
  }
  REQUIRE(out.size() >= 3);
  return out;
}

// Runs kvlab's halve with the golden's uniforms, checking the seam's calls on the way.
bk::HalvingResult run_with_golden_u(const Case& k) {
  int calls = 0;
  auto src = [&](int round, at::IntArrayRef shape, const at::TensorOptions& options) {
    REQUIRE(round == calls);
    REQUIRE(round < static_cast<int>(k.u.size()));
    CHECK(shape == k.u[round].sizes());
    CHECK(options.dtype() == k.keys.dtype());
    ++calls;
    return k.u[round];
  };
  bk::HalvingResult r = bk::halve(k.keys, k.values, k.opt, src);
  CHECK(calls == k.opt.halvings);
  return r;
}

void require_matches(const Case& k, const bk::HalvingResult& r) {
  REQUIRE(r.rounds == k.opt.halvings);
  REQUIRE(r.round_idx.size() == k.round_idx.size());
  REQUIRE(r.round_weight.size() == k.round_weight.size());
  for (size_t t = 0; t < k.round_idx.size(); ++t) {
    INFO("round ", t);
    REQUIRE(r.round_idx[t].sizes() == k.round_idx[t].sizes());
    CHECK(at::equal(r.round_idx[t].to(at::kLong), k.round_idx[t]));
    REQUIRE(r.round_weight[t].sizes() == k.round_weight[t].sizes());
    CHECK((r.round_weight[t].to(at::kDouble) - k.round_weight[t]).abs().max().item<double>() <=
          1e-12);
  }
  REQUIRE(r.idx.sizes() == k.idx.sizes());
  CHECK(at::equal(r.idx.to(at::kLong), k.idx));
  REQUIRE(r.weight.sizes() == k.weight.sizes());
  CHECK((r.weight.to(at::kDouble) - k.weight).abs().max().item<double>() <= 1e-12);
}

}  // namespace

TEST_CASE("balancekv golden: halve matches the independent float64 reference exactly") {
  for (const Case& k : load_cases(at::kDouble)) {
    INFO("case ", k.name);
    require_matches(k, run_with_golden_u(k));
  }
}

TEST_CASE("balancekv golden: float32 inputs select the same tokens (walk margins >= 1e-3)") {
  // The inputs are exact in float32; only the arithmetic differs, and every |u − p| in the
  // golden is at least 1e-3, far above float32 rounding of p.
  for (const Case& k : load_cases(at::kFloat)) {
    INFO("case ", k.name);
    require_matches(k, run_with_golden_u(k));
  }
}

TEST_CASE("balancekv golden: halve(gen) is halve(UniformSource) with at::rand(shape, gen, options)") {
  const Case k = load_cases(at::kDouble).at(0);
  at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(20250);
  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(20250);
  bk::HalvingResult a = bk::halve(k.keys, k.values, k.opt, g1);
  bk::HalvingResult b = bk::halve(k.keys, k.values, k.opt,
                                  [&g2](int, at::IntArrayRef shape, const at::TensorOptions& o) {
                                    return at::rand(shape, g2, o);
                                  });
  REQUIRE(a.rounds == b.rounds);
  CHECK(at::equal(a.idx, b.idx));
  CHECK(at::equal(a.weight, b.weight));
  for (size_t t = 0; t < a.round_idx.size(); ++t) {
    CHECK(at::equal(a.round_idx[t], b.round_idx[t]));
    CHECK(at::equal(a.round_weight[t], b.round_weight[t]));
  }
  // both generators advanced by the same draws
  auto o = at::TensorOptions().dtype(at::kDouble);
  CHECK(at::equal(at::rand({8}, g1, o), at::rand({8}, g2, o)));
}
