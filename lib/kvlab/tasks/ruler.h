// RULER's synthetic tasks (Hsieh et al. 2024, NVIDIA/RULER scripts/data/synthetic/ at c3f5e3b), generated
// locally as its generators do, with the model's own tokenizer, and scored as its evaluate.py does.
//
// Followed from RULER (synthetic.yaml, constants.py, niah.py, variable_tracking.py,
// common_words_extraction.py, freq_words_extraction.py, evaluate.py):
//   - the 11 synthetic tasks with synthetic.yaml's arguments: niah_single_1/2/3,
//     niah_multikey_1/2/3, niah_multivalue, niah_multiquery (noise, essay and needle haystacks;
//     adjective-noun words, 7-digit numbers and UUID4s), vt (one chain of 4 hops in noise, with its
//     one-shot example), cwe (10 words ×30 among words ×3, one few-shot example; ×6 / ×1 below 4096
//     tokens), fwe (Zipf α = 2 over random 6-letter words, the top rank replaced by "...");
//   - the templates and answer prefixes verbatim, niah's singular rewrite (Some → A, are all → is,
//     are → is, answers → answer, numbers → number) when one value is asked for;
//   - the haystack size searched as RULER searches it: an estimate from one probe, a binary search
//     on fresh random draws, then each sample stepping down by the same increment until its whole
//     prompt plus the task's tokens_to_generate fits the length (fwe: RULER's linear search);
//   - the answer prefix after the prompt the model sees (after the chat template's assistant
//     header, as RULER's model templates put it), its tokens counted in the length;
//   - scoring: evaluate.py's postprocess_pred, then string_match_all (the fraction of the
//     references found, case-insensitive substrings; every synthetic task) or string_match_part.
// Deviations:
//   - Randomness: a 64-bit Mersenne Twister seeded per (seed, task, length), not Python's `random`
//     stream, so samples match RULER's in structure, not token for token. RULER's fixed
//     permutations (a fresh Random(seed) shuffling the needles, cwe's and fwe's word lists) are kept:
//     kvlab shuffles those with a fresh generator seeded with the run's seed.
//   - Essay haystack: the Paul Graham essays of --haystack-dir (sorted file names, the 49 of
//     gkamradt's needle-in-a-haystack repository here; RULER downloads 217 from the web), whitespace
//     runs made one space, split into words. Sentences end after a word ending in . ? or ! (closing
//     quotes or brackets after it allowed) that is not a common abbreviation; RULER uses NLTK's Punkt
//     model, which also knows rarer abbreviations: a needle may move by a sentence.
//   - niah words: an adjective and a noun drawn independently from wonderwords' unique lists, where
//     RULER draws from the sorted set of their combinations (the same distribution up to the few
//     combinations that coincide). Word lists: data/ruler/wonderwords.json (wonderwords 3.0.1).
//   - A sample a few tokens over the length steps down 25 essay words, where RULER steps down by
//     its search increment, 500 words (at 1k-4k tokens a third of the prompt or more).
//   - Lengths count the token ids the model is given (BOS included when the tokenizer adds one);
//     RULER's tokenizers add none. A sample that cannot fit is an error (RULER loops forever).
//   - cwe needs at most the 8k wonderwords; past them RULER falls back to a 8.5 MB English word
//     list stored in Git LFS, not available here: refused with the number of words it needed.
//   - vt's main haystack is fitted together with its one-shot example (RULER fits the task alone and
//     adds the example's tokens); lowercase in scoring is ASCII only (RULER: Python's Unicode lower).
//   - qa_1 / qa_2 need SQuAD / HotpotQA files, which RULER downloads; not built yet.
// kvlab's own task (issue 53, many questions per compressed context; not in --tasks all):
//   - niah_multiquestion: niah_multiquery's sample (4 word keys with 7-digit values in the essay
//     haystack, fitted to the length with all four asked at once), its context then asked about one
//     key at a time, in the order RULER draws them: question q is "What is the special magic number
//     for <key q> mentioned in the provided text?" with its answer prefix (niah.py's singular wording,
//     the context's plural introduction kept). Each question is a sample of its own (index
//     4 * context + q, context_group and question_index in its data line), so the scorer, `ruler
//     eval` and the tables treat it as any other; under --protocol context the task runner prefills
//     and compresses each context once for its four questions (tasks/task_runner.h). --samples counts
//     contexts.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvlab {

struct RulerTask {
  std::string name;           // synthetic.yaml's key: "niah_single_1", "vt", ...
  std::string kind;           // "niah" | "vt" | "cwe" | "fwe" | "qa"
  std::string haystack;       // niah / vt: "noise" | "essay" | "needle"
  std::string needle_k, needle_v;  // niah: "words" | "numbers" | "uuids"
  int num_k = 1, num_v = 1, num_q = 1;
  bool one_question_at_a_time = false;  // niah_multiquestion: the num_q keys asked in num_q questions
  int64_t tokens_to_generate = 128;  // constants.py
  bool match_all = true;      // string_match_all (else string_match_part)
};

// synthetic.yaml's 13 tasks, in its order, then kvlab's niah_multiquestion.
const std::vector<RulerTask>& ruler_tasks();
// "all" = RULER's 11 synthetic tasks (qa_1 and qa_2 need downloaded data); else comma-separated names.
// Errors name --tasks and list the names.
std::vector<RulerTask> parse_ruler_tasks(const std::string& spec);

// What the generators draw from.
struct RulerSources {
  std::vector<std::string> nouns, adjectives, verbs;  // wonderwords' lists, unique, sorted
  std::vector<std::string> essay_words;                // the essays, whitespace-split (empty = no essay task)
};
// data/ruler/wonderwords.json (data_scripts/make_ruler_words.py); `essay_text` from read_haystack.
RulerSources ruler_sources(const std::string& words_json, const std::string& essay_text);

struct RulerSample {
  std::string task;
  int64_t index = 0;
  int64_t max_seq_length = 0;
  std::string input;          // RULER's "input": the task text, without the answer prefix
  std::string answer_prefix;  // RULER's "answer_prefix", after the model's assistant header
  std::vector<std::string> outputs;  // the references
  size_t context_end = 0;     // offset in `input` where the context ends and the question begins
  int64_t length = 0;         // tokens of the prompt the model sees + tokens_to_generate
  int64_t haystack = 0;       // the haystack size used (noise/needle lines, essay words, distinct words, ...)
  // A task asking one context several questions (niah_multiquestion): the context's number (the
  // same context text for its questions) and this question's place among them; -1 = one question.
  int64_t context_group = -1, question_index = -1;
  std::vector<std::string> queries;  // niah: the keys asked, in order (not written)
  nlohmann::json to_json() const;  // one line of <out>/data/<task>_<length>.jsonl
};

// Token counts with the model's tokenizer.
struct RulerTokenCount {
  // The prompt the model is given for a task text and answer prefix (the chat template applied
  // around `input`, the answer prefix after it).
  std::function<int64_t(const std::string& input, const std::string& answer_prefix)> prompt;
  // Plain text (vt's one-shot example, which RULER fits without the model's template).
  std::function<int64_t(const std::string& text)> text;
  // Optional: called as each of the n samples is made (a long preparation's progress).
  std::function<void()> on_sample;
};

// `n` samples of `task` fitted to `max_seq_length` tokens (prompt + tokens_to_generate), seeded by
// (seed, task, max_seq_length): the same arguments give the same samples.
std::vector<RulerSample> make_ruler_samples(const RulerTask& task, const RulerSources& src, int64_t max_seq_length,
                                            int64_t n, uint64_t seed, const RulerTokenCount& count);

// evaluate.py's postprocess_pred: strip, every byte in \x00-\x1f becomes '\n', strip again.
std::string ruler_postprocess(const std::string& pred);
// One sample's score: {"score": the fraction of gold["outputs"] found in the postprocessed output
// (string_match_all) or 1 if any is (gold["match"] == "part")}.
nlohmann::json ruler_score(const std::string& output, const nlohmann::json& gold);

// The prediction file's name of a task at a length: "<task>_<length>" (e.g. "niah_single_1_4096").
std::string ruler_dataset(const std::string& task, int64_t length);

// The leaderboard's layout from the task runner's summary rows (one per branch and dataset, each
// carrying its "task" and "length" as fields: ruler_tag_row): per length, one row per branch
// {"branch", "length", <task>: score x 100, ..., "average"} with the tasks in synthetic.yaml's order
// and the average over the tasks run. Rows without a RULER task are ignored; no name is parsed.
void ruler_tag_row(nlohmann::json& row, const std::string& task, int64_t length);
nlohmann::json ruler_score_table(const nlohmann::json& rows);
// The table's columns for render_table: branch, length, the tasks present, average.
std::vector<std::string> ruler_table_columns(const nlohmann::json& table);

}  // namespace kvlab
