#include "kvlab/quant/kv_quantizer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <regex>

#include "kvlab/core/check.h"
#include "kvlab/quant/affine.h"
#include "kvlab/quant/fp8.h"
#include "kvlab/quant/hqq.h"
#include "kvlab/quant/kivi.h"

namespace kvlab {
namespace {

struct Settings {
  std::string name;
  int bits = 0;
  int64_t group = 0, residual = 0;
};

nlohmann::json describe_settings(const Settings& s, const char* scheme) {
  return {{"scheme", scheme}, {"bits", s.bits}, {"group", s.group}, {"residual", s.residual}};
}

// KIVI (arXiv 2402.02750; jy-yuan/KIVI models/llama_kivi.py): docs/quantization.md §5.
class Kivi final : public KvQuantizer {
 public:
  explicit Kivi(Settings s) : s_(std::move(s)) {}
  std::string name() const override { return s_.name; }
  nlohmann::json describe() const override { return describe_settings(s_, "kivi"); }
  int64_t quantized_after(int64_t quantized, int64_t, int64_t t, bool keys) const override {
    return std::max(quantized, kivi_quantized_tokens(t, s_.residual, keys));
  }
  at::Tensor round_trip(const at::Tensor& x, bool keys, int64_t* bytes) const override {
    const KiviBlock q = kivi_quantize(x.contiguous(), keys, s_.bits, s_.group, /*half=*/false);
    *bytes += kivi_bytes(q);
    return kivi_dequantize(q);
  }
  int64_t stored_bytes(int64_t n, int64_t H, int64_t D, bool keys) const override {
    const int64_t groups = keys ? H * D * (n / s_.group) : H * n * (D / s_.group);
    return (H * n * D * s_.bits + 7) / 8 + groups * 2 * 4;
  }
  void check_head_dim(int64_t D) const override {
    KVLAB_CHECK(D % s_.group == 0, "{}: values are quantized per token in groups of {} channels; the model's "
                "head_dim {} is not a multiple (give a group that divides it, e.g. '{}.g{}')",
                s_.name, s_.group, D, s_.name, std::gcd(D, s_.group));
  }

 private:
  Settings s_;
};

// transformers' QuantizedCache residual rule (§1): the prefill quantized whole; then the residual
// (tokens after the quantized part) before a step's tokens, once it holds R - 1, makes the step's
// update quantize everything (cache_utils.py: len(Rb) + 1 >= R; never while it is empty).
int64_t residual_flush(int64_t quantized, int64_t t_before, int64_t t_after, int64_t residual) {
  if (t_before == 0) return t_after;
  const int64_t waiting = t_before - quantized;
  return waiting > 0 && waiting + 1 >= residual ? t_after : quantized;
}

// transformers' QuantizedCache with groups of G consecutive elements of one token and its residual
// flush: the quanto backend at its default axes (§1, §2), or the HQQ backend at axis 1 (§3; not its
// default axis 0, whose groups mix tokens and heads and are re-formed at every flush). With HQQ
// each block leaving the residual is optimised alone (transformers re-quantizes the whole cache at
// a flush: old values then move by ~1e-6, §1).
class PerTokenGroups final : public KvQuantizer {
 public:
  PerTokenGroups(Settings s, bool hqq) : s_(std::move(s)), hqq_(hqq) {}
  std::string name() const override { return s_.name; }
  nlohmann::json describe() const override { return describe_settings(s_, hqq_ ? "hqq_axis1" : "quanto"); }
  int64_t quantized_after(int64_t quantized, int64_t t_before, int64_t t_after, bool) const override {
    return residual_flush(quantized, t_before, t_after, s_.residual);
  }
  at::Tensor round_trip(const at::Tensor& x, bool, int64_t* bytes) const override {
    if (hqq_) {
      const HqqQuantized q = hqq_quantize(x.contiguous(), s_.bits, s_.group, HqqGroups::rows);
      *bytes += hqq_bytes(q, 4);
      return hqq_dequantize(q);
    }
    const AffineQuantized q = affine_quantize(x.contiguous(), s_.bits, s_.group, AffineGroups::flat);
    *bytes += affine_bytes(q, 4);
    return affine_dequantize(q);
  }
  int64_t stored_bytes(int64_t n, int64_t H, int64_t D, bool) const override {
    return (H * n * D * s_.bits + 7) / 8 + (H * n * D / s_.group) * 2 * 4;
  }
  void check_head_dim(int64_t D) const override {
    KVLAB_CHECK(D % s_.group == 0, "{}: groups of {} consecutive elements of one token; the model's head_dim {} "
                "is not a multiple (give a group that divides it, e.g. '{}.g{}')",
                s_.name, s_.group, D, s_.name, std::gcd(D, s_.group));
  }

 private:
  Settings s_;
  bool hqq_;
};

// FP8 E4M3 with a per-(head, token) scale amax / 448 (§4).
class Fp8 final : public KvQuantizer {
 public:
  explicit Fp8(Settings s) : s_(std::move(s)) {}
  std::string name() const override { return s_.name; }
  nlohmann::json describe() const override { return describe_settings(s_, "fp8_e4m3"); }
  int64_t quantized_after(int64_t quantized, int64_t, int64_t t_after, bool) const override {
    return std::max(quantized, t_after - s_.residual);
  }
  at::Tensor round_trip(const at::Tensor& x, bool, int64_t* bytes) const override {
    const at::Tensor xf = x.contiguous().to(at::kFloat);                             // [H, n, D]
    at::Tensor scale = std::get<0>(xf.abs().max(2, /*keepdim=*/true)) / 448.0f;       // [H, n, 1]
    scale = at::where(scale > 0, scale, at::ones_like(scale));
    *bytes += xf.numel() + scale.numel() * 4;
    return fp8_e4m3_decode(fp8_e4m3_encode(xf / scale)) * scale;
  }
  int64_t stored_bytes(int64_t n, int64_t H, int64_t D, bool) const override { return H * n * D + H * n * 4; }
  void check_head_dim(int64_t) const override {}

 private:
  Settings s_;
};

const char* kSchemes = "kivi2, kivi4, int2, int4, int8, hqq2, hqq4, hqq8, fp8 (each optionally .r<R> and .g<G>)";

}  // namespace

std::shared_ptr<const KvQuantizer> make_quantizer(const std::string& name, const std::string& flag) {
  static const std::regex re(R"(^(kivi|int|hqq|fp)(\d+)((?:\.[rg]\d+)*)$)");
  std::smatch m;
  KVLAB_CHECK(std::regex_match(name, m, re), "{}: unknown quantizer '{}'; known: {}", flag, name, kSchemes);
  const std::string scheme = m[1];
  Settings s;
  s.name = name;
  s.bits = std::stoi(m[2].str());
  if (scheme == "kivi") s.group = 32, s.residual = 128;
  if (scheme == "int" || scheme == "hqq") s.group = 64, s.residual = 128;
  const std::string tail = m[3];
  static const std::regex opt(R"(\.([rg])(\d+))");
  for (auto it = std::sregex_iterator(tail.begin(), tail.end(), opt); it != std::sregex_iterator(); ++it) {
    const int64_t v = std::stoll((*it)[2].str());
    ((*it)[1] == "r" ? s.residual : s.group) = v;
  }
  if (scheme == "fp") {
    KVLAB_CHECK(s.bits == 8, "{}: '{}': the FP8 scheme is fp8 (E4M3); known: {}", flag, name, kSchemes);
    KVLAB_CHECK(s.group == 0, "{}: '{}': fp8 scales per (head, token) and takes no group", flag, name);
    return std::make_shared<Fp8>(s);
  }
  if (scheme == "kivi") {
    KVLAB_CHECK(s.bits == 2 || s.bits == 4, "{}: '{}': KIVI quantizes to 2 or 4 bits", flag, name);
    KVLAB_CHECK(s.group >= 1 && s.residual >= s.group && s.residual % s.group == 0,
                "{}: '{}': KIVI's window R must be a positive multiple of its group G (keys leave it in whole "
                "groups), found R = {}, G = {}", flag, name, s.residual, s.group);
    return std::make_shared<Kivi>(s);
  }
  KVLAB_CHECK(s.bits == 2 || s.bits == 4 || s.bits == 8, "{}: '{}': the integer cache has 2, 4 or 8 bits", flag, name);
  KVLAB_CHECK(s.group >= 1 && s.residual >= 2, "{}: '{}': the group must be >= 1 and the residual >= 2 "
              "(transformers' shortest flush cycle), found G = {}, R = {}", flag, name, s.group, s.residual);
  return std::make_shared<PerTokenGroups>(s, /*hqq=*/scheme == "hqq");
}

std::vector<QuantizerInfo> quantizer_list() {
  return {
      {"kivi2, kivi4", "KIVI: keys per channel (groups of 32 tokens), values per token (groups of 32), the "
                       "newest 128 in full precision"},
      {"int2, int4, int8", "transformers' QuantizedCache (quanto): per token in groups of 64, prefill "
                           "quantized whole, decoded tokens flushed every 128"},
      {"hqq2, hqq4, hqq8", "transformers' QuantizedCache (HQQ, axis 1): per token in groups of 64, the zero "
                           "point optimised (half-quadratic), flushed as int*"},
      {"fp8", "FP8 E4M3 with a float32 scale per (head, token)"},
  };
}

}  // namespace kvlab
