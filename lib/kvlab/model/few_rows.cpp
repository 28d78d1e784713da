#include "kvlab/model/few_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "kvlab/core/check.h"
#include "kvlab/core/simd.h"

namespace kvlab {

namespace {

constexpr int64_t kRows = 4;  // weight rows per block: each x load feeds four of them

// y[b, n] = Σ_c x[b, c] w[n, c] + bias[n] for n in [n0, n1) and every b < B. x [B, K], w [N, K],
// y [B, N], all row-major; bias may be null.
KVLAB_CLONES void few_rows_kernel(const float* x, int64_t B, int64_t K, const float* w, int64_t n0, int64_t n1,
                                  const float* bias, float* y, int64_t N) {
  const int64_t kv = K / kSimdLanes * kSimdLanes;
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) {
    const float* w0 = w + n * K;
    const float* w1 = w0 + K;
    const float* w2 = w1 + K;
    const float* w3 = w2 + K;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * K;
      float a0[kSimdLanes] = {}, a1[kSimdLanes] = {}, a2[kSimdLanes] = {}, a3[kSimdLanes] = {};
      for (int64_t c = 0; c < kv; c += kSimdLanes)
        for (int64_t l = 0; l < kSimdLanes; ++l) {
          const float xv = xb[c + l];
          a0[l] += w0[c + l] * xv;
          a1[l] += w1[c + l] * xv;
          a2[l] += w2[c + l] * xv;
          a3[l] += w3[c + l] * xv;
        }
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t l = 0; l < kSimdLanes; ++l) s0 += a0[l], s1 += a1[l], s2 += a2[l], s3 += a3[l];
      for (int64_t c = kv; c < K; ++c) s0 += w0[c] * xb[c], s1 += w1[c] * xb[c], s2 += w2[c] * xb[c], s3 += w3[c] * xb[c];
      float* yb = y + b * N + n;
      yb[0] = s0 + (bias ? bias[n] : 0.f);
      yb[1] = s1 + (bias ? bias[n + 1] : 0.f);
      yb[2] = s2 + (bias ? bias[n + 2] : 0.f);
      yb[3] = s3 + (bias ? bias[n + 3] : 0.f);
    }
  }
  for (; n < n1; ++n) {  // the last rows of the range, one at a time
    const float* wr = w + n * K;
    for (int64_t b = 0; b < B; ++b) y[b * N + n] = dot_lanes(wr, x + b * K, K) + (bias ? bias[n] : 0.f);
  }
}

bool cpu_float_contiguous(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

}  // namespace

bool few_rows_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!cpu_float_contiguous(x) || !cpu_float_contiguous(w) || x.dim() != 2 || w.dim() != 2) return false;
  if (x.size(0) < 2 || x.size(0) > kFewRowsMax || x.size(1) != w.size(1) || x.size(1) == 0) return false;
  return !b.defined() || (cpu_float_contiguous(b) && b.dim() == 1 && b.size(0) == w.size(0));
}

at::Tensor few_rows_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  KVLAB_CHECK(few_rows_applies(x, w, b), "few_rows_linear: needs CPU float32 contiguous x [B, K] with 2 <= B <= {}, "
              "w [N, K] and b [N] or none; got x {}, w {}", kFewRowsMax, x.sizes().vec(), w.sizes().vec());
  const int64_t B = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor y = at::empty({B, N}, x.options());  // [B, N]
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Blocks of kRows weight rows; a thread takes at least 64 blocks (~600 KB of SmolLM2's weights).
  const int64_t blocks = (N + kRows - 1) / kRows;
  at::parallel_for(0, blocks, 64, [&](int64_t s, int64_t e) {
    few_rows_kernel(xp, B, K, wp, s * kRows, std::min(N, e * kRows), bp, yp, N);
  });
  return y;
}

}  // namespace kvlab
