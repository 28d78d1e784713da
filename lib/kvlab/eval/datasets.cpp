// JSONL prompt sources (see datasets.h). LongBench formatting follows THUDM/LongBench pred.py:
// prompt = dataset2prompt[dataset].format(**record); chat template skipped for trec, triviaqa,
// samsum, lsht, lcc, repobench-p; over-long prompts cut in the middle.
#include "kvlab/eval/datasets.h"

#include "kvlab/core/check.h"

#include <filesystem>
#include <fstream>

namespace kvlab {

namespace fs = std::filesystem;
using nlohmann::json;

std::string schema_name(DatasetSchema s) {
  switch (s) {
    case DatasetSchema::LongBench: return "longbench";
    case DatasetSchema::LongEval: return "longeval";
    case DatasetSchema::Xsum: return "xsum";
    case DatasetSchema::MtBench: return "mt_bench";
    case DatasetSchema::GenericPrompt:
    case DatasetSchema::GenericText: return "generic";
  }
  return "generic";
}

DatasetSchema detect_schema(const json& r, const std::string& where) {
  KVLAB_CHECK(r.is_object(), "{}: a record must be a JSON object, found {}", where, r.type_name());
  auto has = [&](const char* k) { return r.contains(k); };
  if (has("context") && has("input") && has("answers")) return DatasetSchema::LongBench;
  if (has("prompt") && has("expected_number")) return DatasetSchema::LongEval;
  if (has("article")) return DatasetSchema::Xsum;
  if (has("turns") && has("question_id")) return DatasetSchema::MtBench;
  if (has("prompt")) return DatasetSchema::GenericPrompt;
  if (has("text")) return DatasetSchema::GenericText;
  std::string keys;
  for (auto it = r.begin(); it != r.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  KVLAB_FAIL("{}: unknown record schema (keys: {}); expected LongBench (input, context, answers), "
             "LongEval (prompt, expected_number), XSUM (article), MT-Bench (question_id, turns) or a generic 'prompt' / 'text' field",
             where, keys);
}

std::string format_prompt_template(const std::string& tmpl, const json& record, const std::string& where) {
  std::string out;
  out.reserve(tmpl.size());
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if ((c == '{' || c == '}') && i + 1 < tmpl.size() && tmpl[i + 1] == c) {
      out += c;
      ++i;
    } else if (c == '{') {
      const size_t end = tmpl.find('}', i);
      KVLAB_CHECK(end != std::string::npos, "{}: unclosed '{{' in prompt template", where);
      const std::string key = tmpl.substr(i + 1, end - i - 1);
      auto it = record.find(key);
      KVLAB_CHECK(it != record.end(), "{}: prompt template field '{{{}}}' missing from the record", where, key);
      KVLAB_CHECK(it->is_string(), "{}: field '{}' must be a string, found {}", where, key, it->type_name());
      out += it->get_ref<const std::string&>();
      i = end;
    } else {
      KVLAB_CHECK(c != '}', "{}: single '}}' in prompt template", where);
      out += c;
    }
  }
  return out;
}

bool longbench_skips_chat_template(const std::string& d) {
  return d == "trec" || d == "triviaqa" || d == "samsum" || d == "lsht" || d == "lcc" || d == "repobench-p";
}

std::vector<int64_t> truncate_middle(const std::vector<int64_t>& ids, int64_t max_tokens) {
  KVLAB_CHECK(max_tokens > 0, "--max-tokens must be positive, got {}", max_tokens);
  if (static_cast<int64_t>(ids.size()) <= max_tokens) return ids;
  const auto half = static_cast<size_t>(max_tokens / 2);
  std::vector<int64_t> out(ids.begin(), ids.begin() + half);
  out.insert(out.end(), ids.end() - half, ids.end());
  return out;
}

namespace {

std::string string_field(const json& r, const char* key, const std::string& where) {
  auto it = r.find(key);
  KVLAB_CHECK(it != r.end(), "{}: missing field '{}'", where, key);
  if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
  KVLAB_CHECK(it->is_string(), "{}: field '{}' must be a string, found {}", where, key, it->type_name());
  return it->get<std::string>();
}

std::string keys_of(const json& r) {
  std::string keys;
  for (auto it = r.begin(); it != r.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  return keys;
}

json load_longbench_prompts(const std::string& data_path, const DatasetOptions& opts) {
  const std::string path = !opts.longbench_prompts.empty()
                               ? opts.longbench_prompts
                               : (fs::path(data_path).parent_path() / "config" / "dataset2prompt.json").string();
  std::ifstream in(path);
  KVLAB_CHECK(in.good(),
              "LongBench prompt templates '{}' not found (needed for {}); pass the path of "
              "LongBench's config/dataset2prompt.json",
              path, data_path);
  json j = json::parse(in, nullptr, false);
  KVLAB_CHECK(j.is_object(), "{}: not a JSON object of dataset -> template", path);
  return j;
}

}  // namespace

Dataset read_dataset(const std::string& spec, const DatasetOptions& opts) {
  Dataset ds;
  ds.path = spec;
  std::ifstream in(spec, std::ios::binary);
  KVLAB_CHECK(fs::is_regular_file(spec) && in.good(), "--dataset '{}': no such file (expected a JSONL file)", spec);
  const std::string stem = fs::path(spec).stem().string();
  json prompts;  // LongBench templates, loaded on first use
  std::string line;
  int64_t line_no = 0;
  bool first = true;
  while (std::getline(in, line)) {
    ++line_no;
    if (opts.max_samples >= 0 && static_cast<int64_t>(ds.records.size()) >= opts.max_samples) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", spec, line_no);
    json r = json::parse(line, nullptr, false);
    KVLAB_CHECK(!r.is_discarded(), "{}: not valid JSON", where);
    KVLAB_CHECK(r.is_object(), "{}: a record must be a JSON object, found {}", where, r.type_name());
    if (first) {
      ds.schema = opts.schema ? *opts.schema : detect_schema(r, where);
      first = false;
    }
    PromptRecord rec;
    rec.line = line_no;
    rec.id = fmt::format("line {}", line_no);
    rec.dataset = stem;
    switch (ds.schema) {
      case DatasetSchema::LongBench: {
        for (const char* k : {"context", "input", "answers"})
          KVLAB_CHECK(r.contains(k), "{}: a LongBench record needs '{}' (keys found: {})", where, k,
                      keys_of(r));
        if (prompts.is_null()) prompts = load_longbench_prompts(spec, opts);
        rec.dataset = !opts.longbench_name.empty() ? opts.longbench_name
                      : (r.contains("dataset") && r["dataset"].is_string()) ? r["dataset"].get<std::string>()
                                                                            : stem;
        auto t = prompts.find(rec.dataset);
        KVLAB_CHECK(t != prompts.end() && t->is_string(),
                    "{}: LongBench dataset '{}' has no template in dataset2prompt.json", where, rec.dataset);
        rec.prompt = format_prompt_template(t->get<std::string>(), r, where);
        {
          const std::string tmpl = t->get<std::string>();
          const size_t at = tmpl.find("{context}");
          if (at != std::string::npos) rec.question = format_prompt_template(tmpl.substr(at + 9), r, where);
        }
        const json& answers = r["answers"];
        KVLAB_CHECK(answers.is_array(), "{}: 'answers' must be an array", where);
        for (const auto& a : answers) {
          KVLAB_CHECK(a.is_string(), "{}: 'answers' must hold strings", where);
          rec.answers.push_back(a.get<std::string>());
        }
        if (r.contains("_id")) rec.id = string_field(r, "_id", where);
        rec.use_chat_template = !longbench_skips_chat_template(rec.dataset);
        for (const char* k : {"length", "language", "all_classes"})
          if (r.contains(k)) rec.extra[k] = r[k];
        break;
      }
      case DatasetSchema::LongEval:
        rec.dataset = "longeval";
        rec.prompt = string_field(r, "prompt", where);
        if (size_t q = rec.prompt.rfind("\n\n"); q != std::string::npos) rec.question = rec.prompt.substr(q);
        rec.answers.push_back(string_field(r, "expected_number", where));
        for (const char* k : {"num_lines", "token_size", "correct_line", "random_idx"})
          if (r.contains(k)) rec.extra[k] = r[k];
        break;
      case DatasetSchema::Xsum:
        rec.dataset = "xsum";
        rec.prompt = string_field(r, "article", where);
        if (size_t q = rec.prompt.rfind("\n\n"); q != std::string::npos) rec.question = rec.prompt.substr(q);
        if (r.contains("summary_gt")) rec.answers.push_back(string_field(r, "summary_gt", where));
        for (const char* k : {"max_tokens", "stop"})
          if (r.contains(k)) rec.extra[k] = r[k];
        break;
      case DatasetSchema::MtBench: {
        rec.dataset = "mt_bench";
        const json& turns = r["turns"];
        KVLAB_CHECK(turns.is_array() && !turns.empty() && turns[0].is_string(),
                    "{}: 'turns' must be a non-empty array of strings", where);
        rec.prompt = turns[0].get<std::string>();  // the first turn: one prompt, one answer to generate
        rec.id = r["question_id"].is_string() ? r["question_id"].get<std::string>() : r["question_id"].dump();
        if (r.contains("category")) rec.extra["category"] = r["category"];
        break;
      }
      case DatasetSchema::GenericPrompt:
      case DatasetSchema::GenericText:
        rec.prompt = string_field(r, ds.schema == DatasetSchema::GenericPrompt ? "prompt" : "text", where);
        for (const char* k : {"id", "_id"})
          if (r.contains(k)) rec.id = string_field(r, k, where);
        break;
    }
    ds.records.push_back(std::move(rec));
  }
  KVLAB_CHECK(!ds.records.empty(), "--dataset '{}': no records", spec);
  return ds;
}

}  // namespace kvlab
