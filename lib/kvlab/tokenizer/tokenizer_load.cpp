// Loaders of kvlab::Tokenizer: Hugging Face tokenizer.json (+ tokenizer_config.json /
// config.json beside it for BOS/EOS), GGUF vocabularies, llama2.c tokenizer.bin.
// Every field is type-checked: hostile files give a kvlab::Error naming the file and the key.
#include "kvlab/core/check.h"
#include "kvlab/tokenizer/tokenizer.h"
#include "kvlab/tokenizer/tokenizer_impl.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvlab {

namespace fs = std::filesystem;
using nlohmann::json;
using Impl = Tokenizer::Impl;
using detail::DecoderStep;
using detail::NormalizerStep;
using detail::PreTokenizerStep;

namespace {

const char* const kSpace = "\xe2\x96\x81";  // "▁", SentencePiece's visible space

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  KVLAB_CHECK(in.good(), "cannot open {} '{}'", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Typed accessors: `where` is the JSON path used in messages ("model.vocab").
const json& member(const json& j, const char* key, const std::string& src, const std::string& where) {
  KVLAB_CHECK(j.is_object(), "{}: '{}' must be an object, found {}", src, where, j.type_name());
  auto it = j.find(key);
  KVLAB_CHECK(it != j.end(), "{}: missing key '{}.{}'", src, where, key);
  return *it;
}
std::string str_or(const json& j, const char* key, const std::string& dflt, const std::string& src,
                   const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  KVLAB_CHECK(it->is_string(), "{}: '{}.{}' must be a string, found {}", src, where, key,
              it->type_name());
  return it->get<std::string>();
}
bool bool_or(const json& j, const char* key, bool dflt, const std::string& src, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  KVLAB_CHECK(it->is_boolean(), "{}: '{}.{}' must be true/false, found {}", src, where, key,
              it->type_name());
  return it->get<bool>();
}
int64_t int_or(const json& j, const char* key, int64_t dflt, const std::string& src, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  KVLAB_CHECK(it->is_number_integer(), "{}: '{}.{}' must be an integer, found {}", src, where, key,
              it->type_name());
  return it->get<int64_t>();
}
// {"String": " "} patterns only; regex replace patterns are not used by supported families.
std::string string_pattern(const json& j, const std::string& src, const std::string& where) {
  const json& p = member(j, "pattern", src, where);
  KVLAB_CHECK(p.is_object() && p.contains("String") && p["String"].is_string(),
              "{}: '{}.pattern' must be {{\"String\": ...}} (regex patterns are unsupported), found {}",
              src, where, p.dump().substr(0, 200));
  return p["String"].get<std::string>();
}

void parse_normalizer(const json& j, Impl& m, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "", m.source, where);
  if (type == "Sequence") {
    const json& list = member(j, "normalizers", m.source, where);
    KVLAB_CHECK(list.is_array(), "{}: '{}.normalizers' must be an array", m.source, where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(list[i], m, fmt::format("{}.normalizers[{}]", where, i));
  } else if (type == "Prepend") {
    m.normalizers.push_back({NormalizerStep::Kind::Prepend, str_or(j, "prepend", "", m.source, where), ""});
  } else if (type == "Replace") {
    m.normalizers.push_back({NormalizerStep::Kind::Replace, string_pattern(j, m.source, where),
                             str_or(j, "content", "", m.source, where)});
  } else if (type == "NFC" || type == "NFKC") {
    // Treated as identity: see the note in tokenizer.h.
    m.normalizers.push_back({NormalizerStep::Kind::Identity, "", ""});
  } else {
    KVLAB_FAIL("{}: unsupported normalizer '{}' at '{}' (supported: Sequence, Prepend, Replace, NFC)",
               m.source, type, where);
  }
}

void parse_metaspace(const json& j, const Impl& m, const std::string& where, std::string* rep,
                     std::string* scheme) {
  *rep = str_or(j, "replacement", kSpace, m.source, where);
  KVLAB_CHECK(!rep->empty(), "{}: '{}.replacement' is empty", m.source, where);
  // Older files spell prepend_scheme as add_prefix_space.
  const bool legacy_prefix = bool_or(j, "add_prefix_space", true, m.source, where);
  *scheme = str_or(j, "prepend_scheme", legacy_prefix ? "always" : "never", m.source, where);
  KVLAB_CHECK(*scheme == "always" || *scheme == "first" || *scheme == "never",
              "{}: '{}.prepend_scheme' must be always|first|never, found '{}'", m.source, where, *scheme);
}

void parse_pre_tokenizer(const json& j, Impl& m, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "", m.source, where);
  PreTokenizerStep st;
  if (type == "Sequence") {
    const json& list = member(j, "pretokenizers", m.source, where);
    KVLAB_CHECK(list.is_array(), "{}: '{}.pretokenizers' must be an array", m.source, where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(list[i], m, fmt::format("{}.pretokenizers[{}]", where, i));
    return;
  } else if (type == "Split") {
    const json& p = member(j, "pattern", m.source, where);
    KVLAB_CHECK(p.is_object() && p.contains("Regex") && p["Regex"].is_string(),
                "{}: '{}.pattern' must be {{\"Regex\": ...}}, found {}", m.source, where,
                p.dump().substr(0, 200));
    const std::string behavior = str_or(j, "behavior", "Isolated", m.source, where);
    KVLAB_CHECK(behavior == "Isolated" && !bool_or(j, "invert", false, m.source, where),
                "{}: '{}' Split behavior '{}' (invert) unsupported; only Isolated", m.source, where, behavior);
    st.kind = PreTokenizerStep::Kind::Split;
    st.pattern = detail::split_pattern_from_regex(p["Regex"].get<std::string>(), m.source + ": " + where);
  } else if (type == "ByteLevel") {
    st.kind = PreTokenizerStep::Kind::ByteLevel;
    st.add_prefix_space = bool_or(j, "add_prefix_space", false, m.source, where);
    st.use_regex = bool_or(j, "use_regex", true, m.source, where);
    m.byte_level = true;
  } else if (type == "Digits") {
    st.kind = PreTokenizerStep::Kind::Digits;
    st.individual_digits = bool_or(j, "individual_digits", false, m.source, where);
  } else if (type == "Metaspace") {
    st.kind = PreTokenizerStep::Kind::Metaspace;
    parse_metaspace(j, m, where, &st.replacement, &st.prepend_scheme);
    st.split = bool_or(j, "split", true, m.source, where);
  } else {
    KVLAB_FAIL("{}: unsupported pre_tokenizer '{}' at '{}' (supported: Sequence, Split, ByteLevel, "
               "Digits, Metaspace)", m.source, type, where);
  }
  m.pre_tokenizers.push_back(std::move(st));
}

void parse_decoder(const json& j, Impl& m, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "", m.source, where);
  DecoderStep st;
  if (type == "Sequence") {
    const json& list = member(j, "decoders", m.source, where);
    KVLAB_CHECK(list.is_array(), "{}: '{}.decoders' must be an array", m.source, where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_decoder(list[i], m, fmt::format("{}.decoders[{}]", where, i));
    return;
  } else if (type == "ByteLevel") {
    st.kind = DecoderStep::Kind::ByteLevel;
  } else if (type == "Replace") {
    st.kind = DecoderStep::Kind::Replace;
    st.a = string_pattern(j, m.source, where);
    st.b = str_or(j, "content", "", m.source, where);
  } else if (type == "ByteFallback") {
    st.kind = DecoderStep::Kind::ByteFallback;
  } else if (type == "Fuse") {
    st.kind = DecoderStep::Kind::Fuse;
  } else if (type == "Strip") {
    st.kind = DecoderStep::Kind::Strip;
    st.a = str_or(j, "content", " ", m.source, where);
    const int64_t start = int_or(j, "start", 0, m.source, where);
    const int64_t stop = int_or(j, "stop", 0, m.source, where);
    KVLAB_CHECK(start >= 0 && start <= 1024 && stop >= 0 && stop <= 1024,
                "{}: '{}' Strip start/stop must be in [0, 1024], found {}/{}", m.source, where, start, stop);
    st.start = static_cast<int>(start);
    st.stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    st.kind = DecoderStep::Kind::Metaspace;
    std::string scheme;
    parse_metaspace(j, m, where, &st.a, &scheme);
    st.prepend_first = scheme != "never";
  } else {
    KVLAB_FAIL("{}: unsupported decoder '{}' at '{}' (supported: Sequence, ByteLevel, Replace, "
               "ByteFallback, Fuse, Strip, Metaspace)", m.source, type, where);
  }
  m.decoders.push_back(std::move(st));
}

void parse_post_processor(const json& j, Impl& m, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "", m.source, where);
  if (type == "Sequence") {
    const json& list = member(j, "processors", m.source, where);
    KVLAB_CHECK(list.is_array(), "{}: '{}.processors' must be an array", m.source, where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], m, fmt::format("{}.processors[{}]", where, i));
  } else if (type == "ByteLevel") {
    // Only trims offsets; adds no tokens.
  } else if (type == "TemplateProcessing") {
    const json& single = member(j, "single", m.source, where);
    const json& specials = member(j, "special_tokens", m.source, where);
    KVLAB_CHECK(single.is_array() && specials.is_object(),
                "{}: '{}' needs an array 'single' and an object 'special_tokens'", m.source, where);
    bool seen_a = false;
    for (const json& item : single) {
      KVLAB_CHECK(item.is_object(), "{}: '{}.single' items must be objects", m.source, where);
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      const json& sp = member(item, "SpecialToken", m.source, where + ".single[]");
      const std::string name = str_or(sp, "id", "", m.source, where + ".single[].SpecialToken");
      auto it = specials.find(name);
      KVLAB_CHECK(it != specials.end() && it->is_object(),
                  "{}: '{}' uses special token '{}' missing from special_tokens", m.source, where, name);
      const json& ids = member(*it, "ids", m.source, where + ".special_tokens." + name);
      KVLAB_CHECK(ids.is_array(), "{}: '{}.special_tokens.{}.ids' must be an array", m.source, where, name);
      for (const json& id : ids) {
        KVLAB_CHECK(id.is_number_integer(), "{}: special token ids must be integers", m.source);
        (seen_a ? m.suffix_ids : m.prefix_ids).push_back(id.get<int64_t>());
      }
    }
  } else {
    KVLAB_FAIL("{}: unsupported post_processor '{}' at '{}' (supported: Sequence, ByteLevel, "
               "TemplateProcessing)", m.source, type, where);
  }
}

// BOS/EOS when no side file names them: the post-processor's first token, else the usual names.
void guess_bos_eos(Impl& m) {
  if (m.bos < 0 && !m.prefix_ids.empty()) m.bos = m.prefix_ids.front();
  auto find = [&](std::initializer_list<const char*> names) -> int64_t {
    for (const char* n : names) {
      auto it = m.piece_to_id.find(n);
      if (it != m.piece_to_id.end()) return it->second;
    }
    return -1;
  };
  if (m.bos < 0) m.bos = find({"<s>", "<|begin_of_text|>", "<|endoftext|>"});
  if (m.eos < 0) m.eos = find({"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"});
}

// tokenizer_config.json / config.json beside tokenizer.json override BOS/EOS, as transformers does.
void apply_side_files(Impl& m, const fs::path& dir) {
  auto token_name = [&](const json& cfg, const char* key) -> std::string {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
    return "";
  };
  auto lookup = [&](const std::string& name, const std::string& file) -> int64_t {
    auto it = m.piece_to_id.find(name);
    KVLAB_CHECK(it != m.piece_to_id.end(), "{}: token '{}' is not in the vocabulary", file, name);
    return it->second;
  };
  bool bos_set = false, eos_set = false;
  const fs::path tc = dir / "tokenizer_config.json";
  if (fs::exists(tc)) {
    const std::string src = tc.string();
    json cfg = json::parse(read_text_file(src, "tokenizer config"), nullptr, false);
    KVLAB_CHECK(cfg.is_object(), "{}: not a JSON object", src);
    if (auto b = token_name(cfg, "bos_token"); !b.empty()) { m.bos = lookup(b, src); bos_set = true; }
    if (auto e = token_name(cfg, "eos_token"); !e.empty()) { m.eos = lookup(e, src); eos_set = true; }
    auto it = cfg.find("add_bos_token");
    if (it != cfg.end() && it->is_boolean()) {
      if (!it->get<bool>()) m.prefix_ids.clear();
      else if (m.prefix_ids.empty() && m.bos >= 0) m.prefix_ids = {m.bos};
    }
  }
  const fs::path mc = dir / "config.json";
  if (fs::exists(mc)) {
    json cfg = json::parse(read_text_file(mc.string(), "model config"), nullptr, false);
    if (cfg.is_object()) {
      auto id_of = [&](const char* key) -> int64_t {
        auto it = cfg.find(key);
        if (it == cfg.end()) return -1;
        if (it->is_number_integer()) return it->get<int64_t>();
        if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
        return -1;
      };
      if (!bos_set && id_of("bos_token_id") >= 0) m.bos = id_of("bos_token_id");
      if (!eos_set && id_of("eos_token_id") >= 0) m.eos = id_of("eos_token_id");
    }
  }
}

std::shared_ptr<Impl> parse_tokenizer_json(std::string_view text, const std::string& source) {
  auto m = std::make_shared<Impl>();
  m->source = source;
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  KVLAB_CHECK(!j.is_discarded(), "{}: not valid JSON", source);
  KVLAB_CHECK(j.is_object(), "{}: top level must be an object, found {}", source, j.type_name());
  const json& model = member(j, "model", source, "");
  const std::string type = str_or(model, "type", "BPE", source, "model");
  KVLAB_CHECK(type == "BPE", "{}: model.type '{}' unsupported (only BPE: Llama/Mistral/Qwen2/SmolLM2 "
              "families)", source, type);
  auto drop = model.find("dropout");
  KVLAB_CHECK(drop == model.end() || drop->is_null() || (drop->is_number() && drop->get<double>() == 0.0),
              "{}: model.dropout must be null (BPE dropout is a training-time option)", source);
  KVLAB_CHECK(str_or(model, "continuing_subword_prefix", "", source, "model").empty() &&
                  str_or(model, "end_of_word_suffix", "", source, "model").empty(),
              "{}: continuing_subword_prefix / end_of_word_suffix are unsupported", source);

  // Vocabulary: model.vocab plus added_tokens, dense ids 0..n-1.
  const json& vocab = member(model, "vocab", source, "model");
  KVLAB_CHECK(vocab.is_object(), "{}: model.vocab must be an object piece -> id", source);
  const json empty_array = json::array();
  const json* added = &empty_array;
  if (auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) added = &*it;
  KVLAB_CHECK(added->is_array(), "{}: added_tokens must be an array", source);
  const size_t limit = vocab.size() + added->size();
  auto put = [&](const std::string& piece, const json& idj, const char* where) {
    KVLAB_CHECK(idj.is_number_integer(), "{}: {} id of '{}' must be an integer", source, where, piece);
    const int64_t id = idj.get<int64_t>();
    KVLAB_CHECK(id >= 0 && static_cast<size_t>(id) < limit,
                "{}: {} id {} of '{}' outside [0, {}) (ids must be dense)", source, where, id, piece, limit);
    if (m->pieces.size() <= static_cast<size_t>(id)) m->pieces.resize(id + 1);
    m->pieces[id] = piece;
    m->piece_to_id[piece] = id;
    return id;
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it) put(it.key(), it.value(), "model.vocab");
  for (size_t i = 0; i < added->size(); ++i) {
    const json& t = (*added)[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    detail::AddedToken at;
    at.content = str_or(t, "content", "", source, where);
    KVLAB_CHECK(!at.content.empty(), "{}: '{}.content' missing or empty", source, where);
    at.id = put(at.content, member(t, "id", source, where), "added_tokens");
    at.special = bool_or(t, "special", false, source, where);
    at.lstrip = bool_or(t, "lstrip", false, source, where);
    at.rstrip = bool_or(t, "rstrip", false, source, where);
    at.single_word = bool_or(t, "single_word", false, source, where);
    m->added.push_back(std::move(at));
  }
  KVLAB_CHECK(m->piece_to_id.size() == m->pieces.size(),
              "{}: vocabulary ids are not dense: {} distinct pieces for ids 0..{}", source,
              m->piece_to_id.size(), m->pieces.size() == 0 ? 0 : m->pieces.size() - 1);

  m->unk_id = -1;
  if (const std::string unk = str_or(model, "unk_token", "", source, "model"); !unk.empty()) {
    auto it = m->piece_to_id.find(unk);
    KVLAB_CHECK(it != m->piece_to_id.end(), "{}: model.unk_token '{}' is not in the vocabulary", source, unk);
    m->unk_id = it->second;
  }
  m->byte_fallback = bool_or(model, "byte_fallback", false, source, "model");
  m->fuse_unk = bool_or(model, "fuse_unk", false, source, "model");
  m->ignore_merges = bool_or(model, "ignore_merges", false, source, "model");

  const json& merges = member(model, "merges", source, "model");
  KVLAB_CHECK(merges.is_array(), "{}: model.merges must be an array", source);
  m->merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& mg = merges[r];
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      KVLAB_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                  "{}: model.merges[{}] '{}' must be two pieces separated by one space", source, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      KVLAB_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(),
                  "{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", source, r);
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    }
    auto ia = m->piece_to_id.find(a), ib = m->piece_to_id.find(b), iab = m->piece_to_id.find(a + b);
    KVLAB_CHECK(ia != m->piece_to_id.end() && ib != m->piece_to_id.end() && iab != m->piece_to_id.end(),
                "{}: model.merges[{}] ('{}' + '{}') uses a piece missing from the vocabulary", source, r, a, b);
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    // The first (lowest-rank) occurrence wins, as in HF.
    m->merges.emplace(key, std::make_pair(static_cast<int32_t>(r), static_cast<int32_t>(iab->second)));
  }

  auto opt = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = j.find(key);
    return it == j.end() ? null_json : *it;
  };
  parse_normalizer(opt("normalizer"), *m, "normalizer");
  parse_pre_tokenizer(opt("pre_tokenizer"), *m, "pre_tokenizer");
  parse_decoder(opt("decoder"), *m, "decoder");
  parse_post_processor(opt("post_processor"), *m, "post_processor");
  for (const auto& d : m->decoders) m->byte_level |= d.kind == DecoderStep::Kind::ByteLevel;
  m->kind = m->byte_level ? "byte_bpe" : "spm_bpe";
  m->algo = Impl::Algo::RankBpe;
  return m;
}

}  // namespace

Tokenizer Tokenizer::from_json_string(std::string_view text, const std::string& source) {
  auto m = parse_tokenizer_json(text, source);
  guess_bos_eos(*m);
  m->finalize();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  auto m = parse_tokenizer_json(read_text_file(path, "tokenizer file"), path);
  apply_side_files(*m, fs::path(path).parent_path());
  guess_bos_eos(*m);
  m->finalize();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_vocab(const TokenizerVocab& v) {
  auto m = std::make_shared<Impl>();
  m->source = fmt::format("GGUF vocabulary (tokenizer.ggml.model={})", v.model);
  const size_t n = v.tokens.size();
  KVLAB_CHECK(v.token_types.empty() || v.token_types.size() == n,
              "{}: {} token types for {} tokens", m->source, v.token_types.size(), n);
  m->pieces = v.tokens;
  for (size_t i = 0; i < n; ++i) m->piece_to_id.emplace(v.tokens[i], static_cast<int64_t>(i));
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    const int32_t t = v.token_types[i];
    // Control (3) and user-defined (4) tokens are matched in the text before BPE; unknown (2) is
    // special for decoding but never matched.
    if (t == 3 || t == 4)
      m->added.push_back({v.tokens[i], static_cast<int64_t>(i), t == 3, false, false, false});
    else if (t == 2)
      m->added.push_back({v.tokens[i], static_cast<int64_t>(i), true, false, false, false});
  }
  m->bos = v.bos_id;
  m->eos = v.eos_id;
  m->unk_id = v.unk_id;
  if (v.add_bos && v.bos_id >= 0) m->prefix_ids = {v.bos_id};
  if (v.model == "gpt2") {
    m->kind = "byte_bpe";
    m->algo = Impl::Algo::RankBpe;
    m->byte_level = true;
    const std::string pre = v.pre.empty() ? "gpt2" : v.pre;
    const detail::SplitPattern pat = detail::split_pattern_from_regex(pre, m->source + " tokenizer.ggml.pre");
    PreTokenizerStep bl;
    bl.kind = PreTokenizerStep::Kind::ByteLevel;
    if (pre == "smollm") {  // llama.cpp: "\p{N}" then the GPT-2 regex
      PreTokenizerStep d;
      d.kind = PreTokenizerStep::Kind::Digits;
      d.individual_digits = true;
      m->pre_tokenizers.push_back(d);
    } else if (pat != detail::SplitPattern::Gpt2) {
      PreTokenizerStep sp;
      sp.kind = PreTokenizerStep::Kind::Split;
      sp.pattern = pat;
      m->pre_tokenizers.push_back(sp);
      bl.use_regex = false;
      m->ignore_merges = pat == detail::SplitPattern::Llama3;
    }
    m->pre_tokenizers.push_back(bl);
    DecoderStep d;
    d.kind = DecoderStep::Kind::ByteLevel;
    m->decoders.push_back(d);
    for (size_t r = 0; r < v.merges.size(); ++r) {
      const std::string& s = v.merges[r];
      const size_t sp = s.find(' ');
      KVLAB_CHECK(sp != std::string::npos, "{}: merge {} '{}' has no space", m->source, r, s);
      auto ia = m->piece_to_id.find(s.substr(0, sp)), ib = m->piece_to_id.find(s.substr(sp + 1));
      auto iab = m->piece_to_id.find(s.substr(0, sp) + s.substr(sp + 1));
      KVLAB_CHECK(ia != m->piece_to_id.end() && ib != m->piece_to_id.end() && iab != m->piece_to_id.end(),
                  "{}: merge {} '{}' uses a piece missing from the vocabulary", m->source, r, s);
      const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
      m->merges.emplace(key, std::make_pair(static_cast<int32_t>(r), static_cast<int32_t>(iab->second)));
    }
  } else if (v.model == "llama") {
    m->kind = "spm_scores";
    m->algo = Impl::Algo::ScoreBpe;
    KVLAB_CHECK(v.scores.size() == n, "{}: {} scores for {} tokens (tokenizer.ggml.scores)", m->source,
                v.scores.size(), n);
    m->scores = v.scores;
    m->byte_fallback = true;
    if (v.add_space_prefix) m->normalizers.push_back({NormalizerStep::Kind::Prepend, kSpace, ""});
    m->normalizers.push_back({NormalizerStep::Kind::Replace, " ", kSpace});
    m->decoders.push_back({DecoderStep::Kind::Replace, kSpace, " "});
    m->decoders.push_back({DecoderStep::Kind::ByteFallback, "", ""});
    m->decoders.push_back({DecoderStep::Kind::Fuse, "", ""});
    if (v.add_space_prefix) m->decoders.push_back({DecoderStep::Kind::Strip, " ", "", 1, 0});
  } else {
    KVLAB_FAIL("{}: unsupported tokenizer.ggml.model '{}' (supported: gpt2, llama)", m->source, v.model);
  }
  m->finalize();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_llama2c_file(const std::string& path) {
  const std::string data = read_text_file(path, "llama2.c tokenizer");
  size_t off = 0;
  auto read_bytes = [&](void* dst, size_t n, const char* what) {
    KVLAB_CHECK(off + n <= data.size(), "{}: truncated at byte {} reading {} (file has {} bytes)", path,
                off, what, data.size());
    std::memcpy(dst, data.data() + off, n);
    off += n;
  };
  int32_t max_len = 0;
  read_bytes(&max_len, 4, "max_token_length");
  KVLAB_CHECK(max_len > 0 && max_len <= 4096, "{}: max_token_length {} outside (0, 4096]", path, max_len);
  TokenizerVocab v;
  v.model = "llama";
  v.add_bos = true;
  while (off < data.size()) {
    float score = 0;
    int32_t len = 0;
    read_bytes(&score, 4, "a score");
    read_bytes(&len, 4, "a piece length");
    KVLAB_CHECK(len >= 0 && len <= max_len, "{}: piece {} has length {} (max_token_length {})", path,
                v.tokens.size(), len, max_len);
    std::string piece(static_cast<size_t>(len), '\0');
    read_bytes(piece.data(), piece.size(), "a piece");
    // llama2.c stores "▁" as a space and BOS/EOS as "\n<s>\n"; normalise to SentencePiece form.
    if (piece == "\n<s>\n" || piece == "\n</s>\n") piece = piece.substr(1, piece.size() - 2);
    v.tokens.push_back(detail::normalize_replace(piece, " ", kSpace));
    v.scores.push_back(score);
  }
  KVLAB_CHECK(v.tokens.size() >= 3, "{}: only {} pieces", path, v.tokens.size());
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[0] = 2;
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  for (int64_t id : {1, 2}) v.token_types[id] = 3;
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i].size() == 6 && v.tokens[i].compare(0, 3, "<0x") == 0) v.token_types[i] = 6;
  Tokenizer t = from_vocab(v);
  std::const_pointer_cast<Impl>(t.impl_)->source = path;
  return t;
}

Tokenizer Tokenizer::from_model_dir(const std::string& dir) {
  const fs::path p(dir);
  if (fs::is_regular_file(p)) {
    if (p.extension() == ".json") return from_file(p.string());
    if (p.extension() == ".model") return from_sentencepiece_file(p.string());
    if (p.extension() == ".bin") return from_llama2c_file(p.string());
    KVLAB_FAIL("tokenizer file '{}': expected tokenizer.json, a SentencePiece .model or a llama2.c "
               "tokenizer .bin", dir);
  }
  KVLAB_CHECK(fs::is_directory(p), "model directory '{}' does not exist", dir);
  if (fs::exists(p / "tokenizer.json")) return from_file((p / "tokenizer.json").string());
  if (fs::exists(p / "tokenizer.model")) return from_sentencepiece_file((p / "tokenizer.model").string());
  if (fs::exists(p / "tokenizer.bin")) return from_llama2c_file((p / "tokenizer.bin").string());
  std::vector<fs::path> bins;
  for (const auto& e : fs::directory_iterator(p)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tok", 0) == 0 && e.path().extension() == ".bin") bins.push_back(e.path());
  }
  KVLAB_CHECK(bins.size() == 1,
              "model directory '{}': no tokenizer found (looked for tokenizer.json, tokenizer.model, "
              "tokenizer.bin, tok*.bin; found {} tok*.bin)", dir, bins.size());
  return from_llama2c_file(bins[0].string());
}

}  // namespace kvlab
