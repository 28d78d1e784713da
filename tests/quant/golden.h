// Reading tests/fixtures/quant_golden/ (data_scripts/make_quant_golden.py; its "format" field):
// base64 of little-endian arrays (float32, float16 bits, bytes), codes packed LSB first.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/core/config.h"
#include "test_util.h"

namespace kvlab::test {

inline std::string quant_fixture(const std::string& name) { return fixtures_dir() + "/quant_golden/" + name; }

inline std::vector<uint8_t> base64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> out;
  int bits = 0, acc = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) continue;  // '=' padding
    acc = ((acc << 6) | v) & 0xFFFFFF, bits += 6;
    if (bits >= 8) bits -= 8, out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
  }
  return out;
}

// A float32 tensor from base64 float32 bytes, or (half) from float16 bits.
inline at::Tensor golden_floats(const std::string& b64, const std::vector<int64_t>& shape, bool half = false) {
  std::vector<uint8_t> bytes = base64(b64);
  if (half) return at::from_blob(bytes.data(), shape, at::kShort).clone().view(at::kHalf).to(at::kFloat);
  return at::from_blob(bytes.data(), shape, at::kFloat).clone();
}

// inputs.json's layer ("keys" or "values"), [H, T, D] float32 (float16-exact values).
inline at::Tensor golden_layer(const std::string& which) {
  const auto in = read_json_file(quant_fixture("inputs.json"));
  return golden_floats(in[which + "_f16"].get<std::string>(), in["shape"].get<std::vector<int64_t>>(), true);
}

// Code i of `bits` bits: byte (i * bits) / 8, from bit (i * bits) % 8, lowest bits first.
inline std::vector<int> unpack_codes(const std::vector<uint8_t>& bytes, int bits, int64_t n) {
  std::vector<int> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = (bytes[static_cast<size_t>(i * bits / 8)] >> ((i * bits) % 8)) & ((1 << bits) - 1);
  return out;
}

}  // namespace kvlab::test
