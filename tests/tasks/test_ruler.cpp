// RULER (tasks/ruler.h) against NVIDIA/RULER's generators and evaluate.py (c3f5e3b): one sample per
// task built on stories260K's tokenizer, checked for RULER's structure — the templates and answer
// prefixes of constants.py verbatim (niah's singular rewrite included), the needle sentences, their
// count and their keys and values, vt's chain and one-shot example, cwe's repetition counts and
// numbering, fwe's Zipf ranks — and for the length: within the budget (prompt + tokens to generate
// <= max_seq_length) and one search step of it. The scorer on a hand-checked set of
// string_match_all / string_match_part cases and postprocess_pred.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "kvlab/model/model.h"
#include "kvlab/core/check.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/niah.h"
#include "kvlab/tasks/ruler.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

std::string stories_dir() { return test::shared_dir() + "/models/stories260K"; }
std::string essays_dir() { return test::shared_dir() + "/data/niah/PaulGrahamEssays"; }
std::string words_file() { return std::string(KVLAB_SOURCE_DIR) + "/data/ruler/wonderwords.json"; }

int64_t count_of(const std::string& s, const std::string& sub) {
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + 1)) ++n;
  return n;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

}  // namespace

TEST_CASE("ruler: one sample per task has RULER's structure and fits its length (stories260K's tokenizer)") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  Tokenizer tok = load_model_tokenizer(resolve_model(stories_dir()));
  const RulerSources src = ruler_sources(words_file(), read_haystack(essays_dir()));
  CHECK(src.nouns.size() == 6782);  // wonderwords 3.0.1
  CHECK(src.adjectives.size() == 910);
  CHECK(src.verbs.size() == 1041);
  RulerTokenCount count;  // no chat template: RULER's `base`
  count.prompt = [&](const std::string& input, const std::string& prefix) {
    return int64_t(tok.encode(input + prefix, /*add_bos=*/true).size());
  };
  count.text = [&](const std::string& t) { return int64_t(tok.encode(t, false).size()); };
  const int64_t L = 2048;
  const std::regex needle_re(R"(One of the special magic (numbers|uuids) for ([^ ]+) is: ([0-9a-f-]+)\.)");
  for (const auto& t : parse_ruler_tasks("all")) {
    CAPTURE(t.name);
    const auto samples = make_ruler_samples(t, src, L, 1, 42, count);
    REQUIRE(samples.size() == 1);
    const RulerSample& s = samples[0];
    // The budget: the prompt (answer prefix included) + tokens to generate, as RULER's assert.
    CHECK(s.length == count.prompt(s.input, s.answer_prefix) + t.tokens_to_generate);
    CHECK(s.length <= L);
    CHECK(s.length > L * 3 / 4);  // RULER's search ends one step (a few lines / words) below the budget
    CHECK(s.context_end < s.input.size());
    // The same arguments give the same sample; another seed another one.
    CHECK(make_ruler_samples(t, src, L, 1, 42, count)[0].input == s.input);
    CHECK(make_ruler_samples(t, src, L, 1, 43, count)[0].input != s.input);
    if (t.kind == "niah") {
      const bool singular = t.num_q * t.num_v == 1;
      const std::string v = singular ? t.needle_v.substr(0, t.needle_v.size() - 1) : t.needle_v;
      CHECK(starts_with(s.input, singular ? fmt::format("A special magic {} is hidden within the following text. Make "
                                                        "sure to memorize it. I will quiz you about the {} afterwards.\n", v, v)
                                          : fmt::format("Some special magic {} are hidden within the following text. "
                                                        "Make sure to memorize it. I will quiz you about the {} "
                                                        "afterwards.\n", v, v)));
      // The needles: num_k·num_v real ones (plus a distractor on every other line of a needle haystack).
      std::map<std::string, std::vector<std::string>> by_key;
      for (std::sregex_iterator it(s.input.begin(), s.input.end(), needle_re), end; it != end; ++it) {
        CHECK((*it)[1] == t.needle_v);  // always the plural in the needle
        by_key[(*it)[2]].push_back((*it)[3]);
      }
      const int num_k = std::max(t.num_k, t.num_q);
      if (t.haystack == "needle") CHECK(int64_t(by_key.size()) == s.haystack + 1);
      else CHECK(int64_t(by_key.size()) == num_k);
      if (t.haystack == "noise") CHECK(count_of(s.input, "The grass is green. The sky is blue. The sun is yellow. "
                                                         "Here we go. There and back again.") == s.haystack);
      // The question names the queried keys (Oxford comma for several), the outputs are their values.
      const std::string q = s.input.substr(s.input.rfind("\nWhat "));
      CHECK(starts_with(q, fmt::format("\nWhat {} the special magic {} for ", singular ? "is" : "are all", v)));
      CHECK(ends_with(q, " mentioned in the provided text?"));
      CHECK(starts_with(s.answer_prefix, fmt::format(" The special magic {} for ", v)));
      CHECK(ends_with(s.answer_prefix, singular ? " mentioned in the provided text is" : " mentioned in the provided text are"));
      CHECK(s.outputs.size() == size_t(t.num_q * t.num_v));
      int64_t found = 0;
      for (const auto& [key, vals] : by_key)
        if (q.find(key) != std::string::npos) {
          ++found;
          for (const auto& val : vals) CHECK(std::count(s.outputs.begin(), s.outputs.end(), val) == 1);
        }
      CHECK(found == t.num_q);
      if (t.num_q > 1) CHECK(count_of(q, ", and ") == 1);
      if (t.needle_v == "uuids")
        for (const auto& o : s.outputs) CHECK(std::regex_match(o, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
      if (t.needle_v == "numbers")
        for (const auto& o : s.outputs) CHECK(std::regex_match(o, std::regex("[1-9][0-9]{6}")));
    } else if (t.kind == "vt") {
      // The one-shot example (3-letter names), then the task: a chain of 5 five-letter names.
      const std::string task_start = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
      CHECK(starts_with(s.input, task_start));
      CHECK(count_of(s.input, task_start) == 2);
      const std::string main = s.input.substr(s.input.rfind(task_start));
      REQUIRE(s.outputs.size() == 5);
      std::smatch m;
      REQUIRE(std::regex_search(main, m, std::regex("\nVAR " + s.outputs[0] + " = ([0-9]{5})\n")));
      const std::string value = m[1];
      size_t at = main.find("VAR " + s.outputs[0] + " = " + value);
      for (int j = 1; j < 5; ++j) {  // in order, each with RULER's trailing space
        const size_t next = main.find("\nVAR " + s.outputs[j] + " = VAR " + s.outputs[j - 1] + " \n");
        CHECK(next != std::string::npos);
        CHECK(next > at);
        at = next;
      }
      CHECK(ends_with(main, "\nQuestion: Find all variables that are assigned the value " + value + " in the text above."));
      CHECK(s.answer_prefix == " Answer: According to the chain(s) of variable assignment in the text above, 5 "
                               "variables are assigned the value " + value + ", they are: ");
      const std::string example = s.input.substr(0, s.input.rfind(task_start));
      CHECK(std::regex_search(example, std::regex(", they are:  [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}\n\n$")));
    } else if (t.kind == "cwe") {
      const std::string head = "Below is a numbered list of words. In these words, some appear more often than others. "
                               "Memorize the ones that appear most often.\n";
      CHECK(count_of(s.input, head) == 2);
      CHECK(s.answer_prefix == " Answer: The top 10 words that appear most often in the list are:");
      CHECK(ends_with(s.input, "\nQuestion: What are the 10 most common words in the above list?"));
      // The task's list: below 4096 tokens each common word 6 times, each other once, numbered 1..n.
      const size_t from = s.input.rfind(head) + head.size(), to = s.input.rfind("\nQuestion:");
      const std::string list = s.input.substr(from, to - from);
      std::map<std::string, int> freq;
      int64_t n = 0;
      std::regex item("([0-9]+)\\. ([^ ]+( [^ 0-9][^ ]*)*)( |$)");
      for (std::sregex_iterator it(list.begin(), list.end(), item), end; it != end; ++it) {
        CHECK(std::stoll((*it)[1]) == ++n);
        ++freq[(*it)[2]];
      }
      REQUIRE(s.outputs.size() == 10);
      for (const auto& w : s.outputs) CHECK(freq[w] == 6);
      CHECK(int64_t(freq.size()) == s.haystack);
      CHECK(n == 60 + (s.haystack - 10));
      // The few-shot example's answer, numbered.
      CHECK(std::regex_search(s.input, std::regex(" Answer: The top 10 words that appear most often in the list are: 1\\. .* 10\\. [^\n]+\nBelow is")));
    } else if (t.kind == "fwe") {
      CHECK(starts_with(s.input, "Read the following coded text and track the frequency of each coded word. Find the "
                                 "three most frequently appeared coded words. "));
      CHECK(ends_with(s.input, "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the "
                               "three most frequently appeared words in the above coded text?"));
      std::map<std::string, int64_t> freq;
      const std::string text = s.input.substr(0, s.context_end);
      std::regex word("(\\.\\.\\.|[a-z]{6})( |$)");
      for (std::sregex_iterator it(text.begin() + text.find("words. ") + 7, text.end(), word), end; it != end; ++it)
        ++freq[(*it)[1]];
      REQUIRE(s.outputs.size() == 3);
      // Zipf α = 2: rank k appears ⌊n·k⁻²/ζ(2)⌋ times; "..." is rank 1, the answers ranks 2, 3, 4.
      CHECK(freq["..."] > freq[s.outputs[0]]);
      CHECK(freq[s.outputs[0]] > freq[s.outputs[1]]);
      CHECK(freq[s.outputs[1]] > freq[s.outputs[2]]);
      const double n1 = double(freq["..."]);
      CHECK(double(freq[s.outputs[0]]) == doctest::Approx(n1 / 4).epsilon(0.05));
      CHECK(double(freq[s.outputs[1]]) == doctest::Approx(n1 / 9).epsilon(0.1));
    }
  }
  CHECK_THROWS_WITH_AS(parse_ruler_tasks("niah_single_9"), doctest::Contains("--tasks: unknown task 'niah_single_9'"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_ruler_tasks("qa_1"), doctest::Contains("SQuAD"), Error);
  CHECK(parse_ruler_tasks("all").size() == 11);
}

TEST_CASE("ruler niah_multiquestion: one context, its four keys asked one question each (issue 53)") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  Tokenizer tok = load_model_tokenizer(resolve_model(stories_dir()));
  const RulerSources src = ruler_sources(words_file(), read_haystack(essays_dir()));
  RulerTokenCount count;
  count.prompt = [&](const std::string& input, const std::string& prefix) {
    return int64_t(tok.encode(input + prefix, /*add_bos=*/true).size());
  };
  count.text = [&](const std::string& t) { return int64_t(tok.encode(t, false).size()); };
  // Not one of RULER's tasks: "all" leaves it out; named, it runs.
  for (const auto& t : parse_ruler_tasks("all")) CHECK(t.name != "niah_multiquestion");
  const RulerTask t = parse_ruler_tasks("niah_multiquestion").at(0);
  const int64_t L = 2048;
  const auto qs = make_ruler_samples(t, src, L, 2, 42, count);
  REQUIRE(qs.size() == 8);  // 2 contexts x 4 questions
  const std::regex needle_re(R"(One of the special magic numbers for ([^ ]+) is: ([0-9]+)\.)");
  std::set<std::string> asked;
  for (size_t i = 0; i < qs.size(); ++i) {
    const RulerSample& s = qs[i];
    CAPTURE(i);
    CHECK(s.index == int64_t(i));
    CHECK(s.context_group == int64_t(i / 4));
    CHECK(s.question_index == int64_t(i % 4));
    CHECK(s.to_json()["question_index"] == int64_t(i % 4));
    const std::string context = s.input.substr(0, s.context_end);
    CHECK(context == qs[i / 4 * 4].input.substr(0, qs[i / 4 * 4].context_end));  // one context, four questions
    // The plural introduction (four needles), then one key asked: niah.py's singular question.
    CHECK(starts_with(s.input, "Some special magic numbers are hidden within the following text."));
    std::map<std::string, std::string> needles;
    for (std::sregex_iterator it(context.begin(), context.end(), needle_re), end; it != end; ++it)
      needles[(*it)[1]] = (*it)[2];
    REQUIRE(needles.size() == 4);
    REQUIRE(s.queries.size() == 1);
    const std::string& key = s.queries[0];
    CHECK(s.input.substr(s.context_end) == "\nWhat is the special magic number for " + key +
                                               " mentioned in the provided text?");
    CHECK(s.answer_prefix == " The special magic number for " + key + " mentioned in the provided text is");
    REQUIRE(needles.count(key));
    CHECK(s.outputs == std::vector<std::string>{needles[key]});
    CHECK(s.length == count.prompt(s.input, s.answer_prefix) + t.tokens_to_generate);
    CHECK(s.length <= L);
    asked.insert(std::to_string(s.context_group) + "/" + key);
  }
  CHECK(asked.size() == 8);  // each context's four keys, each once
  // The contexts are niah_multiquery's samples (same seed, same haystack and needles).
  RulerTask mq = parse_ruler_tasks("niah_multiquery").at(0);
  mq.name = t.name;  // the seed follows the task's name
  const auto fitted = make_ruler_samples(mq, src, L, 2, 42, count);
  CHECK(fitted[1].input.substr(0, fitted[1].context_end) == qs[4].input.substr(0, qs[4].context_end));
}

TEST_CASE("ruler: string_match_all / string_match_part and postprocess_pred as evaluate.py (hand-checked)") {
  // postprocess_pred: strip, each of \x00-\x1f -> '\n', strip.
  CHECK(ruler_postprocess("  \x01 abc\tdef\x1f \n") == "abc\ndef");
  CHECK(ruler_postprocess("") == "");
  auto all = [](const std::string& out, std::vector<std::string> refs) {
    return ruler_score(out, {{"outputs", refs}, {"match", "all"}})["score"].get<double>();
  };
  auto part = [](const std::string& out, std::vector<std::string> refs) {
    return ruler_score(out, {{"outputs", refs}, {"match", "part"}})["score"].get<double>();
  };
  // RULER: sum(r.lower() in pred.lower() for r in ref) / len(ref)
  CHECK(all(" 1234567.", {"1234567"}) == 1.0);
  CHECK(all("The numbers are 1234567 and 7654321", {"1234567", "7654321", "1111111"}) == doctest::Approx(2.0 / 3));
  CHECK(all("ABC def", {"abc", "DEF"}) == 1.0);              // case-insensitive both ways
  CHECK(all("12345678", {"1234567"}) == 1.0);                // a substring, no word boundary
  CHECK(all("none here", {"1234567"}) == 0.0);
  CHECK(all("abc\x02xyz", {"abc\nxyz"}) == 1.0);             // control characters become newlines first
  CHECK(part("Paris, France", {"London", "paris"}) == 1.0);  // any one
  CHECK(part("Rome", {"London", "Paris"}) == 0.0);
}

TEST_CASE("ruler: kvlab ruler on stories260K — samples, table, shards merged equal one run, resume, errors") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  const std::string dir = test::temp_dir("ruler_cli");
  const std::string base = test::kvlab_bin() + " --threads 2 ruler --model " + stories_dir() + " --haystack-dir " +
                           essays_dir() + " --words " + words_file() +
                           " --tasks niah_single_2,fwe --lengths 512 --samples 3 --method snapkv --ratio 0.5 --quiet"
                           " --obs-queries 32";
  std::string out;
  REQUIRE(test::run_command(base + " --out " + dir + "/run", &out) == 0);
  INFO(out);
  CHECK(out.find("RULER (string_match_all x 100)") != std::string::npos);
  auto lines = [](const std::string& p) {
    std::ifstream f(p);
    std::vector<nlohmann::json> v;
    for (std::string l; std::getline(f, l);)
      if (!l.empty()) v.push_back(nlohmann::json::parse(l));
    return v;
  };
  // The samples, for any other tool: RULER's fields and the context / question split.
  const auto data = lines(dir + "/run/data/fwe_512.jsonl");
  REQUIRE(data.size() == 3);
  for (const auto& d : data) {
    CHECK(d["context"].get<std::string>() + d["question"].get<std::string>() == d["input"].get<std::string>());
    CHECK(starts_with(d["question"].get<std::string>(), "\nQuestion: Do not provide any explanation."));
    CHECK(d["outputs"].size() == 3);
    CHECK(d["length"].get<int64_t>() <= 512);
  }
  CHECK(lines(dir + "/run/pred/snapkv_ratio0.5/niah_single_2_512.jsonl").size() == 3);
  std::ifstream f(dir + "/run/result.json");
  const auto res = nlohmann::json::parse(f);
  REQUIRE(res["ruler"].size() == 2);  // exact and snapkv at length 512
  CHECK(res["ruler"][1]["branch"] == "snapkv_ratio0.5");
  const double avg = res["ruler"][1]["average"].get<double>();
  CHECK(avg == doctest::Approx((res["ruler"][1]["niah_single_2"].get<double>() + res["ruler"][1]["fwe"].get<double>()) / 2));
  // Two shards merged: the same samples, predictions and table as the single run.
  for (int i = 0; i < 2; ++i)
    REQUIRE(test::run_command(base + fmt::format(" --shard {}/2 --out {}/s{}", i, dir, i), &out) == 0);
  REQUIRE(test::run_command(test::kvlab_bin() + " merge " + dir + "/s0 " + dir + "/s1 --out " + dir + "/merged", &out) == 0);
  std::ifstream fm(dir + "/merged/result.json");
  const auto merged = nlohmann::json::parse(fm);
  CHECK(merged["ruler"] == res["ruler"]);
  CHECK(lines(dir + "/merged/data/fwe_512.jsonl") == data);
  CHECK(lines(dir + "/merged/pred/exact/fwe_512.jsonl").size() == 3);
  // Shards written before rows carried "task" and "length": merge takes them from the samples.
  for (const char* s : {"/s0", "/s1"}) {
    auto r = nlohmann::json::parse(test::read_file(dir + s + "/result.json"));
    for (auto& row : r["rows"]) row.erase("task"), row.erase("length");
    std::ofstream(dir + s + "/result.json", std::ios::trunc) << r.dump(1);
  }
  REQUIRE(test::run_command(test::kvlab_bin() + " merge " + dir + "/s0 " + dir + "/s1 --out " + dir + "/merged_old", &out) == 0);
  CHECK(nlohmann::json::parse(test::read_file(dir + "/merged_old/result.json"))["ruler"] == res["ruler"]);
  // Resume: the same command over the same folder decodes nothing again, and leaves the complete
  // run's result.json as it was, provenance included, even from another thread count. Before, it
  // was rewritten as this invocation's run (its date, its threads; another binary's sha).
  std::string again;
  std::string one_thread = base;
  one_thread.replace(one_thread.find("--threads 2"), 11, "--threads 1");
  REQUIRE(test::run_command(one_thread + " --out " + dir + "/run", &again) == 0);
  std::ifstream f2(dir + "/run/result.json");
  const auto resumed = nlohmann::json::parse(f2);
  CHECK(resumed["ruler"] == res["ruler"]);
  CHECK(resumed["context"] == res["context"]);
  CHECK(resumed["complete"] == true);
  CHECK(!resumed["context"].contains("earlier_runs"));
  {  // ... also when another binary made it (its git_sha changed by hand)
    auto doctored = resumed;
    doctored["context"]["git_sha"] = std::string(40, '0');
    std::ofstream(dir + "/run/result.json") << doctored.dump(1);
    REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
    CHECK(nlohmann::json::parse(test::read_file(dir + "/run/result.json"))["context"] == doctored["context"]);
    // ... but a record decoded again (a line of another model) makes it this binary's run, naming
    // the one before.
    const std::string pred = dir + "/run/pred/snapkv_ratio0.5/fwe_512.jsonl";
    auto pl = lines(pred);
    pl[0]["model_key"] = "0123456789abcdef";
    {
      std::ofstream o(pred, std::ios::trunc);
      for (const auto& l : pl) o << l.dump() << "\n";
    }
    REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
    CHECK(again.find("running them again") != std::string::npos);
    const auto redone = nlohmann::json::parse(test::read_file(dir + "/run/result.json"));
    CHECK(redone["complete"] == true);
    CHECK(redone["context"]["git_sha"] == res["context"]["git_sha"]);
    REQUIRE(redone["context"].contains("earlier_runs"));
    CHECK(redone["context"]["earlier_runs"][0]["git_sha"] == std::string(40, '0'));
    CHECK(redone["ruler"] == res["ruler"]);
  }
  // An incomplete run of another binary (here: its git_sha changed by hand, then killed) finished by
  // this one: the result.json says which binaries wrote before it. Before: the resuming binary's
  // git_sha replaced theirs, and a shard computed over several commits claimed the last.
  {
    auto doctored = resumed;
    doctored["context"]["git_sha"] = std::string(40, '0');
    doctored["context"]["git_dirty"] = false;
    doctored["context"]["date"] = "2026-01-01T00:00:00Z";
    doctored["context"].erase("earlier_runs");
    doctored["complete"] = false;
    std::ofstream(dir + "/run/result.json") << doctored.dump(1);
  }
  REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
  std::ifstream f3(dir + "/run/result.json");
  const auto ctx3 = nlohmann::json::parse(f3)["context"];
  REQUIRE(ctx3.contains("earlier_runs"));
  CHECK(ctx3["earlier_runs"] ==
        nlohmann::json::parse(R"([{"git_sha": "0000000000000000000000000000000000000000", "git_dirty": false,)"
                              R"( "date": "2026-01-01T00:00:00Z"}])"));
  CHECK(ctx3["git_sha"] == resumed["context"]["git_sha"]);
  // ... and keeps saying it on the next resume, which finds the run complete and leaves it alone.
  REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
  std::ifstream f4(dir + "/run/result.json");
  CHECK(nlohmann::json::parse(f4)["context"] == ctx3);
  // An interrupted run resumed by the binary that made it names nothing earlier, unless it is a
  // dirty build (its sha does not say what code it ran, so each of its runs is named).
  {
    auto doctored = nlohmann::json::parse(test::read_file(dir + "/run/result.json"));
    doctored["context"].erase("earlier_runs");
    doctored["complete"] = false;
    std::ofstream(dir + "/run/result.json") << doctored.dump(1);
  }
  REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
  const auto ctx4 = nlohmann::json::parse(test::read_file(dir + "/run/result.json"))["context"];
  if (!ctx4["git_dirty"].get<bool>())
    CHECK(!ctx4.contains("earlier_runs"));
  else
    CHECK(ctx4["earlier_runs"].size() == 1);
  // The same sha built from another tree (dirty vs clean) is another binary: named, not merged away.
  {
    auto doctored = nlohmann::json::parse(test::read_file(dir + "/run/result.json"));
    doctored["context"]["git_dirty"] = !doctored["context"]["git_dirty"].get<bool>();
    doctored["context"].erase("earlier_runs");
    doctored["complete"] = false;
    std::ofstream(dir + "/run/result.json") << doctored.dump(1);
  }
  REQUIRE(test::run_command(base + " --out " + dir + "/run", &again) == 0);
  const auto runs5 = nlohmann::json::parse(test::read_file(dir + "/run/result.json"))["context"]["earlier_runs"];
  REQUIRE(runs5.size() == 1);
  CHECK(runs5[0]["git_sha"] == ctx3["git_sha"]);
  CHECK(runs5[0]["git_dirty"] == !ctx3["git_dirty"].get<bool>());
  // --overwrite reuses the lines still valid, so it names the binaries before it too.
  REQUIRE(test::run_command(base + " --overwrite --out " + dir + "/run", &again) == 0);
  const auto runs6 = nlohmann::json::parse(test::read_file(dir + "/run/result.json"))["context"]["earlier_runs"];
  CHECK(runs6.size() >= 1);
  CHECK(runs6[0] == runs5[0]);
  // --data-only: the very same samples, nothing decoded.
  REQUIRE(test::run_command(base + " --data-only --out " + dir + "/data_only", &out) == 0);
  CHECK(lines(dir + "/data_only/data/fwe_512.jsonl") == data);
  CHECK(!fs::exists(dir + "/data_only/pred"));
  // ruler eval: another tool's predictions (bench/ruler_kvpress.py's layout) scored beside kvlab's; a
  // kvpress_<x> folder is compared with kvlab's <x>. Here a copy of snapkv's outputs: all the same.
  fs::create_directories(dir + "/other/pred/kvpress_snapkv_ratio0.5");
  {
    std::ofstream o(dir + "/other/pred/kvpress_snapkv_ratio0.5/fwe_512.jsonl");
    for (const auto& l : lines(dir + "/run/pred/snapkv_ratio0.5/fwe_512.jsonl"))
      o << nlohmann::json{{"id", l["id"]}, {"output", l["output"]}}.dump() << "\n";
  }
  REQUIRE(test::run_command(test::kvlab_bin() + " ruler eval " + dir + "/run " + dir + "/other --out " + dir + "/ev", &out) == 0);
  std::ifstream fe(dir + "/ev/result.json");
  const auto ev = nlohmann::json::parse(fe);
  bool seen = false;
  for (const auto& r : ev["rows"])
    if (r["branch"] == "kvpress_snapkv_ratio0.5") {
      seen = true;
      CHECK(r["same_as_kvlab"] == 1.0);
      CHECK(r["score"].get<double>() == doctest::Approx(res["ruler"][1]["fwe"].get<double>()));
    }
  CHECK(seen);
  CHECK(ev["ruler"][0] == res["ruler"][0]);  // kvlab's own branches score as the run scored them
  {
    std::ofstream o(dir + "/other/pred/kvpress_snapkv_ratio0.5/fwe_512.jsonl", std::ios::app);
    o << "{\"id\": \"99\", \"output\": \"x\"}\n";
  }
  CHECK(test::run_command(test::kvlab_bin() + " ruler eval " + dir + "/run " + dir + "/other --out " + dir + "/ev2", &out) != 0);
  CHECK(out.find("sample 99 is not in") != std::string::npos);
  // Errors name the flag.
  std::string err;
  const std::string bare = test::kvlab_bin() + " ruler --model " + stories_dir() + " --haystack-dir " + essays_dir();
  CHECK(test::run_command(bare + " --words " + words_file() + " --tasks niah_single_7 --out " + dir + "/e1", &err) != 0);
  CHECK(err.find("--tasks: unknown task 'niah_single_7'") != std::string::npos);
  CHECK(test::run_command(bare + " --words /nonexistent.json --out " + dir + "/e2", &err) != 0);
  CHECK(err.find("--words /nonexistent.json: not found") != std::string::npos);
}

// Issue 50: ruler needed data/ruler/wonderwords.json in the working directory, and the task
// commands' data defaults ignored KVLAB_SHARED.
TEST_CASE("ruler: its word lists are found from any directory; the default haystack follows KVLAB_SHARED") {
  if (!fs::exists(stories_dir() + "/model.safetensors")) {
    MESSAGE("skipped: stories260K not found (set KVLAB_SHARED)");
    return;
  }
  auto dir = test::temp_dir("kvlab_ruler_defaults");
  const std::string in_dir = "cd " + dir + " && ";
  const std::string run = test::kvlab_bin() + " --threads 2 ruler --model " + stories_dir() +
                          " --lengths 512 --samples 1 --method exact --data-only --quiet --out ";
  std::string out;
  // No --words, and no data/ruler/ in the working directory: kvlab's own list (fwe draws its words).
  REQUIRE_MESSAGE(test::run_command(in_dir + run + dir + "/r --tasks fwe", &out) == 0, out);
  CHECK(fs::exists(dir + "/r/data/fwe_512.jsonl"));
  // An essay task without --haystack-dir looks under $KVLAB_SHARED.
  CHECK(test::run_command(in_dir + "KVLAB_SHARED=" + dir + "/elsewhere " + run + dir + "/e --tasks niah_single_2", &out) != 0);
  CHECK_MESSAGE(out.find(dir + "/elsewhere/data/niah/PaulGrahamEssays") != std::string::npos, out);
}

// Issue 50: `ruler eval` scored what it should have refused: a repeated id (the last won), a file
// with 1 of 3 predictions (scored 100 beside complete ones), an empty file (the branch dropped), a
// run still being written, predictions of other samples (data/ written again with another --seed);
// and `ruler --overwrite` with other methods left the old branches in pred/, where eval scored them.
TEST_CASE("ruler eval: refuses repeated, missing and foreign predictions and a run in progress; --overwrite "
          "leaves no other config's branch") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  const std::string dir = test::temp_dir("ruler_eval_checks");
  const std::string base = test::kvlab_bin() + " --threads 2 ruler --model " + stories_dir() + " --haystack-dir " +
                           essays_dir() + " --words " + words_file() +
                           " --tasks fwe --lengths 512 --samples 3 --quiet --obs-queries 32 --out " + dir + "/run";
  std::string out;
  REQUIRE(test::run_command(base + " --method snapkv --ratio 0.5", &out) == 0);
  const std::string eval = test::kvlab_bin() + " ruler eval " + dir + "/run " + dir + "/other --overwrite --out " +
                           dir + "/ev";
  const std::string theirs = dir + "/other/pred/kvpress_snapkv_ratio0.5/fwe_512.jsonl";
  fs::create_directories(fs::path(theirs).parent_path());
  std::vector<std::string> mine;  // kvlab's snapkv lines, as {"id", "output"} (no answers to check)
  {
    std::ifstream f(dir + "/run/pred/snapkv_ratio0.5/fwe_512.jsonl");
    for (std::string l; std::getline(f, l);) {
      const auto j = nlohmann::json::parse(l);
      mine.push_back(nlohmann::json{{"id", j["id"]}, {"output", j["output"]}}.dump());
    }
  }
  REQUIRE(mine.size() == 3);
  auto write_theirs = [&](const std::vector<std::string>& ls) {
    std::ofstream o(theirs, std::ios::trunc);
    for (const auto& l : ls) o << l << "\n";
  };
  write_theirs(mine);
  REQUIRE(test::run_command(eval, &out) == 0);
  SUBCASE("an id given twice") {
    write_theirs({mine[0], mine[1], mine[2], mine[1]});
    CHECK(test::run_command(eval, &out) != 0);
    CHECK(out.find("line 4: sample " + nlohmann::json::parse(mine[1])["id"].get<std::string>() +
                   " again (first on line 2)") != std::string::npos);
  }
  SUBCASE("a file with 1 of its 3 samples; scored over its own with --partial") {
    write_theirs({mine[1]});
    CHECK(test::run_command(eval, &out) != 0);
    CHECK(out.find("1 of the 3 samples") != std::string::npos);
    CHECK(out.find("--partial") != std::string::npos);
    REQUIRE(test::run_command(eval + " --partial", &out) == 0);
    // (The parsed file is held in a variable: a range-for over a member of a temporary reads a
    // destroyed object, and this loop had checked nothing.)
    const auto ev = nlohmann::json::parse(test::read_file(dir + "/ev/result.json"));
    int64_t found = 0;
    for (const auto& r : ev["rows"])
      if (r["branch"] == "kvpress_snapkv_ratio0.5") {
        CHECK(r["n"] == 1);
        ++found;
      }
    CHECK(found > 0);
  }
  SUBCASE("an empty file") {
    write_theirs({});
    CHECK(test::run_command(eval, &out) != 0);
    CHECK(out.find("0 of the 3 samples") != std::string::npos);
    CHECK(out.find("(empty)") != std::string::npos);
  }
  SUBCASE("a run still being written") {
    const std::string lock = dir + "/run/.kvlab.lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 0) == 0);
    REQUIRE(::pwrite(fd, "4242\n", 5, 0) == 5);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    CHECK(test::run_command(eval, &out) != 0);
    CHECK(out.find("is being written by a kvlab run (pid 4242)") != std::string::npos);
    ::close(fd);
    CHECK(test::run_command(eval, &out) == 0);
  }
  SUBCASE("predictions of other samples: data/ written again with another --seed") {
    REQUIRE(test::run_command(base + " --method snapkv --ratio 0.5 --data-only --seed 43 --overwrite", &out) == 0);
    CHECK(test::run_command(eval, &out) != 0);
    INFO(out);
    CHECK(out.find("predictions of other samples") != std::string::npos);
  }
  SUBCASE("ruler --overwrite with other methods removes the old branches") {
    REQUIRE(test::run_command(base + " --method knorm --ratio 0.5 --overwrite", &out) == 0);
    CHECK(out.find("removed pred/snapkv_ratio0.5") != std::string::npos);
    CHECK(!fs::exists(dir + "/run/pred/snapkv_ratio0.5"));
    CHECK(fs::exists(dir + "/run/pred/knorm_ratio0.5/fwe_512.jsonl"));
    fs::remove_all(dir + "/other/pred/kvpress_snapkv_ratio0.5");
    REQUIRE(test::run_command(eval, &out) == 0);
    const auto ev = nlohmann::json::parse(test::read_file(dir + "/ev/result.json"));
    REQUIRE(!ev["rows"].empty());
    for (const auto& r : ev["rows"]) CHECK(r["branch"] != "snapkv_ratio0.5");
  }
}

// Issue 50: a run that failed before any result still left config.json in --out, and the corrected
// command was refused ("holds the results of another config"). Now --out is left as it was found.
TEST_CASE("ruler: a run that fails before any result leaves --out as it found it") {
  if (!fs::exists(stories_dir() + "/model.safetensors") || !fs::exists(essays_dir())) {
    MESSAGE("skipped: stories260K or the essays not found (set KVLAB_SHARED)");
    return;
  }
  const std::string dir = test::temp_dir("ruler_failed_out");
  const std::string base = test::kvlab_bin() + " --threads 2 ruler --model " + stories_dir() + " --haystack-dir " +
                           essays_dir() + " --words " + words_file() + " --samples 1 --quiet --obs-queries 32 --method "
                           "snapkv --ratio 0.5";
  std::string out;
  // niah_multivalue at 256 tokens: its template and 128 tokens to generate do not fit (found only
  // when its samples are made, after the run folder was opened).
  for (const bool existed : {false, true}) {
    const std::string d = dir + (existed ? "/empty" : "/absent");
    if (existed) fs::create_directories(d);
    CHECK(test::run_command(base + " --tasks niah_multivalue --lengths 256 --out " + d, &out) != 0);
    INFO(out);
    CHECK(out.find("does not fit") != std::string::npos);
    CHECK(fs::exists(d) == existed);
    if (existed) CHECK(fs::is_empty(d));
    REQUIRE(test::run_command(base + " --tasks fwe --lengths 512 --out " + d, &out) == 0);
    CHECK(fs::exists(d + "/pred/snapkv_ratio0.5/fwe_512.jsonl"));
  }
}

// Issue 49: a result's identity is in its fields, never parsed back from a name. The table reads
// each row's "task" and "length" (ruler_tag_row); the dataset's name plays no part.
TEST_CASE("ruler_score_table: rows carry their task and length as fields") {
  nlohmann::json rows = nlohmann::json::array();
  auto row = [](const std::string& branch, const std::string& dataset, double score) {
    return nlohmann::json{{"branch", branch}, {"dataset", dataset}, {"score", score}};
  };
  rows.push_back(row("exact", "anything", 80.0));
  ruler_tag_row(rows.back(), "niah_single_1", 4096);
  rows.push_back(row("exact", "fwe_4096", 40.0));  // a name that looks like one, but no fields: ignored
  rows.push_back(row("exact", "x", 60.0));
  ruler_tag_row(rows.back(), "vt", 4096);
  rows.push_back(row("h2o_ratio0.5", "y", 20.0));
  ruler_tag_row(rows.back(), "vt", 1024);
  rows.push_back(row("h2o_ratio0.5", "z", 10.0));
  ruler_tag_row(rows.back(), "not_a_task", 1024);  // ignored
  const auto t = ruler_score_table(rows);
  REQUIRE(t.size() == 2);
  CHECK(t[0]["branch"] == "h2o_ratio0.5");  // lengths ascending
  CHECK(t[0]["length"] == 1024);
  CHECK(t[0]["average"].get<double>() == doctest::Approx(20.0));
  CHECK(t[1]["branch"] == "exact");
  CHECK(t[1]["length"] == 4096);
  CHECK(!t[1].contains("fwe"));
  CHECK(t[1]["niah_single_1"].get<double>() == doctest::Approx(80.0));
  CHECK(t[1]["average"].get<double>() == doctest::Approx(70.0));
}
