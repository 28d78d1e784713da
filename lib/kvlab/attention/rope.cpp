#include "kvlab/attention/rope.h"

#include <cmath>

#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// HF _compute_llama3_parameters, op for op in float32.
at::Tensor llama3_scale(const at::Tensor& inv_freq, const RopeScaling& rs) {
  const double factor = rs.factor;
  const double low = rs.low_freq_factor, high = rs.high_freq_factor;
  const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
  const double low_freq_wavelen = old_ctx / low;
  const double high_freq_wavelen = old_ctx / high;
  at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);             // [d/2]
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  at::Tensor smooth = ((wavelen.reciprocal() * old_ctx) - low) / (high - low);
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(is_medium, smoothed, scaled);
}

}  // namespace

nlohmann::json RopeScaling::to_json() const {
  if (kind == "none") return nullptr;
  nlohmann::json j = {{"rope_type", kind}, {"factor", factor}};
  if (kind == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
    j["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  return j;
}

RopeScaling rope_scaling_from_json(const nlohmann::json& j, const std::string& source) {
  RopeScaling out;
  if (j.is_null()) return out;
  KVLAB_CHECK(j.is_object(), "{}: 'rope_scaling' must be null or an object, found {}", source, j.dump());
  auto number = [&](const char* key) {
    KVLAB_CHECK(j.contains(key) && j[key].is_number(), "{} rope_scaling: '{}' must be a number, found {}",
                source, key, j.contains(key) ? j[key].dump() : "nothing");
    return j[key].get<double>();
  };
  auto text = [&](const char* key) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return "";
    KVLAB_CHECK(j[key].is_string(), "{} rope_scaling: '{}' must be a string, found {}", source, key, j[key].dump());
    return j[key].get<std::string>();
  };
  std::string kind = text("rope_type");
  if (kind.empty()) kind = text("type");
  if (kind.empty() || kind == "default") return out;
  if (kind == "linear") {
    out.kind = "linear";
    out.factor = number("factor");
  } else if (kind == "llama3") {
    out.kind = "llama3";
    out.factor = number("factor");
    out.low_freq_factor = number("low_freq_factor");
    out.high_freq_factor = number("high_freq_factor");
    const double ctx = number("original_max_position_embeddings");
    KVLAB_CHECK(ctx >= 1 && std::floor(ctx) == ctx,
                "{} rope_scaling: 'original_max_position_embeddings' must be a positive integer, found {}", source, ctx);
    out.original_max_position_embeddings = static_cast<int64_t>(ctx);
    KVLAB_CHECK(out.high_freq_factor != out.low_freq_factor,
                "{}: llama3 rope_scaling needs high_freq_factor != low_freq_factor (both {})", source,
                out.low_freq_factor);
  } else {
    KVLAB_FAIL("{}: rope_scaling type '{}' is not supported (supported: null, \"linear\", \"llama3\")", source,
               kind);
  }
  KVLAB_CHECK(out.factor > 0, "{}: rope_scaling.factor must be > 0, found {}", source, out.factor);
  return out;
}

at::Tensor rope_inv_freq(double theta, int64_t head_dim, const RopeScaling& rs) {
  const int64_t d = head_dim;
  // 1 / theta^(arange(0, d, 2) / d), as HF: int64 arange -> float32, pow with a scalar base.
  at::Tensor exponent = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv_freq = at::pow(theta, exponent).reciprocal();  // [d/2] float32
  if (rs.kind == "linear") {
    inv_freq = inv_freq / rs.factor;
  } else if (rs.kind == "llama3") {
    inv_freq = llama3_scale(inv_freq, rs);
  } else {
    TORCH_INTERNAL_ASSERT(rs.kind == "none", "unknown rope scaling ", rs.kind);
  }
  return inv_freq;
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t pos0, int64_t T,
                                               at::ScalarType dtype) {
  const at::ScalarType work = dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor pos = at::arange(pos0, pos0 + T, inv_freq.options().dtype(at::kLong)).to(work);  // [T]
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq.to(work).unsqueeze(0);  // [T, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, 1);                           // [T, d]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x [H, T, d]; cos, sin [T, d] broadcast over heads.
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);     // [H, T, d/2]
  at::Tensor x2 = x.narrow(-1, half, half);  // [H, T, d/2]
  at::Tensor rotated = at::cat({x2.neg(), x1}, -1);  // [H, T, d]
  return x * cos + rotated * sin;
}

at::Tensor rotate_by(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& inv_freq) {
  // x [H, n, d], delta [H, n]
  const int64_t d = x.size(-1);
  auto freqs = delta.to(x.device(), at::kDouble).unsqueeze(-1) *
               inv_freq.to(x.device(), at::kDouble).view({1, 1, d / 2});          // [H, n, d/2]
  auto emb = at::cat({freqs, freqs}, -1);                                        // [H, n, d]
  auto xd = x.to(at::kDouble);
  auto rotated = at::cat({xd.narrow(-1, d / 2, d / 2).neg(), xd.narrow(-1, 0, d / 2)}, -1);
  return (xd * emb.cos() + rotated * emb.sin()).to(x.scalar_type());
}

}  // namespace kvlab
