// Tokenizers for the Llama family, without Python or SentencePiece at run time:
//   * Hugging Face tokenizer.json, model "BPE":
//       - byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2): added tokens split out first, then the
//         pre-tokenizer (Split regex / ByteLevel regex / Digits / Metaspace), byte->unicode
//         mapping, merges by rank;
//       - SentencePiece-style BPE (Llama 2, Mistral): normalizer (Prepend "▁", Replace " "->"▁"),
//         merges by rank, `<0xXX>` byte fallback, decoder chain (Replace, ByteFallback, Fuse, Strip).
//   * GGUF-embedded vocabularies (`tokenizer.ggml.model` "gpt2" or "llama"), fed as plain vectors.
//   * SentencePiece `tokenizer.model` (BPE type, identity normalizer: Llama 2, Mistral), read
//     without libsentencepiece; same score-based merges as GGUF "llama".
//   * llama2.c's legacy `tokenizer.bin` (e.g. tok512.bin of stories260K).
// Ids match the Python `tokenizers` library on the golden text set (tests/model/test_tokenizer.cpp).
//
// Known deviations: NFC/NFKC normalizers are accepted but treated as identity (text in the wild
// is nearly always NFC already); BPE dropout is rejected; only the split regexes of the GPT-2,
// Llama-3 and Qwen2 families are recognised (others are an error naming the pattern).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// A vocabulary as GGUF stores it (`tokenizer.ggml.*`), so a GGUF reader can build a tokenizer
// without this module depending on it.
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (byte-level BPE) | "llama" (SPM)
  std::string pre;                   // tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "gpt2", ""
  std::vector<std::string> tokens;   // id -> piece
  std::vector<float> scores;         // id -> score ("llama": merge priority); may be empty for gpt2
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;   // "a b" (gpt2 only)
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  int64_t unk_id = -1;
  bool add_bos = false;              // tokenizer.ggml.add_bos_token
  bool add_space_prefix = true;      // tokenizer.ggml.add_space_prefix ("llama" only)
};

class Tokenizer {
 public:
  struct Impl;

  // tokenizer.json; BOS/EOS from its post_processor / added tokens, overridden by
  // tokenizer_config.json or config.json beside it when present.
  static Tokenizer from_file(const std::string& path);
  // The same from a string; `source` names it in error messages. Hostile input throws
  // kvlab::Error, never crashes (fuzzed by fuzz/fuzz_tokenizer_json.cpp).
  static Tokenizer from_json_string(std::string_view json, const std::string& source);
  static Tokenizer from_vocab(const TokenizerVocab& vocab);
  // llama2.c's tokenizer.bin: int32 max_token_len, then per piece float32 score, int32 len, bytes.
  static Tokenizer from_llama2c_file(const std::string& path);
  // SentencePiece tokenizer.model (protobuf); BOS added by encode(add_bos=true).
  static Tokenizer from_sentencepiece_file(const std::string& path);
  // A model directory: tokenizer.json, else tokenizer.model, else tokenizer.bin / tok*.bin
  // (llama2.c); or the path of one such file.
  static Tokenizer from_model_dir(const std::string& dir);

  // add_bos: add the special tokens the tokenizer itself adds (tokenizer.json post_processor,
  // tokenizer_config.json add_bos_token, GGUF add_bos_token). SmolLM2 adds none, as in
  // transformers. Special tokens written in `text` (e.g. "<|im_start|>") are always parsed.
  // Throws kvlab::Error only for a character the vocabulary cannot express at all (no piece,
  // no byte fallback, no unk token); byte-level and byte-fallback vocabularies never do.
  std::vector<int64_t> encode(std::string_view text, bool add_bos) const;
  // Invalid UTF-8 from partial byte tokens becomes U+FFFD, as in `tokenizers`.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;
  // The raw vocabulary piece ("Ġthe", "▁the", "<0x0A>"); throws for an id out of range.
  std::string token_text(int64_t id) const;
  int64_t bos_id() const;  // -1 if the tokenizer has none
  int64_t eos_id() const;  // -1 if the tokenizer has none
  int64_t token_id(std::string_view piece) const;  // -1 if none
  int64_t vocab_size() const;
  bool is_special(int64_t id) const;
  // "byte_bpe" | "spm_bpe" | "spm_scores", for logs and the auto chat template.
  std::string kind() const;
  const std::string& source() const;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kvlab
