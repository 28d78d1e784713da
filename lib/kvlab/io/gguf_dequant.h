// Block dequantizers of the ggml quantized types (gguf_dequant.cpp); gguf.cpp drives them.
#pragma once

#include <cstdint>

#include "kvlab/io/gguf.h"

namespace kvlab::gguf_detail {

// Decodes one block of `t` (block_size elements, type_size bytes; gguf.cpp's type table) at `b`
// into `y`.
using BlockFn = void (*)(const uint8_t* b, float* y);

// The block decoder of a quantized type, or nullptr when kvlab has none (F32/F16/BF16 are not
// block types: gguf_dequantize copies them).
BlockFn block_dequantizer(GgmlType t);

}  // namespace kvlab::gguf_detail
