#include "kvlab/model/stored_matrix.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/core/simd.h"
#include "kvlab/io/gguf_dequant.h"

namespace kvlab {

namespace {

using namespace gguf_detail;

// F16 and BF16 in blocks of 32 (no scales: each weight converted on its own).
constexpr int64_t kPlainBlock = 32;
KVLAB_BLOCK_INLINE void decode_f16(const uint8_t* b, float* y) {
  for (int j = 0; j < kPlainBlock; ++j) y[j] = load_fp16(b + 2 * j);
}
KVLAB_BLOCK_INLINE void decode_bf16(const uint8_t* b, float* y) {
  for (int j = 0; j < kPlainBlock; ++j) {
    uint16_t h;
    std::memcpy(&h, b + 2 * j, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    std::memcpy(y + j, &bits, 4);
  }
}

// Rows [r0, r1) of y = x wᵀ: y [B, rows], x [B, cols], w's blocks of BS weights decoded by Decode.
// Per row, kSimdLanes partial sums per x row; each block is decoded into buf (L1) once and dotted
// with every x row. One x row keeps its partial sums in a register.
// Measured (2026-12-08, one thread, Xeon Sapphire Rapids, kvlab bench weights on SmolLM2's Q4_1):
// a pass over every matrix 20.7 ms against 41.9 ms in fp32. Dot products taken from the integers
// without writing the block out (d Σ q x + m Σ x) were slower as GCC 12 builds them (its SLP
// vectoriser left the byte-to-float conversions scalar: 63.9 ms; with the integers first written to
// a buffer, 32.5 ms), so each block is decoded whole, as the reference decoders do.
template <int64_t BS, void (*Decode)(const uint8_t*, float*)>
KVLAB_BLOCK_INLINE void rows_kernel(const StoredMatrix& w, const float* x, int64_t B, float* y, int64_t r0,
                                    int64_t r1) {
  const int64_t nb = w.cols / BS, rb = w.row_bytes(), bb = w.block_bytes, cols = w.cols, rows = w.rows;
  const uint8_t* base = w.data.data_ptr<uint8_t>();
  alignas(64) float buf[BS];
  if (B == 1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = base + r * rb;
      float lanes[kSimdLanes] = {};
      for (int64_t k = 0; k < nb; ++k) {
        Decode(wr + k * bb, buf);
        const float* xk = x + k * BS;
        for (int64_t c = 0; c < BS; c += kSimdLanes)
          for (int64_t l = 0; l < kSimdLanes; ++l) lanes[l] += buf[c + l] * xk[c + l];
      }
      float s = 0.f;
      for (int64_t l = 0; l < kSimdLanes; ++l) s += lanes[l];
      y[r] = s;
    }
    return;
  }
  std::vector<float> lanes(static_cast<size_t>(B * kSimdLanes));
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(lanes.begin(), lanes.end(), 0.f);
    const uint8_t* wr = base + r * rb;
    for (int64_t k = 0; k < nb; ++k) {
      Decode(wr + k * bb, buf);
      for (int64_t b = 0; b < B; ++b) {
        float* ln = lanes.data() + b * kSimdLanes;
        const float* xk = x + b * cols + k * BS;
        for (int64_t c = 0; c < BS; c += kSimdLanes)
          for (int64_t l = 0; l < kSimdLanes; ++l) ln[l] += buf[c + l] * xk[c + l];
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      float s = 0.f;
      for (int64_t l = 0; l < kSimdLanes; ++l) s += lanes[b * kSimdLanes + l];
      y[b * rows + r] = s;
    }
  }
}

using RowsFn = void (*)(const StoredMatrix&, const float*, int64_t, float*, int64_t, int64_t);

#if defined(__x86_64__) && defined(__GNUC__)
// Q5_0 by hand with AVX2 (Qwen2.5-Coder's Q4_K_M stores most matrices so): GCC left the reference
// decoder's fifth bit, a shift by a different amount in every lane, scalar (cache-hot 896x896: 0.44 ms
// against 0.08 in fp32). The same values as dequant_q5_0: ((q & 15) | 16·bit) − 16 as an integer,
// times d. The fifth bits as bytes: qh broadcast, byte j taken from qh's byte j/8 (a shuffle within
// each 128-bit lane, whose 32-bit groups all hold qh) and tested against bit j%8 (llama.cpp's
// bytes_from_bits_32).
__attribute__((target("avx2"))) inline void decode_q5_0_avx2(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));  // byte j: element j
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  hb = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit);  // 0xFF where bit j of qh is set
  q = _mm256_sub_epi8(_mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10))), _mm256_set1_epi8(16));
  const __m256 dv = _mm256_set1_ps(d);
  const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), dv));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), dv));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), dv));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), dv));
}
// Q8_0 likewise (Qwen's lm_head, 151,936 x 896, and SmolLM2's tied embedding): 32 int8 times d.
__attribute__((target("avx2"))) inline void decode_q8_0_avx2(const uint8_t* b, float* y) {
  const __m256 dv = _mm256_set1_ps(load_fp16(b));
  const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), dv));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), dv));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), dv));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), dv));
}
__attribute__((target("avx2,fma"))) void rows_q8_0_avx2(const StoredMatrix& w, const float* x, int64_t B, float* y,
                                                       int64_t r0, int64_t r1) {
  rows_kernel<32, decode_q8_0_avx2>(w, x, B, y, r0, r1);
}
__attribute__((target("avx2,fma"))) void rows_q5_0_avx2(const StoredMatrix& w, const float* x, int64_t B, float* y,
                                                       int64_t r0, int64_t r1) {
  rows_kernel<32, decode_q5_0_avx2>(w, x, B, y, r0, r1);
}
#endif

// One function per type, each built for AVX-512, AVX2 and the baseline (core/simd.h).
#define KVLAB_STORED_KERNEL(name, bs, decode)                                                          \
  KVLAB_CLONES void name(const StoredMatrix& w, const float* x, int64_t B, float* y, int64_t r0, int64_t r1) { \
    rows_kernel<bs, decode>(w, x, B, y, r0, r1);                                                        \
  }
KVLAB_STORED_KERNEL(rows_q4_0, 32, dequant_q4_0)
KVLAB_STORED_KERNEL(rows_q4_1, 32, dequant_q4_1)
KVLAB_STORED_KERNEL(rows_q5_0, 32, dequant_q5_0)
KVLAB_STORED_KERNEL(rows_q5_1, 32, dequant_q5_1)
KVLAB_STORED_KERNEL(rows_q8_0, 32, dequant_q8_0)
KVLAB_STORED_KERNEL(rows_q2_k, 256, dequant_q2_k)
KVLAB_STORED_KERNEL(rows_q3_k, 256, dequant_q3_k)
KVLAB_STORED_KERNEL(rows_q4_k, 256, dequant_q4_k)
KVLAB_STORED_KERNEL(rows_q5_k, 256, dequant_q5_k)
KVLAB_STORED_KERNEL(rows_q6_k, 256, dequant_q6_k)
KVLAB_STORED_KERNEL(rows_f16, kPlainBlock, decode_f16)
KVLAB_STORED_KERNEL(rows_bf16, kPlainBlock, decode_bf16)
#undef KVLAB_STORED_KERNEL

RowsFn rows_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return rows_q4_0;
    case GgmlType::Q4_1: return rows_q4_1;
    case GgmlType::Q5_0:
#if defined(__x86_64__) && defined(__GNUC__)
      if (__builtin_cpu_supports("avx2")) return rows_q5_0_avx2;
#endif
      return rows_q5_0;
    case GgmlType::Q5_1: return rows_q5_1;
    case GgmlType::Q8_0:
#if defined(__x86_64__) && defined(__GNUC__)
      if (__builtin_cpu_supports("avx2")) return rows_q8_0_avx2;
#endif
      return rows_q8_0;
    case GgmlType::Q2_K: return rows_q2_k;
    case GgmlType::Q3_K: return rows_q3_k;
    case GgmlType::Q4_K: return rows_q4_k;
    case GgmlType::Q5_K: return rows_q5_k;
    case GgmlType::Q6_K: return rows_q6_k;
    case GgmlType::F16: return rows_f16;
    case GgmlType::BF16: return rows_bf16;
    default: return nullptr;
  }
}

// Weights and bytes per block as a StoredMatrix holds them.
std::pair<int64_t, int64_t> block_shape(GgmlType t) {
  if (t == GgmlType::F16 || t == GgmlType::BF16) return {kPlainBlock, 2 * kPlainBlock};
  return {block_elems(t), block_bytes(t)};
}

}  // namespace

bool stored_applies(GgmlType type, int64_t cols) {
  const int64_t be = block_shape(type).first;
  return rows_fn(type) != nullptr && be > 0 && cols > 0 && cols % be == 0;
}

StoredMatrix stored_matrix(const GgufTensorInfo& info) {
  KVLAB_CHECK(info.shape.size() == 2, "tensor '{}': weights as stored need a matrix, found {} dimensions", info.name,
              info.shape.size());
  KVLAB_CHECK(stored_applies(info.type, info.shape[1]),
              "tensor '{}': ggml type {} with {} columns cannot be used as stored (give --weights fp32)", info.name,
              ggml_type_name(info.type), info.shape[1]);
  StoredMatrix m;
  m.type = info.type;
  m.rows = info.shape[0];
  m.cols = info.shape[1];
  std::tie(m.block_elems, m.block_bytes) = block_shape(info.type);
  KVLAB_CHECK(static_cast<size_t>(m.nbytes()) == info.nbytes, "tensor '{}': {} bytes for a {}x{} {} matrix, expected {}",
              info.name, info.nbytes, m.rows, m.cols, ggml_type_name(info.type), m.nbytes());
  m.data = at::empty({m.rows, m.row_bytes()}, at::TensorOptions().dtype(at::kByte));  // [rows, row_bytes]
  if (info.nbytes) std::memcpy(m.data.data_ptr<uint8_t>(), info.data, info.nbytes);
  return m;
}

StoredMatrix StoredMatrix::take_rows(const at::Tensor& idx) const {
  StoredMatrix m = *this;
  m.data = data.index_select(0, idx.to(at::kLong)).contiguous();
  m.rows = idx.size(0);
  return m;
}

StoredMatrix StoredMatrix::narrow_rows(int64_t start, int64_t n) const {
  StoredMatrix m = *this;
  m.data = data.narrow(0, start, n);  // contiguous: whole rows of a contiguous [rows, row_bytes]
  m.rows = n;
  return m;
}

StoredMatrix stored_cat(const std::vector<const StoredMatrix*>& parts) {
  KVLAB_CHECK(!parts.empty(), "stored_cat: no matrices");
  StoredMatrix m = *parts[0];
  std::vector<at::Tensor> datas;
  m.rows = 0;
  for (const StoredMatrix* p : parts) {
    KVLAB_CHECK(p->type == m.type && p->cols == m.cols, "stored_cat: {} x {} {} beside {} x {} {}", p->rows, p->cols,
                ggml_type_name(p->type), parts[0]->rows, m.cols, ggml_type_name(m.type));
    datas.push_back(p->data);
    m.rows += p->rows;
  }
  m.data = at::cat(datas, 0);
  return m;
}

at::Tensor StoredMatrix::dequantize() const {
  // The loader's own dequantization (gguf.cpp: the F16/BF16 copy, the block decoders over the threads)
  // on a view of these bytes, which are laid out as the file's.
  const at::Tensor bytes = data.contiguous();
  GgufTensorInfo view;
  view.name = "stored matrix";
  view.type = type;
  view.shape = {rows, cols};
  view.ne = {cols, rows};
  view.numel = rows * cols;
  view.nbytes = static_cast<size_t>(nbytes());
  view.data = bytes.data_ptr<uint8_t>();
  return gguf_dequantize(view);  // [rows, cols] float32
}

at::Tensor stored_linear(const at::Tensor& x, const StoredMatrix& w) {
  KVLAB_CHECK(w.defined(), "stored_linear: an empty matrix");
  KVLAB_CHECK(x.dim() == 2 && x.size(1) == w.cols && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "stored_linear: x must be [B, {}] float32 on the CPU, found {} dimensions of width {} ({})", w.cols,
              x.dim(), x.dim() > 0 ? x.size(-1) : 0, c10::toString(x.scalar_type()));
  const RowsFn fn = rows_fn(w.type);
  KVLAB_CHECK(fn, "stored_linear: no kernel for {}", ggml_type_name(w.type));
  const at::Tensor xc = x.contiguous();
  const int64_t B = xc.size(0);
  at::Tensor y = at::empty({B, w.rows}, xc.options());  // [B, rows]
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, w.rows, 32, [&](int64_t r0, int64_t r1) { fn(w, xp, B, yp, r0, r1); });
  return y;
}

at::Tensor stored_linear_reference(const at::Tensor& x, const StoredMatrix& w) {
  return at::mm(x.to(at::kFloat), w.dequantize().t());  // [B, rows]
}

}  // namespace kvlab
