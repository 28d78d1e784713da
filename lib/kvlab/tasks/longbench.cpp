#include "kvlab/tasks/longbench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "kvlab/core/check.h"
#include "kvlab/tasks/prompt_split.h"
#include "kvlab/eval/metrics/longbench_eval.h"
#include "kvlab/model/model_tokenizer.h"

namespace kvlab {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string>& longbench_e_datasets() {
  static const std::vector<std::string> names = {
      "qasper",   "multifieldqa_en", "hotpotqa",      "2wikimqa",             "gov_report", "multi_news", "trec",
      "triviaqa", "samsum",          "passage_count", "passage_retrieval_en", "lcc",        "repobench-p"};
  return names;
}

LongBenchSelection parse_longbench_datasets(const std::string& spec) {
  LongBenchSelection sel;
  if (spec == "all") {
    sel.datasets = eval::longbench_datasets();
    return sel;
  }
  if (spec == "e") {
    sel.datasets = longbench_e_datasets();
    sel.e = true;
    return sel;
  }
  const auto& known = eval::longbench_datasets();
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string name = spec.substr(start, comma - start);
    start = comma + 1;
    if (name.empty()) continue;
    KVLAB_CHECK(std::find(known.begin(), known.end(), name) != known.end(),
                "--datasets: unknown LongBench dataset '{}'; known: all, e, {}", name, fmt::join(known, ", "));
    if (std::find(sel.datasets.begin(), sel.datasets.end(), name) == sel.datasets.end())
      sel.datasets.push_back(name);
  }
  KVLAB_CHECK(!sel.datasets.empty(), "--datasets: no dataset named in '{}' (e.g. multi_news,passage_retrieval_zh)",
              spec);
  return sel;
}

int64_t longbench_max_new_tokens(const std::string& path, const std::string& dataset) {
  std::ifstream in(path);
  KVLAB_CHECK(in.good(), "LongBench's dataset2maxlen.json not found at '{}' (--max-gen-file)", path);
  const json j = json::parse(in, nullptr, false);
  KVLAB_CHECK(j.is_object(), "{}: not a JSON object of dataset -> max new tokens", path);
  auto it = j.find(dataset);
  KVLAB_CHECK(it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0,
              "{}: no positive integer for dataset '{}'", path, dataset);
  return it->get<int64_t>();
}

TaskRecord longbench_task_record(const PromptRecord& rec, const ModelSource& src, const Tokenizer& tok,
                                 const std::string& chat_template, int64_t max_length, int64_t max_new_tokens) {
  KVLAB_CHECK(max_length > 0, "--max-length must be positive, got {}", max_length);
  std::string prompt = rec.prompt;
  const std::vector<int64_t> ids = tok.encode(prompt, /*add_bos=*/false);
  int64_t truncated_from = 0;
  if (int64_t(ids.size()) > max_length) {
    const auto half = static_cast<std::ptrdiff_t>(max_length / 2);
    prompt = tok.decode(std::vector<int64_t>(ids.begin(), ids.begin() + half), true) +
             tok.decode(std::vector<int64_t>(ids.end() - half, ids.end()), true);
    truncated_from = int64_t(ids.size());
  }
  // The question is the template's text after {context}; a cut prompt still ends with it unless
  // the cut reached into it (then the record has no split).
  const bool ends_with_question = !rec.question.empty() && prompt.size() >= rec.question.size() &&
                                  prompt.compare(prompt.size() - rec.question.size(), rec.question.size(),
                                                 rec.question) == 0;
  const size_t raw_split = ends_with_question ? prompt.size() - rec.question.size() : std::string::npos;
  const std::string raw = prompt;
  if (rec.use_chat_template) prompt = apply_model_chat_template(chat_template, src, tok, prompt);
  TaskRecord r;
  r.id = rec.id;
  SplitPrompt sp = encode_split(tok, prompt, offset_in(prompt, raw, raw_split));
  r.prompt = std::move(sp.ids);
  r.context_len = sp.context_len;
  r.max_new_tokens = max_new_tokens;
  if (rec.dataset == "samsum") r.stop = {"\n"};
  json all_classes = rec.extra.contains("all_classes") ? rec.extra["all_classes"] : json(nullptr);
  KVLAB_CHECK((all_classes.is_array() && !all_classes.empty()) ||
                  eval::longbench_metric_name(rec.dataset) != "classification_score",
              "{} record '{}': dataset {} is scored against 'all_classes' (classification_score), which is null or "
              "empty", rec.dataset, rec.id, rec.dataset);
  r.gold = {{"answers", rec.answers}, {"all_classes", all_classes}, {"raw_prompt_tokens", ids.size()}};
  if (truncated_from > 0) r.gold["truncated_from"] = truncated_from;
  if (rec.extra.contains("length")) r.gold["length"] = rec.extra["length"];
  return r;
}

namespace {

std::vector<std::string> strings_of(const json& j, const std::string& where, const char* key) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  KVLAB_CHECK(j.is_array(), "{}: '{}' must be a list of strings or null, found {}", where, key, j.type_name());
  for (const auto& s : j) {
    KVLAB_CHECK(s.is_string(), "{}: '{}' must hold strings", where, key);
    out.push_back(s.get<std::string>());
  }
  return out;
}

// trec and lsht are scored against their label set: eval.py fails on a null one (it iterates
// it), kvlab used to score every line 0.
void check_classes(const std::string& dataset, const std::vector<std::string>& classes, const std::string& where) {
  KVLAB_CHECK(!classes.empty() || eval::longbench_metric_name(dataset) != "classification_score",
              "{}: dataset {} is scored against 'all_classes' (classification_score), which is null or empty",
              where, dataset);
}

}  // namespace

TaskSpec longbench_task(const std::string& dataset) {
  eval::longbench_metric(dataset);  // throws for an unknown dataset
  TaskSpec t;
  t.dataset = dataset;
  t.score = [dataset](const std::string& output, const json& gold) {
                    const auto answers = strings_of(gold.at("answers"), dataset, "answers");
                    const auto classes = strings_of(gold.value("all_classes", json(nullptr)), dataset, "all_classes");
                    check_classes(dataset, classes, "the record's gold");
                    json s = {{"score", eval::longbench_record_score(dataset, output, answers, classes)},
                              {"pred", output},
                              {"answers", gold.at("answers")},
                              {"all_classes", gold.value("all_classes", json(nullptr))}};
                    if (gold.contains("length")) s["length"] = gold["length"];
                    return s;
                  };
  return t;
}

json longbench_eval_folder(const std::string& folder, bool e) {
  KVLAB_CHECK(fs::is_directory(folder), "'{}' is not a folder of <dataset>.jsonl prediction files", folder);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.is_regular_file() && entry.path().extension() == ".jsonl") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  KVLAB_CHECK(!files.empty(), "'{}' holds no .jsonl prediction files", folder);
  json scores = json::object();
  std::map<std::string, fs::path> file_of;  // dataset -> the file scored for it
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    const std::string dataset = name.substr(0, name.find('.'));  // eval.py: filename.split('.')[0]
    const auto& known = eval::longbench_datasets();
    KVLAB_CHECK(std::find(known.begin(), known.end(), dataset) != known.end(),
                "{}: '{}' is not a LongBench dataset (eval.py names the dataset by the file name)", path.string(),
                dataset);
    // eval.py would score both and keep the later: multi_news.old.jsonl over multi_news.jsonl.
    const auto [seen, fresh] = file_of.emplace(dataset, path);
    KVLAB_CHECK(fresh, "{} and {} both name dataset {} (the file name up to its first '.'); move one out of {}",
                seen->second.filename().string(), name, dataset, folder);
    std::vector<std::string> preds;
    std::vector<std::vector<std::string>> answers;
    std::vector<int64_t> lengths;
    std::vector<std::string> all_classes;
    std::ifstream in(path);
    int64_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.empty()) continue;
      const std::string where = fmt::format("{}:{}", path.string(), line_no);
      const json d = json::parse(line, nullptr, false);
      KVLAB_CHECK(d.is_object(), "{}: not a JSON object", where);
      KVLAB_CHECK(d.contains("pred") && d["pred"].is_string(), "{}: no string 'pred'", where);
      KVLAB_CHECK(d.contains("answers"), "{}: no 'answers'", where);
      preds.push_back(d["pred"].get<std::string>());
      answers.push_back(strings_of(d["answers"], where, "answers"));
      all_classes = strings_of(d.value("all_classes", json(nullptr)), where, "all_classes");  // the last line's
      if (d.contains("length")) {
        KVLAB_CHECK(d["length"].is_number_integer(), "{}: 'length' must be an integer", where);
        lengths.push_back(d["length"].get<int64_t>());
      }
    }
    // No lines: a shard that drew none of the dataset's records. No score (eval.py would divide by
    // zero), the dataset is left out of the table.
    if (preds.empty()) continue;
    check_classes(dataset, all_classes, path.string() + " (its last line)");
    if (e) {
      KVLAB_CHECK(lengths.size() == preds.size(), "{}: --e needs 'length' on every line", path.string());
      const auto b = eval::scorer_e(dataset, preds, answers, lengths, all_classes);
      auto num = [](double x) { return std::isnan(x) ? json(nullptr) : json(x); };
      scores[dataset] = {{"0-4k", num(b.upto_4k)}, {"4-8k", num(b.from_4k)}, {"8k+", num(b.from_8k)}};
    } else {
      scores[dataset] = eval::scorer(dataset, preds, answers, all_classes);
    }
  }
  return scores;
}

json longbench_score_table(const std::vector<std::pair<std::string, json>>& scored,
                           const std::vector<std::string>& datasets, bool e) {
  json rows = json::array();
  for (const auto& [label, scores] : scored) {
    if (e) {
      for (const char* bucket : {"0-4k", "4-8k", "8k+"}) {
        json row = {{"branch", label}, {"bucket", bucket}};
        for (const auto& d : datasets)
          if (scores.contains(d) && scores[d][bucket].is_number()) row[d] = scores[d][bucket];
        rows.push_back(row);
      }
      continue;
    }
    json row = {{"branch", label}};
    double sum = 0;
    int n = 0;
    for (const auto& d : datasets)
      if (scores.contains(d) && scores[d].is_number()) {
        row[d] = scores[d];
        sum += scores[d].get<double>();
        ++n;
      }
    if (n > 0) row["average"] = sum / n;
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::string> longbench_table_columns(const std::vector<std::string>& datasets, bool e) {
  std::vector<std::string> cols = {"branch"};
  if (e) cols.push_back("bucket");
  cols.insert(cols.end(), datasets.begin(), datasets.end());
  if (!e) cols.push_back("average");
  return cols;
}

}  // namespace kvlab
