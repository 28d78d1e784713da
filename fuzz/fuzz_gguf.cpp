// libFuzzer target: the GGUF parser on arbitrary bytes, then dequantization of every tensor kvlab
// supports. Any exception other than kvlab::Error, any crash or sanitizer report is a bug.
#include "kvlab/core/check.h"
#include "kvlab/io/gguf.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvlab::GgufContents c = kvlab::parse_gguf(data, size, "fuzz.gguf");
    for (const kvlab::GgufTensorInfo& t : c.tensors) {
      if (!kvlab::ggml_type_dequantizable(t.type)) continue;
      at::Tensor w = kvlab::gguf_dequantize(t);  // [t.shape] float32; size bounded by the input
      (void)w;
    }
  } catch (const kvlab::Error&) {
  }
  return 0;
}
