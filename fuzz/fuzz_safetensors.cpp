// libFuzzer target: the safetensors header parser on arbitrary bytes, then a copy of every tensor.
// Any exception other than kvlab::Error, any crash or sanitizer report is a bug.
#include "kvlab/core/check.h"
#include "kvlab/io/safetensors.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvlab::SafetensorsHeader h = kvlab::parse_safetensors_header(data, size, "fuzz.safetensors");
    for (const kvlab::TensorView& v : h.tensors) {
      at::Tensor t = kvlab::tensor_from_view(v);  // [v.shape] float32; bytes were validated
      (void)t;
    }
  } catch (const kvlab::Error&) {
  }
  return 0;
}
