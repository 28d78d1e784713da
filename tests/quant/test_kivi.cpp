// KIVI (quant/kivi.h) against tests/fixtures/quant_golden/kivi.json, an independent Python
// transcription of the official code (jy-yuan/KIVI @ 876b4d2; data_scripts/make_quant_golden.py):
// after 200 tokens with G = 32 and R = 128, the quantized keys (the first 128 tokens, per channel)
// and values (the first 72, per token) at 2 and 4 bits, in float32 and in float16, have the golden's
// codes, scales and minimums bit for bit, and the dequantized sums match.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/quant/kivi.h"
#include "golden.h"

using namespace kvlab;

namespace {

// float32 values of a base64 float32 (f32) or float16-bits (f16) array.
at::Tensor params(const nlohmann::json& t, const std::string& name, bool half, const std::vector<int64_t>& shape) {
  return test::golden_floats(t[name + (half ? "_f16" : "_f32")].get<std::string>(), shape, half);
}

}  // namespace

TEST_CASE("kivi: keys per channel and values per token equal the transcription of the official code") {
  const auto g = read_json_file(test::quant_fixture("kivi.json"));
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");
  const std::vector<int64_t> shape = keys.sizes().vec();  // [H, T, D]
  int compared = 0;
  for (const auto& c : g["cases"]) {
    const bool half = c["dtype"] == "float16";
    const int64_t T = c["n_total"].get<int64_t>(), R = c["residual_length"].get<int64_t>(), G = c["group_size"].get<int64_t>();
    for (const bool is_keys : {true, false}) {
      INFO(c["name"].get<std::string>() << (is_keys ? " keys" : " values"));
      const auto& t = c[is_keys ? "keys" : "values"];
      const int bits = c[is_keys ? "k_bits" : "v_bits"].get<int>();
      const int64_t n = kivi_quantized_tokens(T, R, is_keys);
      REQUIRE(t["shape"].get<std::vector<int64_t>>() == std::vector<int64_t>{shape[0], n, shape[2]});
      const KiviBlock q = kivi_quantize((is_keys ? keys : values).narrow(1, 0, n).contiguous(), is_keys, bits, G, half);
      const std::vector<uint8_t> packed = test::base64(t["codes"]);
      int64_t differ = 0;
      for (int64_t i = 0; i < q.codes.numel(); ++i) {
        const int theirs = (packed[static_cast<size_t>(i * bits / 8)] >> ((i * bits) % 8)) & ((1 << bits) - 1);
        differ += q.codes.data_ptr<uint8_t>()[i] != theirs;
      }
      CHECK(differ == 0);
      const auto pshape = t["params_shape"].get<std::vector<int64_t>>();
      CHECK(at::equal(q.scale, params(t, "scale", half, pshape)));
      CHECK(at::equal(q.mn, params(t, "mn", half, pshape)));
      // Bytes: packed codes plus a scale and a minimum per group in the dtype (KIVI's b/8 + 4/G in
      // float16: 3 bits an element at 2 bits and G = 32).
      CHECK(kivi_bytes(q) == static_cast<int64_t>(packed.size()) + 2 * (half ? 2 : 4) * q.scale.numel());
      if (half) CHECK(kivi_bytes(q) * 8 == q.codes.numel() * (bits + 32 / G));
      CHECK(kivi_dequantize(q).to(at::kDouble).sum().item<double>() ==
            doctest::Approx(t["dequant_sum"].get<double>()).epsilon(1e-12));
      ++compared;
    }
  }
  CHECK(compared == 8);  // 2 bit widths x 2 dtypes x keys, values
  CHECK(kivi_quantized_tokens(200, 128, true) == 128);
  CHECK(kivi_quantized_tokens(200, 128, false) == 72);
  CHECK(kivi_quantized_tokens(100, 128, true) == 0);
  CHECK(kivi_quantized_tokens(100, 128, false) == 0);
}
