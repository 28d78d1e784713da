#include "kvlab/tasks/longeval.h"

#include <fstream>

#include "kvlab/core/check.h"

namespace kvlab {

std::optional<int64_t> last_integer(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && !(text[end - 1] >= '0' && text[end - 1] <= '9')) --end;
  if (end == 0) return std::nullopt;
  size_t begin = end;
  while (begin > 0 && text[begin - 1] >= '0' && text[begin - 1] <= '9') --begin;
  const std::string digits = text.substr(begin, std::min<size_t>(end - begin, 18));  // no overflow
  return std::stoll(digits);
}

nlohmann::json longeval_score(const std::string& output, const nlohmann::json& gold) {
  const auto a = last_integer(output);
  const bool ok = a && gold.contains("expected_number") && *a == gold["expected_number"].get<int64_t>();
  return {{"score", ok ? 1.0 : 0.0}, {"answer", a ? nlohmann::json(*a) : nlohmann::json()}};
}

std::vector<LongEvalCase> read_longeval_cases(const std::string& path, int64_t samples) {
  std::ifstream f(path);
  KVLAB_CHECK(f.good(), "{}: cannot open (a LongChat testcases file, e.g. ../shared/data/longeval/lines/200_lines.jsonl)",
              path);
  std::vector<LongEvalCase> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line) && (samples < 0 || int64_t(out.size()) < samples)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      KVLAB_FAIL("{}: line {} is not JSON ({})", path, n, e.what());
    }
    KVLAB_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string() && j.contains("expected_number") &&
                    j["expected_number"].is_number_integer(),
                "{}: line {} needs a string \"prompt\" and an integer \"expected_number\"", path, n);
    LongEvalCase c;
    c.id = std::to_string(n - 1);
    c.prompt = j["prompt"].get<std::string>();
    c.gold = {{"expected_number", j["expected_number"]}, {"num_lines", j.value("num_lines", 0)}};
    out.push_back(std::move(c));
  }
  KVLAB_CHECK(!out.empty(), "{}: no testcases", path);
  return out;
}

}  // namespace kvlab
