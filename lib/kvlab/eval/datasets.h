// Prompt sources for `kvlab dump`, `longbench` and `longeval`: JSONL files whose schema is
// detected from the first record's keys.
//   longbench  input, context, answers, length, dataset, language, all_classes, _id
//              -> the official LongBench template (dataset2prompt.json) with {context}, {input}
//   longeval   prompt, expected_number (LongChat line retrieval)
//   xsum       article (already the full prompt, as H2O/CaM use it), summary_gt
//   generic    prompt or text
// Errors name the file and the 1-based line number.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvlab {

// MtBench: FastChat's question.jsonl (question_id, category, turns); the prompt is the first turn.
enum class DatasetSchema { LongBench, LongEval, Xsum, MtBench, GenericPrompt, GenericText };
std::string schema_name(DatasetSchema s);  // "longbench", "longeval", "xsum", "mt_bench", "generic"

struct PromptRecord {
  std::string id;                    // _id / "line N"
  std::string dataset;               // LongBench name, "longeval", "xsum", or the file stem
  std::string prompt;                // the text to tokenize (before any chat template)
  // The tail of `prompt` that is the question (LongBench: the template's text after {context};
  // LongEval, XSUM: the last paragraph); "" = not known. --protocol context splits there.
  std::string question;
  std::vector<std::string> answers;  // references: LongBench answers, expected_number, summary_gt
  bool use_chat_template = true;     // false for LongBench's few-shot/code sets (trec, lcc, ...)
  int64_t line = 0;                  // 1-based line in the file
  nlohmann::json extra;              // other fields kept for reports (length, all_classes, ...)
};

struct DatasetOptions {
  int64_t max_samples = -1;      // --samples; -1 = all
  // dataset2prompt.json; "" = <dir of the JSONL>/config/dataset2prompt.json (LongBench's layout).
  std::string longbench_prompts;
  // Overrides the LongBench dataset name (else the record's `dataset` field, else the file stem).
  std::string longbench_name;
  // The schema every record must have (a command that reads one kind); unset = detected from the
  // first record's keys.
  std::optional<DatasetSchema> schema;
};

struct Dataset {
  std::string path;
  DatasetSchema schema = DatasetSchema::GenericPrompt;
  std::vector<PromptRecord> records;
};

// --dataset SPEC: SPEC is the path of a JSONL file.
Dataset read_dataset(const std::string& spec, const DatasetOptions& opts = {});

// Schema from a record's keys; throws listing the keys found and the schemas known.
DatasetSchema detect_schema(const nlohmann::json& record, const std::string& where);

// Python str.format over the record's string fields ({context}, {input}; "{{" / "}}" escape).
std::string format_prompt_template(const std::string& tmpl, const nlohmann::json& record,
                                   const std::string& where);

// LongBench datasets that are run without the chat template (pred.py: few-shot and code sets).
bool longbench_skips_chat_template(const std::string& dataset);

// LongBench's rule for over-long prompts: keep the first and the last max_tokens/2 ids.
std::vector<int64_t> truncate_middle(const std::vector<int64_t>& ids, int64_t max_tokens);

}  // namespace kvlab
