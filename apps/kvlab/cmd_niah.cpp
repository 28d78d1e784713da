// kvlab niah --model M [--lengths 1024,2048,4096,8192] [--depths 0,25,50,75,100] [--method a,b]
//            (--ratio r | --budget N | --T t) [--needle S] [--question S] [--key-phrase S]
//            [--haystack-dir D] [--max-new-tokens 64] [--out DIR | --results-dir D --name N]
// Needle in a haystack (tasks/niah.h) through compressed caches: every (length, depth) cell is one
// record with one exact prefill shared by the full cache and every (method, budget) branch; the
// score is whether the output holds the needle's key phrase, with fidelity to the full cache
// beside it. Predictions in <out>/pred/<branch>/niah.jsonl (a rerun with the same --out resumes);
// every branch's grid in result.json (record_scores), printed (depth rows by length columns) and
// drawn in heatmap.svg (one panel per branch).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/paths.h"
#include "kvlab/core/provenance.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/niah.h"
#include "kvlab/tasks/niah_figure.h"
#include "task_command.h"
#include "kvlab/tasks/prompt_split.h"

namespace kvlab::cli {
namespace {

const char* kSystem = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct";

struct NiahOptions {
  TaskCommonOptions common{"niah"};
  std::vector<int64_t> lengths = {1024, 2048, 4096, 8192};
  std::vector<double> depths = {0, 25, 50, 75, 100};
  std::string haystack_dir = shared_default("data/niah/PaulGrahamEssays");
  NiahSpec spec;
  int64_t max_new_tokens = 64;
  void fields(FieldList& f) {
    f.add("lengths", lengths, "context lengths in tokens (the prompt, question included)");
    f.add("depths", depths, "needle depths, percent of the context (0 = start, 100 = end)");
    f.add("haystack_dir", haystack_dir, "folder of the haystack essays (*.txt, read in name order)");
    f.add("needle", spec.needle, "the needle sentence");
    f.add("question", spec.question, "the retrieval question");
    f.add("key_phrase", spec.key_phrase, "an output holding this phrase (case-insensitive) scores 1");
    f.add("max_new_tokens", max_new_tokens, "tokens generated per cell");
    common.fields(f);
  }
  void check() const {
    KVLAB_CHECK(max_new_tokens >= 1, "--max-new-tokens must be >= 1, got {}", max_new_tokens);
    KVLAB_CHECK(!lengths.empty() && !depths.empty(), "give --lengths and --depths (one value at least)");
    KVLAB_CHECK(!spec.key_phrase.empty(), "--key-phrase must not be empty");
    // issue 50: an empty needle hid nothing and an empty question asked nothing, and both ran.
    KVLAB_CHECK(!spec.needle.empty(), "--needle must not be empty (the sentence hidden in the haystack)");
    KVLAB_CHECK(!spec.question.empty(), "--question must not be empty (the retrieval question)");
    // --lengths and --depths name each value once: Command::resolve checks every list flag.
    plan_task(common, /*need_files=*/false);
  }
};

// Depth rows by length columns of one branch's scores, as text.
std::string grid_text(const NiahOptions& o, const nlohmann::json& scores) {
  std::string s = fmt::format("{:>8}", "depth");
  for (int64_t L : o.lengths) s += fmt::format(" {:>7}", L);
  s += "\n";
  for (double d : o.depths) {
    s += fmt::format("{:>7g}%", d);
    for (int64_t L : o.lengths) {
      const std::string id = fmt::format("len{}_depth{:g}", L, d);
      s += scores.contains(id) ? fmt::format(" {:>7g}", scores[id].get<double>()) : fmt::format(" {:>7}", "-");
    }
    s += "\n";
  }
  return s;
}

void run_niah(const NiahOptions& o, const nlohmann::json& effective) {
  const TaskPlan plan = plan_task(o.common);
  const std::string haystack = read_haystack(o.haystack_dir);
  auto tm = load_task_model(o.common);
  const auto& c = o.common;
  for (int64_t L : o.lengths)
    KVLAB_CHECK(fits_context(L, o.max_new_tokens, tm->context),
                "--lengths: {} tokens with --max-new-tokens {} exceed {}'s context of {}", L, o.max_new_tokens,
                tm->model.id, tm->context);

  std::vector<TaskRecord> records;
  for (int64_t L : o.lengths)
    for (double d : o.depths) {
      const NiahCase nc = make_niah_case(tm->tok, haystack, o.spec, L, d);
      TaskRecord r;
      r.id = nc.id;
      const std::string text = apply_model_chat_messages(
          c.chat_template, tm->src, tm->tok,
          {{"system", kSystem},
           {"user", nc.context},
           {"user", o.spec.question + " Don't give information outside the document or repeat your findings"}});
      SplitPrompt sp = encode_split(tm->tok, text, offset_in(text, nc.context, nc.context.size()));
      r.prompt = std::move(sp.ids);
      r.context_len = sp.context_len;
      KVLAB_CHECK(fits_context(int64_t(r.prompt.size()), o.max_new_tokens, tm->context),
                  "--lengths {}: with the question and the chat template the prompt has {} tokens; with "
                  "--max-new-tokens {} that exceeds {}'s context of {} (lower --lengths or shorten --question)", L,
                  r.prompt.size(), o.max_new_tokens, tm->model.id, tm->context > 0 ? tm->context : kMaxTokens);
      r.max_new_tokens = o.max_new_tokens;
      r.gold = {{"needle", o.spec.needle}, {"key_phrase", o.spec.key_phrase}, {"length", L}, {"depth", d},
                {"needle_token", nc.needle_token}, {"context_tokens", nc.context_tokens}};
      records.push_back(std::move(r));
    }

  TaskRun tr = open_task_run(c, *tm, effective, plan);
  const RunDir& run = tr.run;
  nlohmann::json rows = nlohmann::json::array();
  run_task_dataset(c, *tm, tr, TaskSpec{"niah", niah_score}, records, plan, rows, /*last=*/true);
  std::vector<NiahPanel> panels;
  for (const auto& row : rows) panels.push_back({row["branch"].get<std::string>(), row["record_scores"]});
  write_text_atomic(run.file("heatmap.svg"),
                    niah_heatmap_svg(panels, o.lengths, o.depths,
                                     fmt::format("Needle in a haystack: {}", tm->model.id)));
  for (const auto& row : rows)
    std::cout << row["branch"].get<std::string>() << " (score: needle found)\n" << grid_text(o, row["record_scores"]) << "\n";
  std::cout << task_table_header(c, plan) << render_table(rows, {"branch", "n", "score", "same_as_exact", "rougeL_vs_exact", "entries_start", "entries_peak", "mem",
                                   "seconds_per_record"});
  fmt::print(stderr, "[niah] wrote {}, {} and {}\n", run.file("result.json"), run.file("heatmap.svg"),
             run.file("pred/"));
}

}  // namespace

void setup_niah(CLI::App& app) {
  add_command<NiahOptions>(app, "niah",
                           "Needle in a haystack through compressed caches: a length x depth grid per method, "
                           "scores and fidelity to the full cache",
                           run_niah);
}

}  // namespace kvlab::cli
