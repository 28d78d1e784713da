// The quantizers as a cache drives them (quant/kv_quantizer.h through quantized_part.h's
// settle_quantized: a prefill, then one token a step) against the references' own states
// (tests/fixtures/quant_golden/): transformers' QuantizedCache with the quanto backend at its default
// axes for int2/int4 (after the 64-token prefill and after the flush at token 192), and the KIVI
// transcription for kivi2/kivi4 at float32 (its checkpoints at T = 127, 128, 129 and 200 after a
// 100-token prefill). Compared: how many entries are quantized, the sum and sum of squares of the
// dequantized part (float64, the reference's to 1e-12) and its first 64 values bit for bit. A
// changed group, axis or window makes them fail (the quanto cases at KIVI's axes are not int*'s
// and are skipped by name).
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <cstring>
#include <functional>

#include "golden.h"
#include "kvlab/quant/kv_quantizer.h"
#include "kvlab/quant/quantized_part.h"

using namespace kvlab;

namespace {

// The first quantized entries of x [H, T, D], flat: its sum, sum of squares and first 64 values
// against a reference tensor's record.
void check_dequantized(const at::Tensor& held, int64_t n_quantized, const nlohmann::json& ref) {
  const at::Tensor q = held.narrow(1, 0, n_quantized).contiguous();
  CHECK(q.to(at::kDouble).sum().item<double>() == doctest::Approx(ref["dequant_sum"].get<double>()).epsilon(1e-12));
  CHECK(q.to(at::kDouble).pow(2).sum().item<double>() ==
        doctest::Approx(ref["dequant_sumsq"].get<double>()).epsilon(1e-12));
  const std::vector<uint8_t> head = test::base64(ref["dequant_head_f32"]);
  REQUIRE(head.size() == 64 * 4);
  CHECK(std::memcmp(head.data(), q.data_ptr<float>(), head.size()) == 0);
}

// Drives q over the golden layer as transformers' QuantizedCache was driven for case c (a prefill
// of n_prefill tokens, then one token a step up to n_total) and calls check(state, keys, values,
// part) at each of the case's states; returns the quantized part at the end.
QuantizedPart drive_states(
    const nlohmann::json& c, const KvQuantizer& q,
    const std::function<void(const nlohmann::json&, const at::Tensor&, const at::Tensor&, const QuantizedPart&)>& check) {
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");  // [H, 200, D]
  const int64_t n_prefill = c["n_prefill"].get<int64_t>(), n_total = c["n_total"].get<int64_t>();
  at::Tensor k = keys.narrow(1, 0, n_prefill).clone(), v = values.narrow(1, 0, n_prefill).clone();
  QuantizedPart part;
  settle_quantized(k, v, part, q, 0);
  for (int64_t t = n_prefill;; ++t) {
    for (const auto& state : c["states"])
      if (state["after_token"].get<int64_t>() == t) check(state, k, v, part);
    if (t == n_total) break;
    k = at::cat({k, keys.narrow(1, t, 1)}, 1);
    v = at::cat({v, values.narrow(1, t, 1)}, 1);
    settle_quantized(k, v, part, q, t);
  }
  return part;
}

}  // namespace

TEST_CASE("int2/int4 driven as a cache equal transformers' QuantizedCache (quanto, default axes)") {
  const auto g = read_json_file(test::quant_fixture("transformers_quanto.json"));
  int compared = 0;
  for (const auto& c : g["cases"]) {
    if (c["axis_key"].get<int>() != 0 || c["axis_value"].get<int>() != 0) continue;  // KIVI's axes: not int*
    INFO(c["name"].get<std::string>());
    const auto q = make_quantizer(fmt::format("int{}.g{}.r{}", c["nbits"].get<int>(), c["q_group_size"].get<int64_t>(),
                                              c["residual_length"].get<int64_t>()));
    const QuantizedPart end = drive_states(c, *q, [&](const nlohmann::json& state, const at::Tensor& k,
                                                     const at::Tensor& v, const QuantizedPart& part) {
      CHECK(part.keys == state["n_quantized"].get<int64_t>());
      CHECK(part.values == state["n_quantized"].get<int64_t>());
      check_dequantized(k, part.keys, state["keys"]);
      check_dequantized(v, part.values, state["values"]);
      ++compared;
    });
    CHECK(end.keys == 192);  // flushed after token 192; 8 wait since
  }
  CHECK(compared == 4);  // 2 bit widths x (the prefill, the flush)
}

TEST_CASE("kivi2/kivi4 driven as a cache equal the KIVI transcription (float32)") {
  const auto g = read_json_file(test::quant_fixture("kivi.json"));
  const at::Tensor keys = test::golden_layer("keys"), values = test::golden_layer("values");
  int compared = 0;
  for (const auto& c : g["cases"]) {
    if (c["dtype"] != "float32") continue;  // kvlab's cache is float32
    INFO(c["name"].get<std::string>());
    REQUIRE(c["k_bits"] == c["v_bits"]);
    const auto q = make_quantizer(fmt::format("kivi{}.g{}.r{}", c["k_bits"].get<int>(), c["group_size"].get<int64_t>(),
                                              c["residual_length"].get<int64_t>()));
    const int64_t n_prefill = 100, n_total = c["n_total"].get<int64_t>();
    at::Tensor k = keys.narrow(1, 0, n_prefill).clone(), v = values.narrow(1, 0, n_prefill).clone();
    QuantizedPart part;
    settle_quantized(k, v, part, *q, 0);
    for (int64_t t = n_prefill; t < n_total; ++t) {
      k = at::cat({k, keys.narrow(1, t, 1)}, 1);
      v = at::cat({v, values.narrow(1, t, 1)}, 1);
      settle_quantized(k, v, part, *q, t);
      for (const auto& cp : c["checkpoints_prefill_100"]) {
        if (cp["T"].get<int64_t>() != t + 1) continue;
        CHECK(part.keys == cp["keys_quantized"].get<int64_t>());
        CHECK(part.values == cp["values_quantized"].get<int64_t>());
      }
    }
    check_dequantized(k, part.keys, c["keys"]);
    check_dequantized(v, part.values, c["values"]);
    // The full-precision rest is the input.
    CHECK(at::equal(k.narrow(1, part.keys, n_total - part.keys), keys.narrow(1, part.keys, n_total - part.keys)));
    CHECK(at::equal(v.narrow(1, part.values, n_total - part.values), values.narrow(1, part.values, n_total - part.values)));
    ++compared;
  }
  CHECK(compared == 2);
}

TEST_CASE("hqq2/4/8 driven as a cache: transformers' QuantizedCache (hqq backend, axis 1) within its tolerance") {
  // transformers re-quantizes the whole cache at the flush; kvlab quantizes the block leaving the
  // residual alone. Per-group zero updates are independent, so the two agree where the optimiser
  // runs the same number of steps (docs/quantization.md §1, §3).
  const auto g = read_json_file(test::quant_fixture("transformers_hqq.json"));
  int compared = 0;
  for (const auto& c : g["cases"]) {
    if (c["axis_key"].get<int>() != 1 || c["axis_value"].get<int>() != 1) continue;  // axis 0: not hqq*
    INFO(c["name"].get<std::string>());
    const auto q = make_quantizer(fmt::format("hqq{}.g{}.r{}", c["nbits"].get<int>(), c["q_group_size"].get<int64_t>(),
                                              c["residual_length"].get<int64_t>()));
    drive_states(c, *q, [&](const nlohmann::json& state, const at::Tensor& k, const at::Tensor& v,
                            const QuantizedPart& part) {
      CHECK(part.keys == state["n_quantized"].get<int64_t>());
      for (const bool is_keys : {true, false}) {
        const auto& ts = state[is_keys ? "keys" : "values"];
        const at::Tensor held = (is_keys ? k : v).narrow(1, 0, part.keys);
        const double sum = held.to(at::kDouble).sum().item<double>();
        const std::string which = std::string(is_keys ? "keys" : "values") + " after token " +
                                  std::to_string(state["after_token"].get<int64_t>());
        INFO(which);
        // Elements agree to ~1e-5 (test_hqq.cpp): their sum over 8k to 25k elements to 1e-4.
        CHECK(sum == doctest::Approx(ts["dequant_sum"].get<double>()).epsilon(1e-4));
        const std::vector<uint8_t> head = test::base64(ts["dequant_head_f32"]);
        const at::Tensor theirs = at::from_blob(const_cast<uint8_t*>(head.data()), {64}, at::kFloat).clone();
        CHECK((held.reshape({-1}).narrow(0, 0, 64) - theirs).abs().max().item<double>() <= 4e-4);
      }
      ++compared;
    });
  }
  CHECK(compared == 6);  // 3 bit widths x (the prefill, the flush)
}
