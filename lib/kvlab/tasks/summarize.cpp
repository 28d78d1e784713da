#include "kvlab/tasks/summarize.h"

#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/rouge_google.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/tasks/prompt_split.h"

namespace kvlab {

using nlohmann::json;

TaskRecord summarize_task_record(const PromptRecord& rec, const ModelSource& src, const Tokenizer& tok,
                                 const std::string& chat_template, int64_t max_new_tokens,
                                 const std::string& dataset) {
  const std::string where = fmt::format("{} line {}", dataset, rec.line);
  KVLAB_CHECK(!rec.answers.empty(), "{}: no 'summary_gt' to score against", where);
  TaskRecord r;
  r.id = rec.id;
  const std::string text = apply_model_chat_template(chat_template, src, tok, rec.prompt);
  const size_t q = rec.question.empty() ? std::string::npos : rec.prompt.size() - rec.question.size();
  SplitPrompt sp = encode_split(tok, text, offset_in(text, rec.prompt, q));
  r.prompt = std::move(sp.ids);
  r.context_len = sp.context_len;
  r.max_new_tokens = max_new_tokens;
  if (r.max_new_tokens <= 0) {
    r.max_new_tokens = 64;
    if (rec.extra.contains("max_tokens")) {
      KVLAB_CHECK(rec.extra["max_tokens"].is_number_integer() && rec.extra["max_tokens"].get<int64_t>() > 0,
                  "{}: 'max_tokens' must be a positive integer", where);
      r.max_new_tokens = rec.extra["max_tokens"].get<int64_t>();
    }
  }
  if (rec.extra.contains("stop")) {
    const json& stop = rec.extra["stop"];
    KVLAB_CHECK(stop.is_array() || stop.is_string(), "{}: 'stop' must be a string or a list of strings", where);
    if (stop.is_string()) r.stop.push_back(stop.get<std::string>());
    for (const auto& s : stop.is_array() ? stop : json::array()) {
      KVLAB_CHECK(s.is_string(), "{}: 'stop' must hold strings", where);
      r.stop.push_back(s.get<std::string>());
    }
  }
  r.gold = {{"summary_gt", rec.answers.front()}};
  return r;
}

std::string summarize_dataset_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0) name.resize(name.size() - 6);
  static const std::regex shot("_[0-9]+shot$");
  name = std::regex_replace(name, shot, "");
  return name.empty() ? std::string("summaries") : name;
}

TaskSpec summarize_task(bool use_stemmer, const std::string& dataset) {
  TaskSpec t;
  t.dataset = dataset;
  t.score = [use_stemmer](const std::string& output, const json& gold) {
    const auto r = eval::google_rouge(gold.at("summary_gt").get<std::string>(), output, use_stemmer);
    return json{{"score", r.rougeL.fmeasure},
                {"rouge1", r.rouge1.fmeasure},
                {"rouge2", r.rouge2.fmeasure},
                {"rougeL", r.rougeL.fmeasure}};
  };
  t.mean_keys = {"rouge1", "rouge2", "rougeL"};
  return t;
}

}  // namespace kvlab
