// optimum-quanto's affine group quantization (quant/affine.h) against transformers' QuantizedCache
// with the quanto backend: tests/fixtures/quant_golden/transformers_quanto.json
// (data_scripts/make_quant_golden.py; optimum-quanto 0.2.7, transformers 5.2.0). After the 64-token
// prefill the cache holds the prefill quantized as it came: kvlab's codes, scales and shifts of the
// same keys and values equal quanto's bit for bit, at 2 and 4 bits, with the default axes (groups of
// 64 consecutive elements: per token) and KIVI's (keys per channel over 32 tokens); the dequantized
// sums match. Beside it, a naive check of the bound: |x - x_hat| <= scale / 2 in every group.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/quant/affine.h"
#include "kvlab/quant/residual_cache.h"
#include "golden.h"

using namespace kvlab;


TEST_CASE("affine (quanto): a prefill's codes, scales and shifts equal transformers' QuantizedCache") {
  const auto g = read_json_file(test::quant_fixture("transformers_quanto.json"));
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");
  int compared = 0;
  for (const auto& c : g["cases"]) {
    const auto& state = c["states"][0];  // after the prefill: the prefill quantized as it came
    REQUIRE(state["after_token"] == c["n_prefill"]);
    for (const char* which : {"keys", "values"}) {
      const auto& t = state[which];
      INFO(c["name"].get<std::string>() << " " << which);
      const int bits = t["bits"].get<int>();
      const int64_t n = state["n_quantized"].get<int64_t>();
      const at::Tensor x = (std::string(which) == "keys" ? keys : values).narrow(1, 0, n).contiguous();
      const int axis = c[std::string(which) == "keys" ? "axis_key" : "axis_value"].get<int>();
      const AffineQuantized q =
          affine_quantize(x, bits, c["q_group_size"].get<int64_t>(), axis == 0 ? AffineGroups::flat : AffineGroups::channel);
      CHECK(t["group_index"] == (axis == 0 ? "flat_div_g" : "quanto_axis_last"));
      const std::vector<uint8_t> packed = test::base64(t["codes"]);
      // Bytes: the golden's packed codes (LSB first, the last byte partly filled) and a float32 scale
      // and shift per group; in float16, 2 bytes each: b/8 + 2p/g an element.
      CHECK(affine_bytes(q) == static_cast<int64_t>(packed.size()) + 8 * t["n_groups"].get<int64_t>());
      CHECK(affine_bytes(q, 2) * 8 == x.numel() * bits + x.numel() * 2 * 16 / c["q_group_size"].get<int64_t>());
      const std::vector<int> theirs = test::unpack_codes(packed, bits, x.numel());
      int64_t differ = 0;
      for (int64_t i = 0; i < x.numel(); ++i) differ += q.codes.data_ptr<uint8_t>()[i] != theirs[static_cast<size_t>(i)];
      CHECK(differ == 0);
      const std::vector<uint8_t> sb = test::base64(t["scale_f32"]), hb = test::base64(t["shift_f32"]);
      REQUIRE(static_cast<int64_t>(sb.size()) == 4 * q.scale.numel());
      CHECK(std::memcmp(sb.data(), q.scale.data_ptr<float>(), sb.size()) == 0);
      CHECK(std::memcmp(hb.data(), q.shift.data_ptr<float>(), hb.size()) == 0);
      const at::Tensor back = affine_dequantize(q);
      CHECK(back.to(at::kDouble).sum().item<double>() == doctest::Approx(t["dequant_sum"].get<double>()).epsilon(1e-12));
      // The bound of round-to-nearest: within half a step of the input, in every group.
      const at::Tensor step = q.scale.max();
      CHECK((back - x).abs().max().item<float>() <= step.item<float>() / 2 * (1 + 1e-5));
      ++compared;
    }
  }
  CHECK(compared == 8);  // 4 cases x keys, values
}

TEST_CASE("affine: a group of zero range dequantizes to its value; bad shapes are errors") {
  const at::Tensor x = at::full({2, 4, 8}, 1.5f);
  const AffineQuantized q = affine_quantize(x, 2, 8, AffineGroups::flat);
  CHECK(at::equal(affine_dequantize(q), x));
  CHECK(q.codes.max().item<int>() == 0);
  CHECK_THROWS_WITH_AS(affine_quantize(x, 3, 8, AffineGroups::flat), doctest::Contains("bits must be 2, 4 or 8"), Error);
  CHECK_THROWS_WITH_AS(affine_quantize(x, 2, 5, AffineGroups::flat), doctest::Contains("not whole groups of 5"), Error);
  CHECK_THROWS_WITH_AS(affine_quantize(x, 2, 3, AffineGroups::channel), doctest::Contains("8 rows of 8 channels"), Error);
}

// transformers' residual window (quant/residual_cache.h): a 64-token prefill, then 136 tokens one
// at a time. Every update returns the tokens still in the residual exactly as given; the 128th decode
// step (after token 192) flushes the prefill's dequantized part, the residual and the new token into
// one quantization, whose codes, scales and shifts equal the golden's state after the flush.
TEST_CASE("affine (quanto): the residual window's hand-off equals transformers' QuantizedCache") {
  const auto g = read_json_file(test::quant_fixture("transformers_quanto.json"));
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");
  int compared = 0;
  for (const auto& c : g["cases"]) {
    const int64_t n_prefill = c["n_prefill"].get<int64_t>(), n_total = c["n_total"].get<int64_t>();
    const int bits = c["nbits"].get<int>();
    const int64_t group = c["q_group_size"].get<int64_t>(), residual = c["residual_length"].get<int64_t>();
    for (const char* which : {"keys", "values"}) {
      INFO(c["name"].get<std::string>() << " " << which);
      const bool is_keys = std::string(which) == "keys";
      const at::Tensor x = is_keys ? keys : values;
      const int axis = c[is_keys ? "axis_key" : "axis_value"].get<int>();
      ResidualQuantized cache(bits, group, axis == 0 ? AffineGroups::flat : AffineGroups::channel, residual);
      cache.update(x.narrow(1, 0, n_prefill));
      for (int64_t t = n_prefill; t < n_total; ++t) {
        const at::Tensor seen = cache.update(x.narrow(1, t, 1));
        REQUIRE(seen.size(1) == t + 1);
        const int64_t r = cache.residual_tokens();
        CHECK(at::equal(seen.narrow(1, t + 1 - r, r), x.narrow(1, t + 1 - r, r)));  // the residual: exact
        for (const auto& state : c["states"]) {
          if (state["after_token"].get<int64_t>() != t + 1) continue;
          const auto& ts = state[which];
          REQUIRE(cache.quantized()->codes.size(1) == state["n_quantized"].get<int64_t>());
          const std::vector<int> theirs = test::unpack_codes(test::base64(ts["codes"]), bits, cache.quantized()->codes.numel());
          int64_t differ = 0;
          for (int64_t i = 0; i < cache.quantized()->codes.numel(); ++i)
            differ += cache.quantized()->codes.data_ptr<uint8_t>()[i] != theirs[static_cast<size_t>(i)];
          CHECK(differ == 0);
          const std::vector<uint8_t> sb = test::base64(ts["scale_f32"]), hb = test::base64(ts["shift_f32"]);
          REQUIRE(static_cast<int64_t>(sb.size()) == 4 * cache.quantized()->scale.numel());
          CHECK(std::memcmp(sb.data(), cache.quantized()->scale.data_ptr<float>(), sb.size()) == 0);
          CHECK(std::memcmp(hb.data(), cache.quantized()->shift.data_ptr<float>(), hb.size()) == 0);
          ++compared;
        }
      }
      CHECK(cache.residual_tokens() == n_total - 192);  // flushed after token 192; 8 wait since
    }
  }
  CHECK(compared == 8);  // 4 cases x keys, values at the flush (the prefill state is checked above)
}
