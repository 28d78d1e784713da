#include "kvlab/tasks/task_runner.h"

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "kvlab/core/aggregate.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/memory.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sha256.h"
#include "kvlab/core/write_check.h"
#include "kvlab/eval/metrics/rouge_google.h"
#include "kvlab/eval/metrics/unicode.h"
#include "kvlab/generate/branches.h"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// The output text: decoded ids cut before the first stop string.
std::string cut_at_stop(std::string text, const std::vector<std::string>& stop) {
  size_t cut = text.size();
  for (const auto& s : stop)
    if (!s.empty()) cut = std::min(cut, text.find(s));
  return text.substr(0, cut);
}

// Prediction lines already written (`text`, the file at `path`): record id -> line.
std::map<std::string, nlohmann::json> read_preds(const std::string& text, const std::string& path) {
  std::map<std::string, nlohmann::json> out;
  std::istringstream f(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      // A line cut by a kill (the last one): the record runs again.
      KVLAB_CHECK(f.peek() == EOF, "{}: line {} is not JSON (only the last line may be cut by an interruption)",
                  path, n);
      continue;
    }
    KVLAB_CHECK(j.is_object() && j.contains("id") && j["id"].is_string(), "{}: line {} has no string \"id\"", path, n);
    out[j["id"].get<std::string>()] = j;
  }
  return out;
}

// What a prediction line was made from (issue 26: resume by content, not by id alone): SHA-256 of
// the record's prompt ids, context split, new-token limit, stop strings and gold, and of the
// branch's label, method (name, effective parameters, preset, keeps), seed and protocol.
std::string prediction_key(const TaskRecord& r, const TaskBranch& b, const TaskOptions& opt) {
  const nlohmann::json j = {{"prompt", r.prompt},
                            {"context_len", r.context_len},
                            {"max_new_tokens", r.max_new_tokens},
                            {"stop", r.stop},
                            {"gold", r.gold},
                            {"branch", b.label},
                            {"method", b.method.describe(opt.keep_first, opt.keep_last)},
                            {"seed", opt.seed},
                            {"protocol", opt.protocol.to_json()}};
  return sha256_hex(j.dump()).substr(0, 16);
}

bool is_cjk(char32_t c) {
  return (c >= 0x3040 && c <= 0x30FF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) ||
         (c >= 0xAC00 && c <= 0xD7AF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x20000 && c <= 0x2A6DF);
}

// rouge-score's tokens of the text between CJK characters, each CJK character a token.
std::vector<std::string> fidelity_tokens(const std::string& text) {
  std::vector<std::string> out;
  std::u32string u;
  try {
    u = eval::utf8_decode(text);
  } catch (const std::exception&) {  // a generation cut inside a character: its bytes become U+FFFD
    for (unsigned char b : text) u.push_back(b < 0x80 ? char32_t(b) : char32_t(0xFFFD));
  }
  std::u32string segment;
  auto flush = [&] {
    for (auto& t : eval::google_rouge_tokenize(eval::utf8_encode(segment), false)) out.push_back(std::move(t));
    segment.clear();
  };
  for (char32_t c : u) {
    if (!is_cjk(c)) {
      segment.push_back(c);
      continue;
    }
    flush();
    out.push_back(eval::utf8_encode(std::u32string(1, c)));
  }
  flush();
  return out;
}

}  // namespace

double fidelity_rouge_l(const std::string& reference, const std::string& output) {
  return eval::google_rouge_l(fidelity_tokens(reference), fidelity_tokens(output)).fmeasure;
}

nlohmann::json task_summary_row(const TaskBranch& branch, const TaskSpec& task, const std::vector<std::string>& ids,
                                const std::map<std::string, nlohmann::json>& lines) {
  double score = 0, same = 0, rouge = 0, secs = 0;
  std::vector<double> means(task.mean_keys.size(), 0.0);
  nlohmann::json per_record = nlohmann::json::object();
  for (const auto& id : ids) {
    auto it = lines.find(id);
    KVLAB_CHECK(it != lines.end(), "{}: branch {} has no prediction for record '{}'", task.dataset, branch.label, id);
    const auto& l = it->second;
    per_record[id] = l["score"];
    score += l["score"].get<double>();
    same += l["same_as_exact"].get<bool>() ? 1.0 : 0.0;
    rouge += l["rougeL_vs_exact"].get<double>();
    secs += l["seconds"].get<double>();
    for (size_t k = 0; k < means.size(); ++k) means[k] += l.at(task.mean_keys[k]).get<double>();
  }
  const double n = std::max<double>(1.0, double(ids.size()));
  nlohmann::json row = {{"branch", branch.label},
                        {"method", branch.method.label()},
                        {"preset", branch.method.preset},
                        {"setting", branch.method.name == "exact" ? "full" : setting_label(branch.method, branch.budget)},
                        {"params", branch.method.compressor ? branch.method.compressor->params() : nlohmann::json()},
                        {"dataset", task.dataset},
                        {"n", ids.size()},
                        {"score", 100.0 * score / n}};
  if (branch.method.quant) row["kv_quant"] = branch.method.quant->name();
  for (size_t k = 0; k < means.size(); ++k) row[task.mean_keys[k]] = 100.0 * means[k] / n;
  row["same_as_exact"] = same / n;
  row["rougeL_vs_exact"] = rouge / n;
  row["seconds_per_record"] = secs / n;
  // Memory (issue 21): the mean of each record's numbers; rows of runs before it have none.
  for (const char* key : {"entries_start", "entries_mean", "entries_peak", "bytes_mean", "bytes_peak"}) {
    double sum = 0;
    bool all = !ids.empty();
    for (const auto& id : ids) {
      const auto& l = lines.at(id);
      all = all && l.contains(key) && l[key].is_number();
      if (all) sum += l[key].get<double>();
    }
    if (all) row[key] = sum / n;
  }
  if (lines.size() && !ids.empty() && lines.at(ids.front()).contains("keep_first")) {
    row["keep_first"] = lines.at(ids.front())["keep_first"];
    row["keep_last"] = lines.at(ids.front())["keep_last"];
  }
  row["record_scores"] = per_record;
  return row;
}

std::string task_branch_label(const MethodSpec& method, const Budget& budget) {
  if (method.budget_free()) return method.label();  // "exact", the full cache quantized ("kivi2"), "simlayerkv"
  std::string b = budget.label();
  b.erase(std::remove(b.begin(), b.end(), '='), b.end());
  return method.label() + "_" + b;
}

void mark_unequal_memory(nlohmann::json& rows) {
  mark_off_median(
      rows, "entries_start",
      [](const nlohmann::json& r) {
        return r.value("dataset", std::string()) + "|" + r.value("setting", std::string()) + "|" +
               r.value("kv_quant", std::string());
      },
      [](const nlohmann::json& r) { return r.value("method", std::string()) != "exact"; });
}

nlohmann::json run_task(const Model& model, const Tokenizer& tok, const TaskSpec& task,
                        const std::vector<TaskRecord>& records, const std::vector<TaskBranch>& branches,
                        const TaskOptions& opt) {
  c10::InferenceMode guard;
  KVLAB_CHECK(!branches.empty() && branches.front().method.full_cache(),
              "tasks: the first branch must be exact (the fidelity reference)");
  std::map<std::string, size_t> first_index;
  for (size_t j = 0; j < records.size(); ++j) {
    auto [it, fresh] = first_index.emplace(records[j].id, j);
    KVLAB_CHECK(fresh, "{}: records {} and {} have the same id '{}'; every record needs its own", task.dataset,
                it->second + 1, j + 1, records[j].id);
  }
  std::vector<std::string> files;
  std::vector<std::optional<std::string>> stored;  // each file's text; none while it does not exist
  std::vector<std::map<std::string, nlohmann::json>> done;
  for (const auto& b : branches) {
    fs::create_directories(opt.pred_dir + "/" + b.label);
    files.push_back(opt.pred_dir + "/" + b.label + "/" + task.dataset + ".jsonl");
    stored.push_back(fs::exists(files.back()) ? std::optional(read_text_file(files.back(), "predictions"))
                                              : std::nullopt);
    done.push_back(read_preds(stored.back().value_or(""), files.back()));
  }
  // A line made from other inputs or settings (a dataset edited in place, another --max-new-tokens
  // with --overwrite, ...) is redone, never reused; lines written before keys existed are kept.
  const std::string model_k = model_key(model);
  {  // before any prediction file changes: a calibration of another model is refused
    std::vector<MethodSpec> methods;
    for (const auto& b : branches) methods.push_back(b.method);
    check_calibrated_on(methods, model_k, model.id);
  }
  for (size_t i = 0; i < branches.size(); ++i) {
    int64_t redone = 0, unkeyed = 0;
    for (const auto& r : records) {
      auto it = done[i].find(r.id);
      if (it == done[i].end()) continue;
      if (!it->second.contains("input_key")) {
        ++unkeyed;
      } else if (it->second["input_key"] != prediction_key(r, branches[i], opt) ||
                 it->second.value("model_key", model_k) != model_k) {
        done[i].erase(it);
        ++redone;
      }
    }
    if (redone)
      fmt::print(stderr, "[resume] {}: {} of its predictions were made from another record, setting or model; running "
                 "them again\n", files[i], redone);
    if (unkeyed)
      fmt::print(stderr, "[resume] {}: {} predictions carry no input_key (made before kvlab checked them); reused "
                 "by id\n", files[i], unkeyed);
  }
  // Each file's text from its parsed lines (a cut last line, a redone record's line, one of an id
  // not in `records` dropped). A file whose text changes, or a record to decode, changes pred/: the
  // caller hears of it first (before_change); then the changed files are rewritten atomically, so a
  // kill never leaves one shorter than its old or its new text, and a resume with nothing to drop
  // writes nothing.
  std::vector<std::string> texts(files.size());
  bool changes = false;
  for (size_t i = 0; i < files.size(); ++i) {
    for (const auto& r : records) {
      auto it = done[i].find(r.id);
      if (it == done[i].end()) changes = true;  // to decode
      else texts[i] += it->second.dump() + "\n";
    }
    changes = changes || stored[i] != texts[i];
  }
  if (changes && opt.before_change) opt.before_change();
  for (size_t i = 0; i < files.size(); ++i)
    if (stored[i] != texts[i]) write_text_atomic(files[i], texts[i]);
  std::vector<const Compressor*> compressors;
  for (const auto& b : branches) compressors.push_back(b.method.compressor.get());
  const int64_t n_obs = check_observation_queries(compressors, opt.obs_queries);  // -1 = every prompt query
  std::vector<double> seconds(branches.size(), 0.0);
  int64_t finished = 0;
  // The last context prefilled, kept while the next records ask about the same context group.
  std::optional<Prefill> shared;
  std::string shared_group;
  for (const auto& r : records) {
    bool all = true;
    for (const auto& d : done) all = all && d.count(r.id);
    if (all) {
      if (opt.progress) opt.progress(++finished, int64_t(records.size()), r.id + " (done before)", true);
      continue;
    }
    // --protocol context: the exact prefill covers the context only; the rest goes through each
    // branch's compressed cache (BranchOptions::suffix).
    const bool two_stage = opt.protocol.question == TaskProtocol::Question::context;
    KVLAB_CHECK(!two_stage || (r.context_len > 0 && r.context_len < int64_t(r.prompt.size())),
                "--protocol context: record '{}' of {} has no context/question split (context {} of {} prompt "
                "tokens); its task did not find where the question starts", r.id, task.dataset, r.context_len,
                r.prompt.size());
    const std::vector<int64_t> context(r.prompt.begin(), r.prompt.begin() + (two_stage ? r.context_len
                                                                                       : int64_t(r.prompt.size())));
    const std::vector<int64_t> suffix(r.prompt.begin() + int64_t(context.size()), r.prompt.end());
    // A question about the context prefilled for the record before (TaskRecord::context_group)
    // shares its prefill; the prefill's and kvzip's reconstruction's time go on the lines of the
    // first question that made them.
    const bool same_context = two_stage && shared && !r.context_group.empty() && r.context_group == shared_group;
    KVLAB_CHECK(!same_context || shared->prompt == context, "{}: record '{}' is in context group '{}' but its {} "
                "context tokens differ from the group's {} (the task split its questions' prompts differently)",
                task.dataset, r.id, r.context_group, context.size(), shared->prompt.size());
    if (!same_context) {
      shared.reset();
      release_free_memory();  // what the last record's prefill and branches freed (core/memory.h)
      shared.emplace(run_prefill(model, context, n_obs < 0 ? int64_t(context.size()) : n_obs));
      shared->reconstruction = reconstruction_prompt_for(context, opt.reconstruction_templated,
                                                         opt.reconstruction_plain);
      shared_group = r.context_group;
      // --protocol whole: the question is in the prefill, from context_len on (finch's window).
      if (!two_stage && r.context_len > 0 && r.context_len < int64_t(context.size()))
        shared->question_start = r.context_len;
    }
    const Prefill& pre = *shared;
    nlohmann::json kept_branches = nlohmann::json::array();
    std::string exact_out;
    // The branches this record still needs, decoded one by one or in one batch.
    std::vector<size_t> todo;
    std::vector<BranchSpec> specs;
    std::vector<BranchOptions> bos;
    for (size_t i = 0; i < branches.size(); ++i) {
      if (auto it = done[i].find(r.id); it != done[i].end()) {
        if (i == 0) exact_out = it->second["output"].get<std::string>();
        continue;
      }
      BranchOptions bo;
      bo.suffix = suffix;
      bo.keep_kept = !opt.kept_dir.empty();
      bo.max_new_tokens = r.max_new_tokens;
      bo.stop_at_eos = true;
      if (!r.stop.empty())
        bo.stop_when = [&](const std::vector<int64_t>& ids) {
          const std::string text = tok.decode(ids, true);
          for (const auto& s : r.stop)
            if (!s.empty() && text.find(s) != std::string::npos) return true;
          return false;
        };
      const MethodSpec& m = branches[i].method;
      todo.push_back(i);
      Budget budget = branches[i].budget;
      if (opt.protocol.ratio_of_answer && budget.kind == Budget::Kind::ratio && !m.full_cache())
        budget = Budget::of_entries(ratio_of_answer_entries(budget.ratio, int64_t(r.prompt.size()), r.max_new_tokens));
      specs.push_back({m, budget, opt.seed, m.keep_first_or(opt.keep_first), m.keep_last_or(opt.keep_last),
                       opt.protocol.streams(), /*count_whole=*/true,
                       opt.protocol.decode == TaskProtocol::Decode::rerotate, DecodingRule{opt.protocol.every}});
      bos.push_back(std::move(bo));
    }
    // --layer-error: the question through the full cache once, each branch judged on its queries.
    std::optional<QuestionProbe> probe;
    if (opt.layer_error && !todo.empty()) {
      const MethodSpec& ex = branches[0].method;
      probe.emplace(probe_question(model, pre, suffix,
                                   {ex, branches[0].budget, opt.seed, ex.keep_first_or(opt.keep_first),
                                    ex.keep_last_or(opt.keep_last), false, /*count_whole=*/true}));
    }
    std::vector<BranchResult> results;
    if (opt.batch) {
      results = run_branches(model, pre, specs, bos);
    } else {
      for (size_t j = 0; j < todo.size(); ++j) results.push_back(run_branch(model, pre, specs[j], bos[j]));
    }
    for (size_t j = 0; j < todo.size(); ++j) {
      const size_t i = todo[j];
      const BranchSpec& spec = specs[j];
      const MethodSpec& m = spec.method;
      const BranchResult& br = results[j];
      if (bos[j].keep_kept) {
        nlohmann::json k = br.kept;
        k["branch"] = branches[i].label;
        k["method"] = m.label();
        k["params"] = m.describe(opt.keep_first, opt.keep_last);
        kept_branches.push_back(std::move(k));
      }
      const std::string out = cut_at_stop(tok.decode(br.ids, true), r.stop);
      if (i == 0) exact_out = out;
      nlohmann::json line = {{"id", r.id}, {"prompt_tokens", r.prompt.size()}, {"output", out}, {"gold", r.gold},
                             {"generated_tokens", br.ids.size()},
                             {"input_key", prediction_key(r, branches[i], opt)},
                             {"model_key", model_k}};
      if (opt.protocol.ratio_of_answer) line["ratio_of"] = "prompt+answer";
      const nlohmann::json s = task.score(out, r.gold);
      for (auto it = s.begin(); it != s.end(); ++it) line[it.key()] = it.value();
      line["context_len"] = r.context_len;  // prompt[0, context_len) is the context (--protocol context)
      line["keep_first"] = spec.keep_first;
      line["keep_last"] = spec.keep_last;
      line["entries_start"] = br.entries_start;
      line["entries_mean"] = br.entries_mean;
      line["entries_peak"] = br.entries_peak;
      line["bytes_mean"] = br.bytes_mean;
      line["bytes_peak"] = br.kv_bytes_peak;
      if (probe) {
        const std::vector<double> err = branch_layer_error(model, pre, spec, *probe);
        nlohmann::json by_layer = nlohmann::json::array();
        double sum = 0;
        int64_t counted = 0;
        for (double e : err) {
          by_layer.push_back(std::isfinite(e) ? nlohmann::json(e) : nlohmann::json(nullptr));  // null: an exact window layer
          if (std::isfinite(e)) sum += e, ++counted;
        }
        line["layer_rel_err"] = counted ? sum / double(counted) : 0.0;
        line["layer_rel_err_by_layer"] = by_layer;
      }
      line["same_as_exact"] = out == exact_out;
      line["rougeL_vs_exact"] = fidelity_rouge_l(exact_out, out);
      // Compression and decoding (batched: each step's wall time split among its branches); the
      // exact branch also carries the shared prefill, a kvzip branch its second prefill (made once
      // per record, counted for each branch that needs it).
      line["seconds"] = br.compress_ms / 1000.0 + br.decode_seconds +
                        (same_context ? 0.0 : (i == 0 ? pre.seconds : 0.0) + br.reconstruction_seconds);
      line["compress_seconds"] = br.compress_ms / 1000.0;
      if (br.reconstruction_seconds > 0 && !same_context) line["reconstruction_seconds"] = br.reconstruction_seconds;
      if (!r.context_group.empty()) line["context_group"] = r.context_group, line["question_index"] = r.question_index;
      std::ofstream f(files[i], std::ios::app);
      f << line.dump() << "\n";
      check_written(f, files[i]);
      done[i][r.id] = line;
    }
    if (!opt.kept_dir.empty()) {
      const fs::path dir = fs::path(opt.kept_dir) / task.dataset;
      fs::create_directories(dir);
      std::string name = r.id;
      for (char& ch : name)
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) ch = '_';
      std::ofstream f(dir / (name + ".json"));
      f << nlohmann::json{{"record", r.id}, {"protocol", opt.protocol.to_json()}, {"branches", kept_branches}}.dump()
        << "\n";
      check_written(f, (dir / (name + ".json")).string());
    }
    if (opt.progress) opt.progress(++finished, int64_t(records.size()), r.id, false);
  }
  // The summary, from every branch's lines over these records.
  std::vector<std::string> ids;
  for (const auto& r : records) ids.push_back(r.id);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < branches.size(); ++i) rows.push_back(task_summary_row(branches[i], task, ids, done[i]));
  for (auto& row : rows) {
    row["protocol"] = opt.protocol.question_name(), row["decode_rule"] = opt.protocol.decode_name();
    if (opt.protocol.ratio_of_answer) row["ratio_of"] = "prompt+answer";
  }
  mark_unequal_memory(rows);
  return rows;
}

}  // namespace kvlab
