// SentencePiece `tokenizer.model` files (a protobuf ModelProto), read with a minimal protobuf
// wire-format reader instead of a libprotobuf / libsentencepiece dependency. Only what a BPE
// model needs is read; the vocabulary then goes through the same score-based SPM BPE as GGUF
// "llama" vocabularies (which is how llama.cpp reproduces the sentencepiece library).
//
// Fields used (sentencepiece_model.proto):
//   ModelProto      1: repeated SentencePiece pieces, 2: TrainerSpec, 3: NormalizerSpec
//   SentencePiece   1: string piece, 2: float score, 3: Type type (1 normal, 2 unknown,
//                   3 control, 4 user-defined, 5 unused, 6 byte)
//   TrainerSpec     3: model_type (1 unigram, 2 bpe), 35: byte_fallback, 40/41/42: unk/bos/eos id
//   NormalizerSpec  1: name, 3: add_dummy_prefix, 4: remove_extra_whitespaces
#include "kvlab/core/check.h"
#include "kvlab/tokenizer/tokenizer.h"
#include "kvlab/tokenizer/tokenizer_impl.h"

#include <cstring>
#include <fstream>
#include <sstream>

namespace kvlab {

namespace {

class PbReader {
 public:
  PbReader(std::string_view data, const std::string& src) : data_(data), src_(src) {}
  bool done() const { return pos_ >= data_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KVLAB_CHECK(pos_ < data_.size(), "{}: truncated protobuf varint at byte {}", src_, pos_);
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    KVLAB_FAIL("{}: protobuf varint longer than 10 bytes at byte {}", src_, pos_);
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    KVLAB_CHECK(n <= data_.size() - pos_, "{}: protobuf field of {} bytes overruns the data at byte {}",
                src_, n, pos_);
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32_float() {
    KVLAB_CHECK(data_.size() - pos_ >= 4, "{}: truncated protobuf fixed32 at byte {}", src_, pos_);
    float f;
    std::memcpy(&f, data_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  void skip(int wire) {
    switch (wire) {
      case 0: varint(); break;
      case 1: KVLAB_CHECK(data_.size() - pos_ >= 8, "{}: truncated protobuf fixed64", src_); pos_ += 8; break;
      case 2: bytes(); break;
      case 5: fixed32_float(); break;
      default: KVLAB_FAIL("{}: unsupported protobuf wire type {} at byte {}", src_, wire, pos_);
    }
  }
  // Next (field number, wire type).
  std::pair<uint64_t, int> tag() {
    const uint64_t t = varint();
    return {t >> 3, static_cast<int>(t & 7)};
  }

 private:
  std::string_view data_;
  const std::string& src_;
  size_t pos_ = 0;
};

}  // namespace

Tokenizer Tokenizer::from_sentencepiece_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVLAB_CHECK(in.good(), "cannot open SentencePiece model '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();

  TokenizerVocab v;
  v.model = "llama";
  v.add_bos = true;
  int64_t model_type = 1, byte_fallback = 0, unk = 0, bos = 1, eos = 2;
  bool dummy_prefix = true, remove_ws = true;
  std::string norm_name;
  PbReader top(data, path);
  while (!top.done()) {
    const auto [field, wire] = top.tag();
    if (field == 1 && wire == 2) {
      PbReader p(top.bytes(), path);
      std::string piece;
      float score = 0;
      int64_t type = 1;
      while (!p.done()) {
        const auto [f, w] = p.tag();
        if (f == 1 && w == 2) piece = std::string(p.bytes());
        else if (f == 2 && w == 5) score = p.fixed32_float();
        else if (f == 3 && w == 0) type = static_cast<int64_t>(p.varint());
        else p.skip(w);
      }
      v.tokens.push_back(std::move(piece));
      v.scores.push_back(score);
      v.token_types.push_back(static_cast<int32_t>(type));
    } else if (field == 2 && wire == 2) {
      PbReader t(top.bytes(), path);
      while (!t.done()) {
        const auto [f, w] = t.tag();
        // int32 fields: negative values arrive as 64-bit two's complement varints.
        if (w == 0 && (f == 3 || f == 35 || f == 40 || f == 41 || f == 42)) {
          const auto val = static_cast<int64_t>(static_cast<int32_t>(t.varint()));
          (f == 3 ? model_type : f == 35 ? byte_fallback : f == 40 ? unk : f == 41 ? bos : eos) = val;
        } else {
          t.skip(w);
        }
      }
    } else if (field == 3 && wire == 2) {
      PbReader n(top.bytes(), path);
      while (!n.done()) {
        const auto [f, w] = n.tag();
        if (f == 1 && w == 2) norm_name = std::string(n.bytes());
        else if (f == 3 && w == 0) dummy_prefix = n.varint() != 0;
        else if (f == 4 && w == 0) remove_ws = n.varint() != 0;
        else n.skip(w);
      }
    } else {
      top.skip(wire);
    }
  }
  KVLAB_CHECK(!v.tokens.empty(), "{}: no pieces (not a SentencePiece model?)", path);
  KVLAB_CHECK(model_type == 2, "{}: SentencePiece model_type {} unsupported (only BPE = 2; Unigram "
              "models such as T5 are not Llama-family)", path, model_type);
  KVLAB_CHECK(norm_name.empty() || norm_name == "identity",
              "{}: SentencePiece normalizer '{}' unsupported (only identity, as Llama/Mistral use)",
              path, norm_name);
  KVLAB_CHECK(!remove_ws || norm_name == "identity",
              "{}: remove_extra_whitespaces is unsupported", path);
  const auto n = static_cast<int64_t>(v.tokens.size());
  auto id_or_none = [&](int64_t id) { return id >= 0 && id < n ? id : int64_t{-1}; };
  v.unk_id = id_or_none(unk);
  v.bos_id = id_or_none(bos);
  v.eos_id = id_or_none(eos);
  v.add_bos = v.bos_id >= 0;
  v.add_space_prefix = dummy_prefix;
  (void)byte_fallback;  // byte pieces (type 6) are used whenever present, as llama.cpp does
  Tokenizer t = from_vocab(v);
  std::const_pointer_cast<Impl>(t.impl_)->source = path;
  return t;
}

}  // namespace kvlab
