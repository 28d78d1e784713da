// The table of ggml's block decoders (gguf_dequant.h holds the decoders themselves).
#include "kvlab/io/gguf_dequant.h"

namespace kvlab::gguf_detail {

BlockFn block_dequantizer(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return dequant_q4_0;
    case GgmlType::Q4_1: return dequant_q4_1;
    case GgmlType::Q5_0: return dequant_q5_0;
    case GgmlType::Q5_1: return dequant_q5_1;
    case GgmlType::Q8_0: return dequant_q8_0;
    case GgmlType::Q4_K: return dequant_q4_k;
    case GgmlType::Q6_K: return dequant_q6_k;
    case GgmlType::Q5_K: return dequant_q5_k;
    case GgmlType::Q3_K: return dequant_q3_k;
    case GgmlType::Q2_K: return dequant_q2_k;
    default: return nullptr;
  }
}

}  // namespace kvlab::gguf_detail
