#include "kvlab/tasks/ruler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <unordered_set>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/text.h"

namespace kvlab {

namespace {

// constants.py, verbatim.
const char* kNiahTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?";
const char* kNiahPrefix = " The special magic {type_needle_v} for {query} mentioned in the provided text are";
const char* kVtTemplate =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above.";
const char* kVtPrefix =
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the "
    "value {query}, they are: ";
const char* kCweTemplate =
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?";
const char* kCwePrefix = " Answer: The top 10 words that appear most often in the list are:";
const char* kFweTemplate =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?";
const char* kFwePrefix =
    " Answer: According to the coded text above, the three most frequently appeared words are:";
// niah.py
const char* kNeedle = "One of the special magic {type_needle_v} for {key} is: {value}.";
const char* kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
// np.round(np.linspace(0, 100, num=40)).astype(int)
const int kDepths[40] = {0,  3,  5,  8,  10, 13, 15, 18, 21, 23, 26, 28, 31, 33, 36, 38, 41, 44, 46, 49,
                         51, 54, 56, 59, 62, 64, 67, 69, 72, 74, 77, 79, 82, 85, 87, 90, 92, 95, 97, 100};

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  return fmt::format("{}", fmt::join(parts, sep));
}

// The generators' randomness: uniform draws by rejection from a 64-bit Mersenne Twister (the same
// on every platform, unlike std's distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t below(uint64_t n) {  // [0, n)
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = g_();
    while (x >= limit);
    return x % n;
  }
  int64_t between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(uint64_t(hi - lo + 1))); }
  uint64_t bits() { return g_(); }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
  // k distinct values of [0, n) in the order drawn (random.sample).
  std::vector<int64_t> sample(int64_t n, int64_t k) {
    KVLAB_CHECK(k <= n, "ruler: cannot draw {} distinct of {}", k, n);
    std::vector<int64_t> out;
    if (k * 4 < n) {
      std::unordered_set<int64_t> seen;
      while (int64_t(out.size()) < k) {
        const int64_t x = int64_t(below(uint64_t(n)));
        if (seen.insert(x).second) out.push_back(x);
      }
      return out;
    }
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    for (int64_t i = 0; i < k; ++i) std::swap(all[i], all[i + int64_t(below(uint64_t(n - i)))]);
    all.resize(static_cast<size_t>(k));
    return all;
  }
  std::string letters(int k, char first) {  // random.choices(ascii_upper/lowercase, k)
    std::string s;
    for (int i = 0; i < k; ++i) s += static_cast<char>(first + below(26));
    return s;
  }

 private:
  std::mt19937_64 g_;
};

std::vector<std::string> unique_sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// A 64-bit seed from the run's seed, the task and the length (FNV-1a over the three).
uint64_t sample_seed(uint64_t seed, const std::string& task, int64_t length) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
  };
  mix(std::to_string(seed));
  mix(task);
  mix(std::to_string(length));
  return h;
}

// ---- niah ----------------------------------------------------------------------------------

std::string random_value(Rng& rng, const std::string& type, const RulerSources& src) {
  if (type == "numbers") return std::to_string(rng.between(1000000, 9999999));
  if (type == "uuids") {  // uuid.UUID(int=getrandbits(128), version=4)
    uint64_t hi = rng.bits(), lo = rng.bits();
    hi = (hi & ~(0xf000ULL)) | 0x4000ULL;                 // version 4: bits 76..79
    lo = (lo & ~(0xc000ULL << 48)) | (0x8000ULL << 48);   // variant RFC 4122
    const std::string h = fmt::format("{:016x}{:016x}", hi, lo);
    return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
  }
  // words: an adjective-noun pair.
  return src.adjectives[rng.below(src.adjectives.size())] + "-" + src.nouns[rng.below(src.nouns.size())];
}

// Sentences of a whitespace-joined word list: a sentence ends after a word whose last character,
// closing quotes and brackets aside, is . ? or !, unless the word is a common abbreviation.
std::vector<std::string> split_sentences(const std::vector<std::string>& words) {
  static const std::set<std::string> abbreviations = {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "etc.",
                                                      "e.g.", "i.e.", "u.s.", "inc.", "jr.", "sr.", "no."};
  std::vector<std::string> out;
  std::string cur;
  for (const auto& w : words) {
    cur += (cur.empty() ? "" : " ") + w;
    std::string core = w;
    while (!core.empty() && std::string("\"')]").find(core.back()) != std::string::npos) core.pop_back();
    if (core.empty() || std::string(".?!").find(core.back()) == std::string::npos) continue;
    std::string lower = core;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (abbreviations.count(lower)) continue;
    out.push_back(cur);
    cur.clear();
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

struct Generated {
  std::string input, prefix;
  std::vector<std::string> outputs;
  size_t context_end = 0;
  std::vector<std::string> queries;  // niah: the keys asked, in order
};

// niah.py's rewrite of the template (or a part of it) when one value is asked for.
std::string niah_singular(std::string tmpl) {
  tmpl = replace_all(tmpl, "Some", "A");
  tmpl = replace_all(tmpl, "are all", "is");
  tmpl = replace_all(tmpl, "are", "is");
  return replace_all(tmpl, "answers", "answer");
}

Generated niah_generate(const RulerTask& t, const RulerSources& src, int64_t n_hay, Rng& rng, uint64_t seed) {
  const int num_k = std::max(t.num_k, t.num_q);
  std::vector<std::string> keys, needles;
  std::vector<std::vector<std::string>> values;
  for (int i = 0; i < num_k; ++i) {
    keys.push_back(random_value(rng, t.needle_k, src));
    values.emplace_back();
    for (int j = 0; j < t.num_v; ++j) {
      values.back().push_back(random_value(rng, t.needle_v, src));
      needles.push_back(replace_all(replace_all(replace_all(kNeedle, "{type_needle_v}", t.needle_v), "{key}", keys.back()),
                                    "{value}", values.back().back()));
    }
  }
  Rng fixed(seed);  // random.Random(args.random_seed).shuffle(needles): the same order every sample
  fixed.shuffle(needles);

  std::string context;
  if (t.haystack == "essay") {
    KVLAB_CHECK(!src.essay_words.empty(), "ruler: task {} needs the essay haystack (--haystack-dir)", t.name);
    std::vector<std::string> words;
    for (int64_t i = 0; i < n_hay; ++i) words.push_back(src.essay_words[size_t(i) % src.essay_words.size()]);
    const std::vector<std::string> sents = split_sentences(words);
    std::vector<int64_t> pos = {0};
    for (int64_t d : rng.sample(40, int64_t(needles.size())))
      pos.push_back(static_cast<int64_t>(double(sents.size()) * (kDepths[d] / 100.0)));
    std::sort(pos.begin() + 1, pos.end());
    pos.push_back(int64_t(sents.size()));
    std::vector<std::string> parts;
    for (size_t i = 1; i < pos.size(); ++i) {
      parts.push_back(join(std::vector<std::string>(sents.begin() + pos[i - 1], sents.begin() + pos[i]), " "));
      if (i - 1 < needles.size()) parts.push_back(needles[i - 1]);
    }
    context = join(parts, " ");
  } else {
    std::vector<std::string> lines;
    for (int64_t i = 0; i < n_hay; ++i) {
      if (t.haystack == "noise") {
        lines.push_back(kNoise);
      } else {  // needle: a distractor needle a line, a fresh key then a fresh value
        const std::string k = random_value(rng, t.needle_k, src), v = random_value(rng, t.needle_v, src);
        lines.push_back(replace_all(replace_all(replace_all(kNeedle, "{type_needle_v}", t.needle_v), "{key}", k),
                                    "{value}", v));
      }
    }
    std::vector<int64_t> at = rng.sample(n_hay, int64_t(needles.size()));
    std::sort(at.rbegin(), at.rend());
    for (size_t i = 0; i < at.size(); ++i) lines.insert(lines.begin() + at[i], needles[i]);
    context = join(lines, "\n");
  }

  std::vector<std::string> queries, answers;
  for (int64_t i : rng.sample(num_k, t.num_q)) {
    queries.push_back(keys[size_t(i)]);
    for (const auto& v : values[size_t(i)]) answers.push_back(v);
  }
  std::string query = queries.back();
  if (queries.size() > 1)
    query = join(std::vector<std::string>(queries.begin(), queries.end() - 1), ", ") + ", and " + queries.back();

  std::string tmpl = std::string(kNiahTemplate) + kNiahPrefix, type_v = t.needle_v;
  if (t.num_q * t.num_v == 1) {  // niah.py's singular rewrite, on the whole template
    tmpl = niah_singular(tmpl);
    type_v.pop_back();
  }
  tmpl = replace_all(replace_all(tmpl, "{type_needle_v}", type_v), "{query}", query);
  const size_t c_at = tmpl.find("{context}");
  Generated g;
  std::string full = tmpl.substr(0, c_at) + context + tmpl.substr(c_at + 9);
  const size_t p = full.rfind(std::string(" The special magic"));
  g.input = full.substr(0, p);
  g.prefix = full.substr(p);
  g.context_end = c_at + context.size();
  g.outputs = answers;
  g.queries = queries;
  return g;
}

// ---- vt --------------------------------------------------------------------------------------

struct Chain {
  std::vector<std::string> vars, lines;
  std::string value;
};

Chain vt_chain(Rng& rng, int hops, bool icl) {
  const int k = icl ? 3 : 5;
  Chain c;
  std::set<std::string> seen;
  while (int(c.vars.size()) < hops + 1) {
    std::string v = rng.letters(k, 'A');
    if (seen.insert(v).second) c.vars.push_back(v);
  }
  c.value = icl ? "12345" : std::to_string(rng.between(10000, 99998));
  c.lines.push_back("VAR " + c.vars[0] + " = " + c.value);
  for (int j = 0; j < hops; ++j) c.lines.push_back("VAR " + c.vars[j + 1] + " = VAR " + c.vars[j] + " ");
  return c;
}

// The task text with the chain hidden in n noise lines; `prefix` formatted.
Generated vt_generate(int64_t n, int hops, Rng& rng, bool icl) {
  Chain c = vt_chain(rng, hops, icl);
  std::vector<std::string> lines(static_cast<size_t>(n), kNoise);
  std::vector<int64_t> at = rng.sample(n, int64_t(c.lines.size()));
  std::sort(at.begin(), at.end());
  for (size_t j = 0; j < c.lines.size(); ++j) lines.insert(lines.begin() + at[j] + int64_t(j), c.lines[j]);
  const std::string context = join(lines, "\n");
  const std::string tmpl = kVtTemplate;
  const size_t c_at = tmpl.find("{context}");
  Generated g;
  g.input = replace_all(tmpl.substr(0, c_at) + context + tmpl.substr(c_at + 9), "{query}", c.value);
  g.prefix = replace_all(replace_all(kVtPrefix, "{num_v}", std::to_string(hops + 1)), "{query}", c.value);
  g.context_end = c_at + context.size();
  g.outputs = c.vars;
  return g;
}

// ---- cwe -------------------------------------------------------------------------------------

std::pair<std::string, std::vector<std::string>> cwe_list(const std::vector<std::string>& vocab, int64_t n_words,
                                                          int64_t common_rep, int64_t uncommon_rep, Rng& rng,
                                                          uint64_t seed) {
  KVLAB_CHECK(n_words <= int64_t(vocab.size()),
              "ruler cwe: the length needs {} distinct words, more than wonderwords' {} (RULER then draws from its "
              "english_words.json, a Git LFS file not available here): lower --lengths", n_words, vocab.size());
  std::vector<std::string> chosen;
  for (int64_t i : rng.sample(int64_t(vocab.size()), n_words)) chosen.push_back(vocab[size_t(i)]);
  std::vector<std::string> common(chosen.begin(), chosen.begin() + std::min<int64_t>(10, n_words)), list;
  for (int64_t r = 0; r < common_rep; ++r) list.insert(list.end(), common.begin(), common.end());
  for (int64_t r = 0; r < uncommon_rep; ++r) list.insert(list.end(), chosen.begin() + int64_t(common.size()), chosen.end());
  Rng fixed(seed);  // random.Random(args.random_seed).shuffle(word_list)
  fixed.shuffle(list);
  std::vector<std::string> numbered;
  for (size_t i = 0; i < list.size(); ++i) numbered.push_back(fmt::format("{}. {}", i + 1, list[i]));
  return {join(numbered, " "), common};
}

Generated cwe_generate(const std::vector<std::string>& vocab, int64_t n_words, int64_t max_seq_length, Rng& rng,
                       uint64_t seed) {
  const bool short_ctx = max_seq_length < 4096;
  auto [ex_ctx, ex_ans] = short_ctx ? cwe_list(vocab, 20, 3, 1, rng, seed) : cwe_list(vocab, 40, 10, 3, rng, seed);
  auto [ctx, ans] = short_ctx ? cwe_list(vocab, n_words, 6, 1, rng, seed) : cwe_list(vocab, n_words, 30, 3, rng, seed);
  const std::string tmpl = kCweTemplate;
  const size_t c_at = tmpl.find("{context}");
  std::vector<std::string> ex_numbered;
  for (size_t i = 0; i < ex_ans.size(); ++i) ex_numbered.push_back(fmt::format("{}. {}", i + 1, ex_ans[i]));
  const std::string example =
      tmpl.substr(0, c_at) + ex_ctx + tmpl.substr(c_at + 9) + kCwePrefix + " " + join(ex_numbered, " ");
  Generated g;
  g.input = example + "\n" + tmpl.substr(0, c_at) + ctx + tmpl.substr(c_at + 9);
  g.prefix = kCwePrefix;
  g.context_end = example.size() + 1 + c_at + ctx.size();
  g.outputs = ans;
  return g;
}

// ---- fwe -------------------------------------------------------------------------------------

// A fresh vocabulary of `size` distinct random 6-letter words, sorted, shuffled with the fixed
// generator, the top rank replaced by "...".
std::vector<std::string> fwe_vocab(int64_t size, Rng& rng, uint64_t seed) {
  std::set<std::string> words;
  while (int64_t(words.size()) < size) words.insert(rng.letters(6, 'a'));
  std::vector<std::string> vocab(words.begin(), words.end());
  Rng fixed(seed);
  fixed.shuffle(vocab);
  vocab[0] = "...";
  return vocab;
}

Generated fwe_text(const std::vector<std::string>& vocab, int64_t n_words, uint64_t seed) {
  const double zeta2 = 1.6449340668482264;  // scipy.special.zeta(2.0)
  std::vector<std::string> words;
  for (size_t k = 1; k <= vocab.size(); ++k) {
    const int64_t cnt = static_cast<int64_t>(double(n_words) * std::pow(double(k), -2.0) / zeta2);
    for (int64_t i = 0; i < cnt; ++i) words.push_back(vocab[k - 1]);
  }
  Rng fixed(seed);
  fixed.shuffle(words);
  const std::string context = join(words, " "), tmpl = kFweTemplate;
  const size_t c_at = tmpl.find("{context}");
  Generated g;
  g.input = tmpl.substr(0, c_at) + context + tmpl.substr(c_at + 9);
  g.prefix = kFwePrefix;
  g.context_end = c_at + context.size();
  g.outputs = {vocab[1], vocab[2], vocab[3]};
  return g;
}

RulerSample to_sample(const RulerTask& t, Generated g, int64_t index, int64_t max_seq_length, int64_t tokens,
                      int64_t haystack) {
  RulerSample s;
  s.task = t.name;
  s.index = index;
  s.max_seq_length = max_seq_length;
  s.input = std::move(g.input);
  s.answer_prefix = std::move(g.prefix);
  s.outputs = std::move(g.outputs);
  s.context_end = g.context_end;
  s.length = tokens + t.tokens_to_generate;
  s.haystack = haystack;
  s.queries = std::move(g.queries);
  return s;
}

// RULER's search for the haystack size (niah, vt, cwe): an estimate from a probe of `probe` units,
// a binary search between `inc` and the bound, then each sample stepping down by `step` (RULER: inc)
// until it fits. gen(n) draws fresh content each call.
std::vector<RulerSample> fit_and_sample(const RulerTask& t, int64_t L, int64_t n, int64_t inc, int64_t probe,
                                        double bound_factor, int64_t min_upper,
                                        const std::function<Generated(int64_t)>& gen, const RulerTokenCount& count,
                                        int64_t step = 0) {
  if (step <= 0) step = inc;
  auto tokens = [&](const Generated& g) { return count.prompt(g.input, g.prefix); };
  const double per_unit = double(tokens(gen(probe))) / double(probe);
  const int64_t upper0 = std::max<int64_t>(static_cast<int64_t>(double(L) / per_unit * bound_factor), min_upper);
  int64_t lo = inc, hi = upper0, best = -1;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    if (tokens(gen(mid)) + t.tokens_to_generate <= L) best = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  const int64_t size = best > 0 ? best : inc;
  std::vector<RulerSample> out;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t used = size;; used -= step) {
      Generated g = gen(used);
      const int64_t tok = tokens(g);
      if (tok + t.tokens_to_generate <= L) {
        out.push_back(to_sample(t, std::move(g), i, L, tok, used));
        if (count.on_sample) count.on_sample();
        break;
      }
      KVLAB_CHECK(used > step, "--lengths {}: task {} does not fit even with its smallest haystack ({} units: {} "
                  "prompt tokens + {} to generate)", L, t.name, used, tok, t.tokens_to_generate);
    }
  }
  return out;
}

// niah_multiquestion: each sample (fitted with its keys asked at once) becomes one sample per key,
// the same context asked the template's question and answer prefix (after {context}) with niah.py's
// singular rewrite. Each question's prompt is shorter than the one fitted, so it fits the length too.
std::vector<RulerSample> one_question_each(const RulerTask& t, const std::vector<RulerSample>& fitted,
                                           const RulerTokenCount& count) {
  const std::string type_v = t.needle_v.substr(0, t.needle_v.size() - 1);  // "numbers" -> "number"
  const std::string tmpl = std::string(kNiahTemplate) + kNiahPrefix;
  const std::string tail = niah_singular(tmpl.substr(tmpl.find("{context}") + 9));  // "\nWhat is ...? The ... is"
  std::vector<RulerSample> out;
  for (const auto& s : fitted) {
    KVLAB_CHECK(s.queries.size() == size_t(t.num_q) && s.outputs.size() == s.queries.size(),
                "ruler {}: sample {} has {} keys and {} values, expected {} of each", t.name, s.index,
                s.queries.size(), s.outputs.size(), t.num_q);
    for (size_t q = 0; q < s.queries.size(); ++q) {
      RulerSample one = s;
      one.index = s.index * int64_t(s.queries.size()) + int64_t(q);
      const std::string asked = replace_all(replace_all(tail, "{type_needle_v}", type_v), "{query}", s.queries[q]);
      const size_t at = asked.rfind(" The special magic");  // where the answer prefix starts, as niah_generate
      one.input = s.input.substr(0, s.context_end) + asked.substr(0, at);
      one.answer_prefix = asked.substr(at);
      one.outputs = {s.outputs[q]};
      one.queries = {s.queries[q]};
      one.length = count.prompt(one.input, one.answer_prefix) + t.tokens_to_generate;
      one.context_group = s.index;
      one.question_index = int64_t(q);
      out.push_back(std::move(one));
    }
  }
  return out;
}

}  // namespace

const std::vector<RulerTask>& ruler_tasks() {
  static const std::vector<RulerTask> tasks = [] {
    std::vector<RulerTask> v;
    auto niah = [&](std::string name, std::string hay, std::string k, std::string val, int nk, int nv, int nq) {
      RulerTask t;
      t.name = std::move(name);
      t.kind = "niah";
      t.haystack = std::move(hay);
      t.needle_k = std::move(k);
      t.needle_v = std::move(val);
      t.num_k = nk, t.num_v = nv, t.num_q = nq;
      t.tokens_to_generate = 128;
      v.push_back(t);
    };
    niah("niah_single_1", "noise", "words", "numbers", 1, 1, 1);
    niah("niah_single_2", "essay", "words", "numbers", 1, 1, 1);
    niah("niah_single_3", "essay", "words", "uuids", 1, 1, 1);
    niah("niah_multikey_1", "essay", "words", "numbers", 4, 1, 1);
    niah("niah_multikey_2", "needle", "words", "numbers", 1, 1, 1);
    niah("niah_multikey_3", "needle", "uuids", "uuids", 1, 1, 1);
    niah("niah_multivalue", "essay", "words", "numbers", 1, 4, 1);
    niah("niah_multiquery", "essay", "words", "numbers", 1, 1, 4);
    RulerTask vt;
    vt.name = "vt", vt.kind = "vt", vt.haystack = "noise", vt.num_k = 1, vt.num_v = 4, vt.tokens_to_generate = 30;
    v.push_back(vt);  // num_v holds num_hops (synthetic.yaml: num_chains 1, num_hops 4)
    RulerTask cwe;
    cwe.name = "cwe", cwe.kind = "cwe", cwe.tokens_to_generate = 120;
    v.push_back(cwe);
    RulerTask fwe;
    fwe.name = "fwe", fwe.kind = "fwe", fwe.tokens_to_generate = 50;
    v.push_back(fwe);
    for (const char* qa : {"qa_1", "qa_2"}) {
      RulerTask q;
      q.name = qa, q.kind = "qa", q.tokens_to_generate = 32, q.match_all = false;
      v.push_back(q);
    }
    niah("niah_multiquestion", "essay", "words", "numbers", 1, 1, 4);  // kvlab's: ruler.h
    v.back().one_question_at_a_time = true;
    return v;
  }();
  return tasks;
}

std::vector<RulerTask> parse_ruler_tasks(const std::string& spec) {
  std::vector<std::string> names;
  for (const auto& t : ruler_tasks()) names.push_back(t.name);
  std::vector<RulerTask> out;
  if (spec == "all") {
    for (const auto& t : ruler_tasks())
      if (t.kind != "qa" && !t.one_question_at_a_time) out.push_back(t);
    return out;
  }
  for (const auto& name : split(spec, ',')) {
    auto it = std::find_if(ruler_tasks().begin(), ruler_tasks().end(), [&](const RulerTask& t) { return t.name == name; });
    KVLAB_CHECK(it != ruler_tasks().end(), "--tasks: unknown task '{}' (RULER's: {}, or all)", name,
                fmt::join(names, ", "));
    KVLAB_CHECK(it->kind != "qa", "--tasks {}: RULER's QA tasks read SQuAD / HotpotQA files, which kvlab does not "
                "have yet (RULER downloads them); the synthetic tasks run without them", name);
    for (const auto& t : out) KVLAB_CHECK(t.name != name, "--tasks: '{}' is listed twice", name);
    out.push_back(*it);
  }
  KVLAB_CHECK(!out.empty(), "--tasks: no task given");
  return out;
}

RulerSources ruler_sources(const std::string& words_json, const std::string& essay_text) {
  const nlohmann::json j = read_json_file(words_json);
  RulerSources s;
  for (const char* key : {"nouns", "adjectives", "verbs"})
    KVLAB_CHECK(j.contains(key) && j[key].is_array() && !j[key].empty(),
                "{}: expected a non-empty list '{}' (data_scripts/make_ruler_words.py writes it)", words_json, key);
  s.nouns = unique_sorted(j["nouns"].get<std::vector<std::string>>());
  s.adjectives = unique_sorted(j["adjectives"].get<std::vector<std::string>>());
  s.verbs = unique_sorted(j["verbs"].get<std::vector<std::string>>());
  // re.sub(r'\s+', " ", essay).split(" ")
  std::string word;
  bool space = false;
  for (unsigned char c : essay_text) {
    if (std::isspace(c) || (c >= 0x1c && c <= 0x1f)) {
      space = true;
      continue;
    }
    if (space && !word.empty()) s.essay_words.push_back(word), word.clear();
    space = false;
    word += static_cast<char>(c);
  }
  if (!word.empty()) s.essay_words.push_back(word);
  return s;
}

std::vector<RulerSample> make_ruler_samples(const RulerTask& t, const RulerSources& src, int64_t L, int64_t n,
                                            uint64_t seed, const RulerTokenCount& count) {
  KVLAB_CHECK(n >= 1, "--samples must be >= 1, got {}", n);
  KVLAB_CHECK(t.kind != "qa", "ruler: task {} (QA) is not built yet", t.name);
  Rng rng(sample_seed(seed, t.name, L));
  const bool small = L < 4096;
  if (t.kind == "niah") {
    const int64_t inc = t.haystack == "essay" ? 500 : small ? 5 : 25;
    // A sample a few tokens over steps down 25 essay words, not RULER's 500 (a third of a 1k prompt).
    std::vector<RulerSample> out = fit_and_sample(t, L, n, inc, inc, 3.0, 2 * inc,
                                                  [&](int64_t m) { return niah_generate(t, src, m, rng, seed); },
                                                  count, t.haystack == "essay" ? 25 : inc);
    return t.one_question_at_a_time ? one_question_each(t, out, count) : out;
  }
  if (t.kind == "vt") {
    const int hops = t.num_v;
    // The one-shot example: 3-letter names and the value 12345, fitted alone (no chat template) to
    // 500 tokens in steps of 5 noise lines.
    RulerTask icl_task = t;
    icl_task.tokens_to_generate = 0;
    RulerTokenCount plain = count;
    plain.prompt = [&](const std::string& input, const std::string& prefix) { return count.text(input + prefix); };
    plain.on_sample = nullptr;  // the example is not one of the n samples
    // (A tokenizer so fine that 5 lines, the fewest a chain of 5 can hide in, exceed 500 tokens gets
    // the 5 lines: the budget grows to their length.)
    const Generated fewest = vt_generate(5, hops, rng, true);
    const int64_t icl_budget = std::max<int64_t>(500, plain.prompt(fewest.input, fewest.prefix) + 16);
    const RulerSample icl = fit_and_sample(icl_task, icl_budget, 1, 5, 5, 3.0, 10,
                                           [&](int64_t m) { return vt_generate(m, hops, rng, true); }, plain)[0];
    const std::string icl_text = icl.input + icl.answer_prefix + " " + join(icl.outputs, " ") + "\n";
    // randomize_icl: each of the example's names, then its value, replaced by fresh ones.
    auto with_example = [&](int64_t m) {
      Generated g = vt_generate(m, hops, rng, false);
      std::string ex = icl_text;
      for (const auto& v : icl.outputs) ex = replace_all(ex, v, rng.letters(int(v.size()), 'A'));
      ex = replace_all(ex, "12345", std::to_string(rng.between(10000, 99998)));
      g.input = ex + "\n" + g.input;
      g.context_end += ex.size() + 1;
      return g;
    };
    const int64_t inc = small ? 5 : 10;
    return fit_and_sample(t, L, n, inc, inc, 3.0, 2 * inc, with_example, count);
  }
  if (t.kind == "cwe") {
    std::vector<std::string> vocab = src.nouns;
    vocab.insert(vocab.end(), src.adjectives.begin(), src.adjectives.end());
    vocab.insert(vocab.end(), src.verbs.begin(), src.verbs.end());
    vocab = unique_sorted(vocab);
    Rng fixed(seed);  // random.Random(args.random_seed).shuffle(words), once
    fixed.shuffle(vocab);
    // The probe: 4096 distinct words, or all there are (RULER's would fall back to its LFS list).
    const int64_t probe = std::min<int64_t>(4096, int64_t(vocab.size()));
    return fit_and_sample(t, L, n, 10, probe, 2.0, 20,
                          [&](int64_t m) { return cwe_generate(vocab, std::min<int64_t>(m, int64_t(vocab.size())), L, rng, seed); },
                          count);
  }
  // fwe: RULER's linear search against max_len = L − tokens_to_generate.
  const int64_t max_len = L - t.tokens_to_generate, vocab_size = std::max<int64_t>(4, max_len / 50),
                inc = std::max<int64_t>(1, max_len / 32);
  auto tokens = [&](const Generated& g) { return count.prompt(g.input, g.prefix); };
  std::vector<std::string> vocab = fwe_vocab(vocab_size, rng, seed);
  int64_t words = max_len / 6;
  while (tokens(fwe_text(vocab, words, seed)) < max_len) words += inc;
  words -= inc;
  std::vector<RulerSample> out;
  for (int64_t i = 0; i < n; ++i) {
    vocab = fwe_vocab(vocab_size, rng, seed);
    int64_t w = words;
    Generated g = fwe_text(vocab, w, seed);
    int64_t tok = tokens(g);
    while (tok > max_len) {
      w -= inc;
      KVLAB_CHECK(w > 0, "--lengths {}: task fwe does not fit", L);
      g = fwe_text(vocab, w, seed);
      tok = tokens(g);
    }
    out.push_back(to_sample(t, std::move(g), i, L, tok, w));
    if (count.on_sample) count.on_sample();
  }
  return out;
}

nlohmann::json RulerSample::to_json() const {
  nlohmann::json j = {{"index", index},
          {"task", task},
          {"max_seq_length", max_seq_length},
          {"input", input},
          {"outputs", outputs},
          {"length", length},
          {"answer_prefix", answer_prefix},
          {"context", input.substr(0, context_end)},
          {"question", input.substr(context_end)},
          {"haystack", haystack}};
  if (question_index >= 0) j["context_group"] = context_group, j["question_index"] = question_index;
  return j;
}

std::string ruler_postprocess(const std::string& pred) {
  auto strip = [](const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  };
  std::string s = strip(pred);
  for (char& c : s)
    if (static_cast<unsigned char>(c) <= 0x1f) c = '\n';
  return strip(s);
}

nlohmann::json ruler_score(const std::string& output, const nlohmann::json& gold) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string pred = lower(ruler_postprocess(output));
  const auto refs = gold.at("outputs").get<std::vector<std::string>>();
  KVLAB_CHECK(!refs.empty(), "ruler: a sample without references");
  int64_t found = 0;
  for (const auto& r : refs) found += pred.find(lower(r)) != std::string::npos;
  const bool all = gold.value("match", std::string("all")) == "all";
  const double score = all ? double(found) / double(refs.size()) : (found > 0 ? 1.0 : 0.0);
  return {{"score", score}, {"found", found}};
}

std::string ruler_dataset(const std::string& task, int64_t length) { return fmt::format("{}_{}", task, length); }

void ruler_tag_row(nlohmann::json& row, const std::string& task, int64_t length) {
  row["task"] = task;
  row["length"] = length;
}

nlohmann::json ruler_score_table(const nlohmann::json& rows) {
  // (length, branch) -> task -> score, in first-seen branch order.
  std::vector<int64_t> lengths;
  std::vector<std::string> branches;
  std::map<std::pair<int64_t, std::string>, std::map<std::string, double>> cell;
  for (const auto& r : rows) {
    if (!r.contains("task") || !r["task"].is_string() || !r.contains("length") || !r["length"].is_number_integer())
      continue;
    const std::string task = r["task"].get<std::string>();
    const bool known = std::any_of(ruler_tasks().begin(), ruler_tasks().end(),
                                   [&](const RulerTask& t) { return t.name == task; });
    if (!known) continue;
    const int64_t L = r["length"].get<int64_t>();
    const std::string b = r.at("branch").get<std::string>();
    if (std::find(lengths.begin(), lengths.end(), L) == lengths.end()) lengths.push_back(L);
    if (std::find(branches.begin(), branches.end(), b) == branches.end()) branches.push_back(b);
    cell[{L, b}][task] = r.at("score").get<double>();
  }
  std::sort(lengths.begin(), lengths.end());
  nlohmann::json table = nlohmann::json::array();
  for (int64_t L : lengths)
    for (const auto& b : branches) {
      auto it = cell.find({L, b});
      if (it == cell.end()) continue;
      nlohmann::json row = {{"branch", b}, {"length", L}};
      double sum = 0;
      for (const auto& t : ruler_tasks())
        if (it->second.count(t.name)) row[t.name] = it->second.at(t.name), sum += it->second.at(t.name);
      row["average"] = sum / double(it->second.size());
      table.push_back(row);
    }
  return table;
}

std::vector<std::string> ruler_table_columns(const nlohmann::json& table) {
  std::vector<std::string> cols = {"branch", "length"};
  for (const auto& t : ruler_tasks())
    if (std::any_of(table.begin(), table.end(), [&](const nlohmann::json& r) { return r.contains(t.name); }))
      cols.push_back(t.name);
  cols.push_back("average");
  return cols;
}

}  // namespace kvlab
