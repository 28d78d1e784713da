// libFuzzer target for the tokenizer.json loader: any input must either load or throw
// kvlab::Error; a loaded tokenizer must then encode and decode a few strings without crashing.
// Seed corpus: ../shared/tokenizers/*/tokenizer.json (large) or small hand-made files.
#include "kvlab/core/check.h"
#include "kvlab/tokenizer/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const kvlab::Tokenizer tok = kvlab::Tokenizer::from_json_string(text, "fuzz input");
    for (std::string_view s : {"Hello world! 123", " \n\t ", "你好 🦙", "<s><|im_start|>x"}) {
      const auto ids = tok.encode(s, true);
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
    }
  } catch (const kvlab::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
