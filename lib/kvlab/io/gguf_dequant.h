// ggml's block formats (Q4_0 … Q8_0, Q2_K … Q6_K) decoded to float32, one block at a time; the
// layouts follow ggml-quants.c and are checked against gguf-py's numpy dequantizers
// (tests/io). gguf.cpp dequantizes whole tensors with them at load; model/stored_matrix.cpp decodes
// one block at a time inside its matrix kernels (issue 51), which is why they are inline here:
// always inlined, they take the instruction set of the KVLAB_CLONES function that calls them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvlab/io/gguf.h"

#define KVLAB_BLOCK_INLINE __attribute__((always_inline)) inline

namespace kvlab::gguf_detail {

// Decodes one block of `t` (block_size elements, type_size bytes; gguf.cpp's type table) at `b`
// into `y`.
using BlockFn = void (*)(const uint8_t* b, float* y);

// The block decoder of a quantized type, or nullptr when kvlab has none (F32/F16/BF16 are not
// block types: gguf_dequantize copies them).
BlockFn block_dequantizer(GgmlType t);

// Elements and bytes per block of `t` (ggml's type_traits; 1 and the element size for F32/F16/BF16),
// 0 for a type kvlab does not know.
int64_t block_elems(GgmlType t);
int64_t block_bytes(GgmlType t);

KVLAB_BLOCK_INLINE float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24
      const float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

KVLAB_BLOCK_INLINE float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Q4_0: {fp16 d; u8 qs[16]} -> 32 values; x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
KVLAB_BLOCK_INLINE void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: {fp16 d; fp16 m; u8 qs[16]}; x = d * q + m with q the unsigned nibble.
KVLAB_BLOCK_INLINE void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_fp16(b), m = load_fp16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0: {fp16 d; u8 qh[4]; u8 qs[16]}; 5th bit of element j is bit j of qh (j < 32).
KVLAB_BLOCK_INLINE void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int xh0 = ((qh >> j) << 4) & 0x10;
    const int xh1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
  }
}

// Q5_1: {fp16 d; fp16 m; u8 qh[4]; u8 qs[16]}; x = d * q + m.
KVLAB_BLOCK_INLINE void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_fp16(b), m = load_fp16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int xh0 = ((qh >> j) << 4) & 0x10;
    const int xh1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
  }
}

// Q8_0: {fp16 d; i8 qs[32]}; x = d * q.
KVLAB_BLOCK_INLINE void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q4_K: {fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]} -> 256 values in 8 sub-blocks of 32 with
// 6-bit scales and mins packed in `scales` (ggml's get_scale_min_k4).
KVLAB_BLOCK_INLINE void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

KVLAB_BLOCK_INLINE void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b), dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d} -> 256 values, 6 bits each, 16 scales.
// In halves of 16 weights, one scale each, so that the loops vectorise (3.4x faster in
// stored_linear than with the scale looked up per weight; the same values).
KVLAB_BLOCK_INLINE void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_fp16(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int is = 0; is < 2; ++is) {
      const float s1 = d * static_cast<float>(sc[is]), s2 = d * static_cast<float>(sc[is + 2]);
      const float s3 = d * static_cast<float>(sc[is + 4]), s4 = d * static_cast<float>(sc[is + 6]);
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * is + i;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = s1 * static_cast<float>(q1);
        y[l + 32] = s2 * static_cast<float>(q2);
        y[l + 64] = s3 * static_cast<float>(q3);
        y[l + 96] = s4 * static_cast<float>(q4);
      }
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q5_K: {fp16 d; fp16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K plus a 5th bit from qh.
KVLAB_BLOCK_INLINE void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b), dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  unsigned u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

// Q2_K: {u8 scales[16]; u8 qs[64]; fp16 d; fp16 dmin}: 2-bit values, 4-bit scale and min per 16.
KVLAB_BLOCK_INLINE void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = load_fp16(b + 80), dmin = load_fp16(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
      shift += 2;
    }
    q += 32;
  }
}

// Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; fp16 d}: 2 low bits in qs, the high bit in hmask
// (set = no offset, clear = -4), sixteen 6-bit scales (offset 32) packed in 12 bytes.
KVLAB_BLOCK_INLINE void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = load_fp16(b + 108);
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  const uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  unsigned m = 1;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l)
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
      shift += 2;
      m <<= 1;
    }
    q += 32;
  }
}

}  // namespace kvlab::gguf_detail
