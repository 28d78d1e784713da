// Tokenizers, chat templates and dataset prompts.
//  * ids equal the Python `tokenizers` library's on the golden text set
//    (tests/fixtures/tokenizer_golden, from data_scripts/make_tokenizer_golden.py), for SmolLM2
//    (byte-level BPE) and Llama 2 (SentencePiece BPE), loaded from tokenizer.json and, for the
//    GGUF path, rebuilt as plain vocabularies; Llama 2's tokenizer.model, read by the
//    score-based SPM path of GGUF "llama" vocabularies, matches the `sentencepiece` library;
//  * decode(encode(x)) == x over ../shared data (English, Chinese, code, emoji);
//  * stories260K's llama2.c tok512.bin reproduces the reference greedy prompt ids;
//  * malformed tokenizer.json files give kvlab::Error naming the problem;
//  * chat templates equal hand-written strings; LongBench / LongEval / XSUM / generic records.
#include "kvlab/core/check.h"
#include "kvlab/eval/datasets.h"
#include "kvlab/tokenizer/chat_template.h"
#include "kvlab/tokenizer/tokenizer.h"
#include "test_util.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using kvlab::ChatMessage;
using kvlab::Error;
using kvlab::Tokenizer;
using nlohmann::json;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string shared(const std::string& rel) { return kvlab::test::shared_dir() + "/" + rel; }

json golden(const std::string& name) {
  return json::parse(read_file(kvlab::test::fixtures_dir() + "/tokenizer_golden/" + name + ".json"));
}

kvlab::DatasetOptions samples(int64_t n) {
  kvlab::DatasetOptions o;
  o.max_samples = n;
  return o;
}

kvlab::DatasetOptions prompts_at(const std::string& path) {
  kvlab::DatasetOptions o;
  o.longbench_prompts = path;
  return o;
}

std::vector<int64_t> ids_of(const json& j) { return j.get<std::vector<int64_t>>(); }

// The first `n` bytes of `s`, cut back to a UTF-8 character boundary.
std::string utf8_prefix(const std::string& s, size_t n) {
  if (n >= s.size()) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

void check_golden(const Tokenizer& tok, const json& g, const char* ids_key_plain,
                  const char* ids_key_special, bool check_decode) {
  for (const auto& c : g["cases"]) {
    const std::string name = c["name"];
    const std::string text = c["text"];
    if (!c.contains(ids_key_plain)) continue;
    INFO("case=" << name << " tokenizer=" << tok.source());
    CHECK(tok.encode(text, false) == ids_of(c[ids_key_plain]));
    if (ids_key_special) CHECK(tok.encode(text, true) == ids_of(c[ids_key_special]));
    if (check_decode) {
      const auto ids = ids_of(c["ids_special"]);
      CHECK(tok.decode(ids, false) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
    }
  }
}

// A GGUF-style vocabulary rebuilt from a tokenizer.json, as a GGUF converter would store it.
kvlab::TokenizerVocab vocab_from_json(const std::string& path, const std::string& model) {
  const json j = json::parse(read_file(path));
  kvlab::TokenizerVocab v;
  v.model = model;
  const json& voc = j["model"]["vocab"];
  v.tokens.resize(voc.size());
  for (auto it = voc.begin(); it != voc.end(); ++it) v.tokens[it.value().get<size_t>()] = it.key();
  v.token_types.assign(v.tokens.size(), 1);
  for (const auto& a : j["added_tokens"]) v.token_types[a["id"].get<size_t>()] = 3;
  for (const auto& m : j["model"]["merges"]) v.merges.push_back(m.get<std::string>());
  return v;
}

std::string round_trip_corpus() {
  std::string text = utf8_prefix(read_file(shared("data/wikitext2/wiki.test.raw")), 20000);
  text += utf8_prefix(read_file(shared("data/niah/PaulGrahamEssays/addiction.txt")), 5000);
  std::ifstream zh(shared("data/longbench/multifieldqa_zh.jsonl"));
  std::string line;
  for (int i = 0; i < 2 && std::getline(zh, line); ++i)
    text += utf8_prefix(json::parse(line)["context"].get<std::string>(), 6000);
  // Code: kvlab's own sources (ones without special-token strings: with SentencePiece's legacy
  // prefix, "<s>x" decodes as "<s> x", as in transformers).
  text += read_file(std::string(KVLAB_SOURCE_DIR) + "/lib/kvlab/tokenizer/bpe.cpp");
  text += "emoji 🦙🤗 👩‍👩‍👧‍👦 🇫🇷 👍🏽 1️⃣ ✨ and CJK ext 𠀀𪜀 and\ttabs  \r\n";
  return text;
}

}  // namespace

TEST_CASE("tokenizer: byte-level BPE tokenizer.json matches the tokenizers library") {
  const Tokenizer tok = Tokenizer::from_file(shared("tokenizers/smollm2/tokenizer.json"));
  CHECK(tok.kind() == "byte_bpe");
  CHECK(tok.vocab_size() == 49152);
  // config.json beside tokenizer.json: bos 1 (<|im_start|>), eos 2 (<|im_end|>).
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.token_id("<|im_start|>") == 1);
  CHECK(tok.token_id("no such piece") == -1);
  CHECK(tok.is_special(0));
  check_golden(tok, golden("smollm2"), "ids", "ids_special", true);
}

TEST_CASE("tokenizer: SentencePiece BPE tokenizer.json (Llama 2) matches the tokenizers library") {
  const Tokenizer tok = Tokenizer::from_file(shared("tokenizers/llama2/tokenizer.json"));
  CHECK(tok.kind() == "spm_bpe");
  CHECK(tok.vocab_size() == 32000);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.token_text(13) == "<0x0A>");
  CHECK(tok.encode("Hi", true).front() == 1);  // post_processor adds <s>
  check_golden(tok, golden("llama2"), "ids", "ids_special", true);
}

TEST_CASE("tokenizer: GGUF-style vocabularies (gpt2 with merges, llama with scores)") {
  SUBCASE("gpt2 / smollm pre-tokenizer == tokenizer.json") {
    auto v = vocab_from_json(shared("tokenizers/smollm2/tokenizer.json"), "gpt2");
    v.pre = "smollm";
    v.bos_id = 1;
    v.eos_id = 2;
    const Tokenizer tok = Tokenizer::from_vocab(v);
    CHECK(tok.kind() == "byte_bpe");
    check_golden(tok, golden("smollm2"), "ids", "ids_special", true);
  }
  SUBCASE("SentencePiece tokenizer.model (llama scores path) == the sentencepiece library") {
    // Note: ../shared/tokenizers/llama2/tokenizer.model is Llama 2 ('▁' = 29871), while the
    // tokenizer.json beside it has Mistral-7B ids ('▁' = 28705); both are SentencePiece BPE.
    const Tokenizer tok = Tokenizer::from_sentencepiece_file(shared("tokenizers/llama2/tokenizer.model"));
    CHECK(tok.kind() == "spm_scores");
    CHECK(tok.vocab_size() == 32000);
    CHECK(tok.token_id("\xe2\x96\x81") == 29871);
    CHECK(tok.bos_id() == 1);
    CHECK(tok.eos_id() == 2);
    check_golden(tok, golden("llama2"), "ids_spm", nullptr, false);
    CHECK(tok.encode("Hi", true).front() == 1);
    CHECK(tok.decode(tok.encode(" Hello\n  world 你好 🦙", true), true) == " Hello\n  world 你好 🦙");
  }
  SUBCASE("bad vocabularies") {
    kvlab::TokenizerVocab v;
    v.model = "bert";
    v.tokens = {"a"};
    CHECK_THROWS_WITH_AS(Tokenizer::from_vocab(v), doctest::Contains("unsupported tokenizer.ggml.model 'bert'"), Error);
    v.model = "llama";
    CHECK_THROWS_WITH_AS(Tokenizer::from_vocab(v), doctest::Contains("0 scores for 1 tokens"), Error);
    v.model = "gpt2";
    v.merges = {"a b"};
    CHECK_THROWS_WITH_AS(Tokenizer::from_vocab(v), doctest::Contains("missing from the vocabulary"), Error);
    v.merges.clear();
    v.pre = "falcon";
    CHECK_THROWS_WITH_AS(Tokenizer::from_vocab(v), doctest::Contains("unsupported pre-tokenizer split pattern 'falcon'"), Error);
  }
}

TEST_CASE("tokenizer: decode(encode(x)) == x over shared data") {
  const std::string text = round_trip_corpus();
  for (const std::string name : {"smollm2", "llama2"}) {
    const Tokenizer tok = Tokenizer::from_file(shared("tokenizers/" + name + "/tokenizer.json"));
    INFO("tokenizer=" << name);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(name << ": " << text.size() << " bytes -> " << ids.size() << " tokens in " << s << " s");
    CHECK(tok.decode(ids) == text);
    // Chunk by chunk too: each piece alone must round trip (no state leaks between calls).
    for (size_t i = 0; i < text.size();) {
      const std::string piece = utf8_prefix(text.substr(i), 4096);
      CHECK(tok.decode(tok.encode(piece, false)) == piece);
      i += piece.size();
    }
  }
}

TEST_CASE("tokenizer: stories260K llama2.c tok512.bin") {
  const Tokenizer tok = Tokenizer::from_model_dir(shared("models/stories260K"));
  CHECK(tok.vocab_size() == 512);
  CHECK(tok.kind() == "spm_scores");
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  const json ref = json::parse(read_file(shared("models/stories260K/reference_greedy.json")));
  const auto greedy = ids_of(ref["greedy_ids"]);
  // The reference run starts "Once upon a time, there was a little girl named Lily.": encoding
  // that text must give the same ids the model produced.
  const auto ids = tok.encode("Once upon a time, there was a little girl named Lily.", true);
  REQUIRE(ids.size() <= greedy.size());
  CHECK(ids == std::vector<int64_t>(greedy.begin(), greedy.begin() + ids.size()));
  const std::string text = ref["text"];
  const std::string decoded = tok.decode(greedy, true);
  CHECK(decoded == (text.rfind(' ', 0) == 0 ? text.substr(1) : text));
  CHECK(tok.decode(tok.encode("Tom had a big red ball. 你好", false)) == "Tom had a big red ball. 你好");
}

TEST_CASE("tokenizer: malformed tokenizer.json gives kvlab::Error") {
  const std::string ok_model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const Tokenizer tok = Tokenizer::from_json_string("{" + ok_model + "}", "tiny");
  CHECK(tok.encode("abab", false) == std::vector<int64_t>{2, 2});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON"},
      {"[1, 2]", "top level must be an object"},
      {"{}", "missing key '.model'"},
      {R"({"model": {"type": "Unigram", "vocab": []}})", "model.type 'Unigram' unsupported"},
      {R"({"model": {"type": "BPE", "vocab": [], "merges": []}})", "model.vocab must be an object"},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "id of 'a' must be an integer"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 7}, "merges": []}})", "outside [0, 1)"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})", "not dense"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})", "missing from the vocabulary"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["abc"]}})", "two pieces separated by one space"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "missing key 'model.merges'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}})", "unk_token '<unk>'"},
      {"{" + ok_model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}}})",
       "unsupported pre-tokenizer split pattern"},
      {"{" + ok_model + R"(, "pre_tokenizer": {"type": "BertPreTokenizer"}})", "unsupported pre_tokenizer 'BertPreTokenizer'"},
      {"{" + ok_model + R"(, "normalizer": {"type": "Lowercase"}})", "unsupported normalizer 'Lowercase'"},
      {"{" + ok_model + R"(, "decoder": {"type": "WordPiece"}})", "unsupported decoder 'WordPiece'"},
      {"{" + ok_model + R"(, "added_tokens": [{"id": 9, "content": "<s>"}]})", "outside [0, 4)"},
      {"{" + ok_model + R"(, "added_tokens": [{"id": 2}]})", "content' missing or empty"},
      {"{" + ok_model + R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}}})",
       "missing from special_tokens"},
  };
  for (const auto& [text, expect] : cases) {
    INFO("input=" << text);
    CHECK_THROWS_WITH_AS(Tokenizer::from_json_string(text, "bad.json"), doctest::Contains(expect.c_str()), Error);
  }
  // Every truncation of a real file either loads or throws kvlab::Error (a mini fuzz run).
  const std::string full = "{" + ok_model + R"(, "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
      "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "x"}]},
      "decoder": {"type": "Strip", "content": " ", "start": 1, "stop": 0}})";
  for (size_t n = 0; n < full.size(); ++n) {
    try {
      const Tokenizer t = Tokenizer::from_json_string(full.substr(0, n), "truncated");
      (void)t.decode(t.encode("ab<s>ba", true));
    } catch (const Error&) {
    }
  }
  CHECK_THROWS_WITH_AS(tok.decode({5}), doctest::Contains("cannot decode token id 5"), Error);
  CHECK_THROWS_AS(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  CHECK_THROWS_WITH_AS(Tokenizer::from_model_dir(kvlab::test::fixtures_dir()), doctest::Contains("no tokenizer found"), Error);
}

TEST_CASE("chat templates") {
  const std::vector<ChatMessage> sys_user = {{"system", "Be brief."}, {"user", "Hi!"}};
  const std::vector<ChatMessage> user = {{"user", "Hi!"}};
  const std::vector<ChatMessage> turns = {{"user", "Hi!"}, {"assistant", "Hello."}, {"user", "Bye"}};
  using kvlab::apply_chat_template;
  CHECK(apply_chat_template("chatml", sys_user, true) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  CHECK(apply_chat_template("chatml", user, false) == "<|im_start|>user\nHi!<|im_end|>\n");
  CHECK(apply_chat_template("smollm2", user, true) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  CHECK(apply_chat_template("smollm2", sys_user, false) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
  CHECK(apply_chat_template("qwen2", user, true) ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(apply_chat_template("llama3", sys_user, true) ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(apply_chat_template("llama2", sys_user, true) == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]");
  CHECK(apply_chat_template("llama2", turns, true) == "[INST] Hi! [/INST] Hello. </s><s>[INST] Bye [/INST]");
  CHECK(apply_chat_template("vicuna", user, true) ==
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the user's questions. USER: Hi! ASSISTANT:");
  CHECK(apply_chat_template("vicuna", turns, true) ==
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the user's questions. USER: Hi! ASSISTANT: Hello.</s>"
        "USER: Bye ASSISTANT:");
  CHECK(apply_chat_template("none", sys_user, true) == "Be brief.\nHi!");

  CHECK_THROWS_WITH_AS(apply_chat_template("chatlm", user, true),
                       doctest::Contains("Did you mean: chatml?"), Error);
  CHECK_THROWS_WITH_AS(apply_chat_template("xyzzy-template", user, true),
                       doctest::Contains("Available: auto, chatml, smollm2"), Error);
  CHECK_THROWS_WITH_AS(apply_chat_template("chatml", {{"robot", "x"}}, true),
                       doctest::Contains("role 'robot'"), Error);
  CHECK_THROWS_WITH_AS(apply_chat_template("llama2", {{"user", "a"}, {"user", "b"}}, true),
                       doctest::Contains("must alternate"), Error);

  // The SmolLM2 GGUF's own tokenizer.chat_template.
  const std::string smol_jinja =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + ...";
  CHECK(kvlab::detect_chat_template(smol_jinja) == "smollm2");
  // Qwen2.5's default system prompt contains Qwen2's: the longer one wins (it was read as qwen2).
  const std::string qwen25_jinja =
      "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}{%- endif %}";
  CHECK(kvlab::detect_chat_template(qwen25_jinja) == "qwen2.5");
  CHECK(kvlab::detect_chat_template("<|im_start|>system\\nYou are a helpful assistant.<|im_end|>") == "qwen2");
  CHECK(apply_chat_template("qwen2.5", user, true) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  const Tokenizer smol = Tokenizer::from_file(shared("tokenizers/smollm2/tokenizer.json"));
  const Tokenizer llama = Tokenizer::from_file(shared("tokenizers/llama2/tokenizer.json"));
  CHECK(kvlab::resolve_chat_template("auto", {&smol, "", ""}) == "chatml");
  CHECK(kvlab::resolve_chat_template("auto", {&smol, "SmolLM2-135M-Instruct", ""}) == "smollm2");
  CHECK(kvlab::resolve_chat_template("auto", {&smol, "Qwen2.5-Coder-0.5B-Instruct", ""}) == "qwen2.5");
  CHECK(kvlab::resolve_chat_template("auto", {&llama, "stories260K", ""}) == "none");
  CHECK(kvlab::resolve_chat_template("auto", {&llama, "longchat-7b-v1.5-32k", ""}) == "vicuna");
  CHECK(kvlab::resolve_chat_template("auto", {&llama, "Llama-2-7b-chat-hf", ""}) == "llama2");
  CHECK(kvlab::resolve_chat_template("llama3", {}) == "llama3");
  // The prompt tokenizes with the special tokens intact.
  const auto ids = smol.encode(apply_chat_template("chatml", user, true), true);
  CHECK(ids.front() == smol.token_id("<|im_start|>"));
  CHECK(smol.decode(ids) == apply_chat_template("chatml", user, true));
}

TEST_CASE("datasets: LongBench, LongEval, XSUM, generic JSONL") {
  SUBCASE("LongBench multi_news with the official template") {
    const std::string path = shared("data/longbench/multi_news.jsonl");
    const auto ds = kvlab::read_dataset(path, samples(3));
    CHECK(ds.schema == kvlab::DatasetSchema::LongBench);
    REQUIRE(ds.records.size() == 3);
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    const json r = json::parse(line);
    const auto& rec = ds.records[0];
    CHECK(rec.dataset == "multi_news");
    CHECK(rec.id == r["_id"].get<std::string>());
    CHECK(rec.line == 1);
    CHECK(rec.use_chat_template);
    CHECK(rec.answers == r["answers"].get<std::vector<std::string>>());
    CHECK(rec.prompt ==
          "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n" +
              r["context"].get<std::string>() + "\n\nNow, write a one-page summary of all the news.\n\nSummary:");
  }
  SUBCASE("LongBench Chinese, dataset name from the record") {
    const auto ds = kvlab::read_dataset(shared("data/longbench/multifieldqa_zh.jsonl"), samples(1));
    REQUIRE(ds.records.size() == 1);
    CHECK(ds.records[0].dataset == "multifieldqa_zh");
    CHECK(ds.records[0].prompt.rfind("阅读以下文字并用中文简短回答：\n\n", 0) == 0);
  }
  SUBCASE("LongEval lines") {
    const auto ds = kvlab::read_dataset(shared("data/longeval/lines/200_lines.jsonl"));
    CHECK(ds.schema == kvlab::DatasetSchema::LongEval);
    CHECK(ds.records.size() == 50);
    const auto& rec = ds.records[0];
    CHECK(rec.answers == std::vector<std::string>{"2416"});
    CHECK(rec.prompt.rfind("Below is a record of lines I want you to remember.", 0) == 0);
    CHECK(rec.prompt.find("line torpid-kid: REGISTER_CONTENT is <2416>") != std::string::npos);
  }
  SUBCASE("XSUM") {
    const auto ds = kvlab::read_dataset(shared("data/summarization/xsum_0shot.jsonl"), samples(2));
    CHECK(ds.schema == kvlab::DatasetSchema::Xsum);
    CHECK(ds.records[0].prompt.rfind("###\nArticle: Prison Link Cymru", 0) == 0);
    CHECK(ds.records[0].answers.at(0).rfind("There is a \"chronic\" need", 0) == 0);
  }
  SUBCASE("MT-Bench: the first turn of each question") {
    const auto ds = kvlab::read_dataset(shared("data/mt_bench/question.jsonl"));
    CHECK(ds.schema == kvlab::DatasetSchema::MtBench);
    REQUIRE(ds.records.size() == 80);
    CHECK(ds.records[0].id == "81");
    CHECK(ds.records[0].dataset == "mt_bench");
    CHECK(ds.records[0].prompt.rfind("Compose an engaging travel blog post about a recent trip to Hawaii", 0) == 0);
    CHECK(ds.records[0].prompt.find("Rewrite your previous response") == std::string::npos);
    CHECK(ds.records[0].extra["category"] == "writing");
  }
  SUBCASE("generic JSONL and errors naming file:line") {
    const std::string dir = kvlab::test::temp_dir("datasets");
    const std::string good = dir + "/prompts.jsonl";
    std::ofstream(good) << "{\"prompt\": \"a\", \"id\": \"x1\"}\n\n{\"prompt\": \"b\"}\n";
    const auto ds = kvlab::read_dataset(good);
    REQUIRE(ds.records.size() == 2);
    CHECK(ds.records[0].id == "x1");
    CHECK(ds.records[1].prompt == "b");
    CHECK(ds.records[1].line == 3);
    const std::string text = dir + "/text.jsonl";
    std::ofstream(text) << "{\"text\": \"hello\"}\n";
    CHECK(kvlab::read_dataset(text).records[0].prompt == "hello");

    const std::string bad = dir + "/bad.jsonl";
    std::ofstream(bad) << "{\"prompt\": \"a\"}\n{\"prompt\": oops}\n";
    CHECK_THROWS_WITH_AS(kvlab::read_dataset(bad), doctest::Contains("bad.jsonl:2: not valid JSON"), Error);
    std::ofstream(bad) << "{\"prompt\": \"a\"}\n{\"prompt\": 3.5}\n";
    CHECK_THROWS_WITH_AS(kvlab::read_dataset(bad), doctest::Contains("bad.jsonl:2: field 'prompt' must be a string"), Error);
    std::ofstream(bad) << "{\"question\": \"a\"}\n";
    CHECK_THROWS_WITH_AS(kvlab::read_dataset(bad), doctest::Contains("unknown record schema (keys: question)"), Error);
    CHECK_THROWS_WITH_AS(kvlab::read_dataset(dir + "/missing.jsonl"), doctest::Contains("no such file"), Error);
    // A LongBench file without the config/ folder beside it.
    std::ofstream(bad) << R"({"input": "q", "context": "c", "answers": ["a"], "dataset": "qasper"})" << "\n";
    CHECK_THROWS_WITH_AS(kvlab::read_dataset(bad), doctest::Contains("dataset2prompt.json"), Error);
    const auto lb = kvlab::read_dataset(bad, prompts_at(shared("data/longbench/config/dataset2prompt.json")));
    CHECK(lb.records[0].prompt.find("Article: c\n\n Answer the question") != std::string::npos);
  }
  SUBCASE("prompt template formatting") {
    const json r = {{"context", "C"}, {"input", "I"}};
    CHECK(kvlab::format_prompt_template("{context}|{{x}}|{input}", r, "t") == "C|{x}|I");
    CHECK_THROWS_WITH_AS(kvlab::format_prompt_template("{nope}", r, "t"), doctest::Contains("'{nope}' missing"), Error);
    CHECK(kvlab::longbench_skips_chat_template("lcc"));
    CHECK_FALSE(kvlab::longbench_skips_chat_template("qasper"));
  }
  SUBCASE("middle truncation (LongBench rule)") {
    const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(kvlab::truncate_middle(ids, 4) == std::vector<int64_t>{0, 1, 8, 9});
    CHECK(kvlab::truncate_middle(ids, 5) == std::vector<int64_t>{0, 1, 8, 9});  // half = int(5/2)
    CHECK(kvlab::truncate_middle(ids, 10) == ids);
    CHECK(kvlab::truncate_middle(ids, 100) == ids);
    CHECK_THROWS_AS(kvlab::truncate_middle(ids, 0), Error);
  }
}
