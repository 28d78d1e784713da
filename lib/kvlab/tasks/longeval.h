// LongEval line retrieval (SubGen / ClusterGen Table 1; LongChat's testcases, docs/methods.md §5):
// a record of lines "line <name>: REGISTER_CONTENT is <N>", the question for one line; the model's
// chat template, greedy decoding, 100 new tokens; the answer is the last integer in the output.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "kvlab/tasks/task_runner.h"

namespace kvlab {

// The last integer (a run of ASCII digits) in `text`, as LongChat's evaluation takes it; none
// when the text holds no digit.
std::optional<int64_t> last_integer(const std::string& text);

// {"score": 1 if last_integer(output) == gold["expected_number"] else 0, "answer": the integer or null}
nlohmann::json longeval_score(const std::string& output, const nlohmann::json& gold);

// The testcases of one LongChat file (jsonl: prompt, expected_number, random_idx, ...), the first
// `samples` (all when < 0), as (id, prompt text, gold). Errors name the file and line.
struct LongEvalCase {
  std::string id;
  std::string prompt;
  nlohmann::json gold;  // {"expected_number": N, "num_lines": L}
};
std::vector<LongEvalCase> read_longeval_cases(const std::string& path, int64_t samples);

}  // namespace kvlab
