// kvlab ruler --model M [--tasks all | niah_single_1,vt,...] [--lengths 1024,2048,4096] [--samples 20]
//             [--method a,b] (--ratio r | --budget N | --T t) [--protocol whole|context]
//             [--haystack-dir D] [--words F] [--out DIR | --results-dir D --name N]
// RULER's synthetic tasks (tasks/ruler.h) generated with the model's own tokenizer, written to
// <out>/data/<task>_<length>.jsonl (RULER's fields, plus the context / question split, so another tool
// can run the very same samples), then run through compressed caches on the task runner: one exact
// prefill per sample shared by every (method, budget) branch, resumable, --shard i/N. Scores are
// RULER's string_match_all x 100 with fidelity to the full cache beside them; the table is the
// leaderboard's layout, branches by tasks per length with the average last.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>

#include "command.h"
#include "commands.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/memory.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/niah.h"
#include "kvlab/tasks/prompt_split.h"
#include "kvlab/tasks/ruler.h"
#include "task_command.h"

namespace kvlab::cli {
namespace {

using nlohmann::json;

// A sample held in memory, per token of its length: its text (input), data/'s line (input again,
// as context + question: 7.3 bytes a token for niah_single_1 at 4096 with Qwen2.5's tokenizer,
// 2026-12-06) and the prompt's ids (8 bytes): about 20 bytes; 48 leaves room for other tokenizers.
constexpr int64_t kSampleBytesPerToken = 48;

struct RulerOptions {
  TaskCommonOptions common{"ruler"};
  std::string tasks = "all";
  std::vector<int64_t> lengths = {1024, 2048, 4096};
  int64_t samples = 20;
  std::string haystack_dir = shared_default("data/niah/PaulGrahamEssays");
  std::string words = "data/ruler/wonderwords.json";
  bool data_only = false;
  void fields(FieldList& f) {
    f.add("tasks", tasks, "RULER tasks, comma-separated, or all (its 11 synthetic tasks: niah_single_1/2/3, "
                          "niah_multikey_1/2/3, niah_multivalue, niah_multiquery, vt, cwe, fwe)");
    f.add("lengths", lengths, "sequence lengths in tokens: the prompt the model sees plus the task's tokens to "
                              "generate (RULER's max_seq_length)");
    f.add("samples", samples, "samples per task and length (niah_multiquestion: contexts, each asked 4 questions)");
    f.add("haystack_dir", haystack_dir, "folder of the essays for the essay haystack (*.txt, read in name order)");
    f.add("words", words, "wonderwords' lists as RULER reads them (data_scripts/make_ruler_words.py writes it)");
    f.add("data_only", data_only, "write the samples to <out>/data/ and stop (for another tool: the model's "
                                  "tokenizer and chat template fit them; nothing is decoded)");
    common.fields(f);
  }
  void check() const {
    parse_ruler_tasks(tasks);
    KVLAB_CHECK(samples >= 1, "--samples must be >= 1, got {}", samples);
    KVLAB_CHECK(!lengths.empty(), "give --lengths (one value at least)");
    for (size_t i = 0; i < lengths.size(); ++i) {
      KVLAB_CHECK(lengths[i] >= 256, "--lengths: {} is too short for RULER's templates (at least 256)", lengths[i]);
      KVLAB_CHECK(lengths[i] <= kMaxTokens, "--lengths: {} is more tokens than kvlab handles ({})", lengths[i],
                  kMaxTokens);
      for (size_t j = 0; j < i; ++j) KVLAB_CHECK(lengths[i] != lengths[j], "--lengths: {} is listed twice", lengths[i]);
    }
    // A task's samples at a length are made, then written, together: bounded by the machine's
    // memory before any is made (issue 50: --samples 1e9 grew 13 MB/s without a word).
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const double need = kSampleBytesPerToken * double(samples) * double(longest), have = double(physical_memory_bytes());
    KVLAB_CHECK(have <= 0 || need <= have / 2, "--samples {}: {} samples of {} tokens need about {:.1f} GB at once "
                "({} bytes a token), more than half this machine's {:.1f} GB; lower --samples or the length",
                samples, samples, longest, need / 1e9, kSampleBytesPerToken, have / 1e9);
    plan_task(common, /*need_files=*/false);
  }
};

void run_ruler(const RulerOptions& o, const json& effective) {
  const auto& c = o.common;
  const TaskPlan plan = plan_task(c);
  const auto tasks = parse_ruler_tasks(o.tasks);
  const bool essay = std::any_of(tasks.begin(), tasks.end(), [](const RulerTask& t) { return t.haystack == "essay"; });
  const std::string words = shipped_file(o.words);  // the working directory's, else kvlab's tree's
  KVLAB_CHECK(std::filesystem::is_regular_file(words), "--words {}: not found here nor in kvlab's source tree (run "
              "data_scripts/make_ruler_words.py, or give the path)", o.words);
  const RulerSources src = ruler_sources(words, essay ? read_haystack(o.haystack_dir) : std::string());
  auto tm = load_task_model(c);
  for (int64_t L : o.lengths)
    KVLAB_CHECK(tm->context <= 0 || L <= tm->context, "--lengths: {} exceeds {}'s context of {} tokens", L,
                tm->model.id, tm->context);
  auto full_text = [&](const std::string& input, const std::string& prefix) {
    return apply_model_chat_messages(c.chat_template, tm->src, tm->tok, {{"user", input}}) + prefix;
  };
  RulerTokenCount count;
  count.prompt = [&](const std::string& input, const std::string& prefix) {
    return int64_t(tm->tok.encode(full_text(input, prefix), /*add_bos=*/true).size());
  };
  count.text = [&](const std::string& text) { return int64_t(tm->tok.encode(text, /*add_bos=*/false).size()); };

  TaskRun tr = open_task_run(c, *tm, effective, plan);
  const RunDir& run = tr.run;
  json rows = json::array();
  for (size_t li = 0; li < o.lengths.size(); ++li)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const RulerTask& t = tasks[ti];
      const int64_t L = o.lengths[li];
      const std::string dataset = ruler_dataset(t.name, L);
      Progress made("ruler " + dataset + " samples", o.samples, !c.quiet && o.samples >= 100);
      count.on_sample = [&] { made.advance(1); };
      const auto samples = make_ruler_samples(t, src, L, o.samples, static_cast<uint64_t>(c.seed), count);
      made.finish();
      std::string lines;
      std::vector<TaskRecord> records;
      for (const auto& s : samples) {
        lines += s.to_json().dump() + "\n";
        TaskRecord r;
        r.id = std::to_string(s.index);
        const std::string text = full_text(s.input, s.answer_prefix);
        SplitPrompt sp = encode_split(tm->tok, text, offset_in(text, s.input, s.context_end));
        r.prompt = std::move(sp.ids);
        r.context_len = sp.context_len;
        r.max_new_tokens = t.tokens_to_generate;
        if (s.context_group >= 0) r.context_group = std::to_string(s.context_group), r.question_index = s.question_index;
        r.gold = {{"outputs", s.outputs}, {"match", t.match_all ? "all" : "part"}, {"task", t.name}, {"length", L},
                  {"prompt_tokens", r.prompt.size()}};
        records.push_back(std::move(r));
      }
      write_text_atomic(run.file("data/" + dataset + ".jsonl"), lines);
      if (o.data_only) {
        fmt::print(stderr, "[ruler] {}: {} samples\n", dataset, samples.size());
        continue;
      }
      const size_t before = rows.size();
      run_task_dataset(c, *tm, tr, TaskSpec{dataset, ruler_score}, records, plan, rows,
                       li + 1 == o.lengths.size() && ti + 1 == tasks.size());
      for (size_t k = before; k < rows.size(); ++k) ruler_tag_row(rows[k], t.name, L);
    }
  if (o.data_only) {
    tr.write(rows, {{"complete", true}, {"data_only", true}});
    fmt::print(stderr, "[ruler] wrote the samples to {}\n", run.file("data/"));
    return;
  }
  const json table = ruler_score_table(rows);
  tr.write(rows, {{"complete", true}, {"ruler", table}});
  std::cout << task_table_header(c, plan) << "RULER (string_match_all x 100)\n"
            << render_table(table, ruler_table_columns(table)) << "\nFidelity to the full cache\n"
            << render_table(rows, {"branch", "dataset", "n", "score", "same_as_exact", "rougeL_vs_exact",
                                   "entries_start", "entries_peak", "mem", "seconds_per_record"});
  fmt::print(stderr, "[ruler] wrote {}, {} and {}\n", run.file("result.json"), run.file("data/"), run.file("pred/"));
}

struct RulerEvalOptions {
  std::vector<std::string> dirs;
  std::string out;
  bool overwrite = false;
  bool partial = false;
  void fields(FieldList& f) {
    f.add("dirs", dirs, "folders holding pred/<branch>/<task>_<length>.jsonl (a kvlab ruler run, and e.g. the "
                        "output of bench/ruler_kvpress.py); the samples from the first one's data/")
        .positional()
        .required();
    f.add("out", out, "where result.json goes (default <first dir>/eval)");
    f.add("overwrite", overwrite, "replace an --out folder that holds another config's results");
    f.add("partial", partial, "score prediction files that hold only some of their samples (e.g. "
                              "bench/ruler_kvpress.py --limit), each over the samples it has; without it such "
                              "a file is an error");
  }
};

// Calls fn(value, line number) for each non-empty line of a JSON-lines file; a line that is not JSON
// is an error naming the file and the line.
void for_each_json_line(const std::string& path, const std::function<void(const json&, int64_t)>& fn) {
  std::ifstream in(path);
  KVLAB_CHECK(in.good(), "{}: cannot be read", path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    KVLAB_CHECK(!j.is_discarded(), "{}: line {} is not JSON", path, n);
    fn(j, n);
  }
}

// The gold answers a prediction line says it was made for: a kvlab line's gold.outputs, the
// "outputs" bench/ruler_kvpress.py copies from the sample; null when the line has neither.
json line_outputs(const json& line) {
  if (line.contains("gold") && line["gold"].is_object() && line["gold"].contains("outputs")) return line["gold"]["outputs"];
  return line.value("outputs", json());
}

// One line per (branch, dataset): RULER's score of every prediction file, and for a branch named
// kvpress_<x> the fraction of its outputs equal to kvlab's branch <x> (same sample). Refuses what
// would score wrongly: a folder a kvlab run is still writing, an id given twice, a file without
// all of its samples (unless --partial), a line made for another sample than data/'s.
void run_ruler_eval(const RulerEvalOptions& o, const json& effective) {
  namespace fs = std::filesystem;
  const std::string data_dir = o.dirs.front() + "/data";
  KVLAB_CHECK(fs::is_directory(data_dir), "ruler eval: {} is not a folder (the first folder must be a kvlab ruler "
              "run: its samples are the references)", data_dir);
  for (const auto& dir : o.dirs) {
    const std::string pid = run_dir_writer(dir);
    KVLAB_CHECK(pid.empty(), "ruler eval: {} is being written by a kvlab run (pid {}); score it when that run has "
                "finished", dir, pid);
  }
  std::map<std::string, std::map<std::string, json>> gold;  // dataset -> id -> sample
  for (const auto& e : fs::directory_iterator(data_dir)) {
    if (e.path().extension() != ".jsonl") continue;
    for_each_json_line(e.path().string(), [&](const json& j, int64_t n) {
      KVLAB_CHECK(j.contains("index") && j["index"].is_number_integer() && j.contains("outputs") &&
                  j["outputs"].is_array(), "{}: line {} is not a RULER sample (an integer \"index\" and an "
                  "\"outputs\" list)", e.path().string(), n);
      gold[e.path().stem().string()][std::to_string(j["index"].get<int64_t>())] = j;
    });
  }
  // branch -> dataset -> id -> output
  std::map<std::string, std::map<std::string, std::map<std::string, std::string>>> outputs;
  std::vector<std::string> order;
  for (const auto& dir : o.dirs) {
    KVLAB_CHECK(fs::is_directory(dir + "/pred"), "ruler eval: {}/pred is not a folder", dir);
    int64_t unchecked = 0;  // lines that do not say which answers they were made for
    for (const auto& b : task_branch_folders(dir + "/pred")) {
      const std::string name = fs::path(b).filename().string();
      KVLAB_CHECK(!outputs.count(name), "ruler eval: branch {} is in two of the folders", name);
      order.push_back(name);
      for (const auto& e : fs::directory_iterator(b)) {
        if (e.path().extension() != ".jsonl") continue;
        const std::string file = e.path().string();
        const std::string dataset = e.path().stem().string();
        KVLAB_CHECK(gold.count(dataset), "ruler eval: {} has no samples in {} ({}.jsonl)", file, data_dir, dataset);
        std::map<std::string, int64_t> line_of;  // id -> the line that gave it
        auto& outs = outputs[name][dataset];
        for_each_json_line(file, [&](const json& j, int64_t n) {
          KVLAB_CHECK(j.contains("id") && j.contains("output") && j["output"].is_string(),
                      "{}: line {} has no \"id\" and \"output\" (a string)", file, n);
          const std::string id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
          KVLAB_CHECK(gold[dataset].count(id), "{}: line {}: sample {} is not in {}/{}.jsonl", file, n, id, data_dir,
                      dataset);
          KVLAB_CHECK(!line_of.count(id), "{}: line {}: sample {} again (first on line {}); a file holds one "
                      "prediction per sample", file, n, id, line_of[id]);
          line_of[id] = n;
          const json answers = line_outputs(j);
          if (answers.is_null()) ++unchecked;
          KVLAB_CHECK(answers.is_null() || answers == gold[dataset][id]["outputs"], "{}: line {}: predictions of "
                      "other samples (data/ written again?): sample {} was made for {}, data/{}.jsonl has {}", file, n,
                      id, answers.dump().substr(0, 40), dataset, gold[dataset][id]["outputs"].dump().substr(0, 40));
          outs[id] = j["output"].get<std::string>();
        });
        const size_t want = gold[dataset].size();
        KVLAB_CHECK(outs.size() == want || (o.partial && !outs.empty()), "{}: {} of the {} samples of {}/{}.jsonl "
                    "({}): a run still going or cut short? Finish it, or pass --partial", file, outs.size(), want, data_dir, dataset,
                    outs.empty() ? std::string("empty") : "first missing: " + [&] {
                      for (const auto& [id, _] : gold[dataset])
                        if (!outs.count(id)) return id;
                      return std::string();
                    }());
      }
    }
    if (unchecked)
      fmt::print(stderr, "[ruler eval] {}: {} predictions do not say which answers they were made for (no gold / "
                 "outputs field); scored by id alone\n", dir, unchecked);
  }
  json rows = json::array();
  for (const auto& b : order)
    for (const auto& [dataset, outs] : outputs[b]) {
      const json& sample = gold[dataset].begin()->second;  // the samples say their task and length
      const std::string task = sample.value("task", std::string());
      const bool part = std::any_of(ruler_tasks().begin(), ruler_tasks().end(),
                                    [&](const RulerTask& t) { return t.name == task && !t.match_all; });
      double sum = 0;
      for (const auto& [id, out] : outs)
        sum += ruler_score(out, {{"outputs", gold[dataset][id]["outputs"]}, {"match", part ? "part" : "all"}})["score"]
                   .get<double>();
      json row = {{"branch", b}, {"dataset", dataset}, {"n", outs.size()}, {"score", 100.0 * sum / double(outs.size())}};
      ruler_tag_row(row, task, sample.value("max_seq_length", int64_t(0)));
      // kvpress_<x>: how often its output is kvlab's <x>'s, over the samples both have.
      if (b.rfind("kvpress_", 0) == 0 && outputs.count(b.substr(8)) && outputs[b.substr(8)].count(dataset)) {
        const auto& mine = outputs[b.substr(8)][dataset];
        int64_t both = 0, same = 0;
        for (const auto& [id, out] : outs)
          if (mine.count(id)) ++both, same += mine.at(id) == out;
        if (both) row["same_as_kvlab"] = double(same) / double(both);
      }
      rows.push_back(row);
    }
  const json table = ruler_score_table(rows);
  RunDir run(o.out.empty() ? o.dirs.front() + "/eval" : o.out, "ruler-eval", effective, /*exact=*/true, o.overwrite);
  run.write_result(context_block("cpu", 0, effective), rows, {{"ruler", table}});
  std::cout << "RULER (string_match_all x 100)\n" << render_table(table, ruler_table_columns(table)) << "\n"
            << render_table(rows, {"branch", "dataset", "n", "score", "same_as_kvlab"});
  fmt::print(stderr, "[ruler eval] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_ruler(CLI::App& app) {
  CLI::App* r = add_command<RulerOptions>(app, "ruler",
                                          "RULER's synthetic tasks generated with the model's tokenizer, through "
                                          "compressed caches: string_match_all per task and length, fidelity to the "
                                          "full cache",
                                          run_ruler);
  add_command<RulerEvalOptions>(*r, "eval",
                                "Score folders of RULER prediction files (kvlab's branches, bench/ruler_kvpress.py's) "
                                "against a kvlab ruler run's samples",
                                run_ruler_eval);
}

}  // namespace kvlab::cli
