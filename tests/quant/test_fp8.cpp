// FP8 E4M3 (quant/fp8.h) against torch 2.15's float8_e4m3fn casts: tests/fixtures/quant_golden/
// fp8_e4m3fn.json (data_scripts/make_quant_golden.py). Every one of the 256 codes decodes to torch's
// value; 1,040 float32 values at the edges (every finite fp8 value, the midpoints between neighbours
// and one float32 ulp either side, overflow, tiny values, ±0, ±NaN) encode to torch's code; and the
// six KV-cache cases (keys and values of a real-shaped layer, per-tensor, per-(head, token) and
// vLLM-style scales) give torch's codes, x / scale in float32 then the cast.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvlab/core/config.h"
#include "kvlab/quant/fp8.h"
#include "golden.h"

using namespace kvlab;


TEST_CASE("fp8 e4m3: the 256 codes decode, and edge values encode, as torch's float8_e4m3fn") {
  const auto g = read_json_file(test::quant_fixture("fp8_e4m3fn.json"));
  const at::Tensor table = test::golden_floats(g["decode_table_f32"], {256});
  for (int c = 0; c < 256; ++c) {
    INFO("code " << c);
    const float mine = fp8_e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) CHECK(std::isnan(mine));  // the golden writes NaN as 0
    else CHECK(mine == table[c].item<float>());
  }
  const auto& e = g["edge_values"];
  const int64_t n = e["n"].get<int64_t>();
  const at::Tensor x = test::golden_floats(e["x_f32"], {n});
  const std::vector<uint8_t> codes = test::base64(e["codes"]);
  REQUIRE(static_cast<int64_t>(codes.size()) == n);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i].item<float>();
    const uint8_t mine = fp8_e4m3_encode(v);
    // NaN: torch's payload is 0x7F / 0xFF by sign; any NaN code would do, and ours is the same.
    if (mine != codes[static_cast<size_t>(i)]) {
      ++differ;
      MESSAGE("x = " << v << ": " << int(mine) << " vs torch's " << int(codes[static_cast<size_t>(i)]));
    }
  }
  CHECK(differ == 0);
  // The round trip of every code that is a number.
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) CHECK(fp8_e4m3_encode(fp8_e4m3_decode(static_cast<uint8_t>(c))) == c);
}

TEST_CASE("fp8 e4m3: a KV-cache layer's codes at three scale rules equal torch's") {
  const auto g = read_json_file(test::quant_fixture("fp8_e4m3fn.json"));
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");
  int cases = 0;
  for (const auto& c : g["cases"]) {
    INFO(c["name"].get<std::string>());
    const auto s = c["shape"].get<std::vector<int64_t>>();
    const at::Tensor x = (c["tensor"] == "keys" ? keys : values).narrow(1, 0, s[1]).contiguous();  // [H, 64, D]
    at::Tensor scale = test::golden_floats(c["scale_f32"], c["scale_shape"].get<std::vector<int64_t>>());
    if (scale.dim() == 2) scale = scale.unsqueeze(-1);  // per (head, token)
    const at::Tensor mine = fp8_e4m3_encode(x / scale);  // float32 division, as torch
    const std::vector<uint8_t> theirs = test::base64(c["codes"]);
    REQUIRE(static_cast<int64_t>(theirs.size()) == mine.numel());
    int64_t differ = 0;
    for (int64_t i = 0; i < mine.numel(); ++i) differ += mine.data_ptr<uint8_t>()[i] != theirs[static_cast<size_t>(i)];
    CHECK(differ == 0);
    const at::Tensor back = fp8_e4m3_decode(mine) * scale;  // float32, as torch
    CHECK(back.to(at::kDouble).sum().item<double>() == doctest::Approx(c["dequant_sum"].get<double>()).epsilon(1e-9));
    ++cases;
  }
  CHECK(cases == 6);
}
