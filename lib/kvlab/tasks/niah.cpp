#include "kvlab/tasks/niah.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvlab/core/check.h"
#include "kvlab/eval/metrics/rouge_google.h"
#include "kvlab/tokenizer/tokenizer.h"

namespace kvlab {

namespace fs = std::filesystem;

std::string read_haystack(const std::string& dir) {
  KVLAB_CHECK(fs::is_directory(dir), "--haystack-dir {}: not a folder (expected the Paul Graham essays, "
              "*.txt)", dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  KVLAB_CHECK(!files.empty(), "--haystack-dir {}: holds no .txt file", dir);
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    KVLAB_CHECK(in.good(), "{}: cannot be read", f.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  return text;
}

NiahCase make_niah_case(const Tokenizer& tok, const std::string& haystack, const NiahSpec& spec,
                        int64_t context_length, double depth) {
  KVLAB_CHECK(depth >= 0 && depth <= 100, "--depths: {} is not a percent in [0, 100]", depth);
  const std::vector<int64_t> needle = tok.encode(spec.needle, /*add_bos=*/false);
  const int64_t room = context_length - spec.buffer;  // the original's context_length − buffer
  KVLAB_CHECK(room > int64_t(needle.size()), "--lengths: {} tokens leave no room for the haystack (the "
              "needle takes {} and {} are kept for the question)", context_length, needle.size(), spec.buffer);
  // The haystack repeated until it is long enough, then cut (encode_and_trim).
  std::vector<int64_t> hay = tok.encode(haystack, /*add_bos=*/false);
  KVLAB_CHECK(!hay.empty(), "the haystack encodes to no tokens");
  std::vector<int64_t> ctx;
  while (int64_t(ctx.size()) < room) ctx.insert(ctx.end(), hay.begin(), hay.end());
  ctx.resize(room - needle.size());
  // Insertion point: depth percent of the way in, moved back to just after a "." token.
  int64_t at = depth >= 100 ? int64_t(ctx.size()) : int64_t(ctx.size() * (depth / 100.0));
  if (depth < 100) {
    const std::vector<int64_t> period = tok.encode(".", /*add_bos=*/false);
    auto is_period = [&](int64_t id) { return std::find(period.begin(), period.end(), id) != period.end(); };
    while (at > 0 && !is_period(ctx[at - 1])) --at;
  }
  std::vector<int64_t> with(ctx.begin(), ctx.begin() + at);
  with.insert(with.end(), needle.begin(), needle.end());
  with.insert(with.end(), ctx.begin() + at, ctx.end());
  NiahCase c;
  c.id = fmt::format("len{}_depth{:g}", context_length, depth);
  c.context_length = context_length;
  c.depth = depth;
  c.context = tok.decode(with);
  c.needle_token = at;
  c.context_tokens = int64_t(with.size());
  return c;
}

nlohmann::json niah_score(const std::string& output, const nlohmann::json& gold) {
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string key = gold.at("key_phrase").get<std::string>();
  const bool found = lower(output).find(lower(key)) != std::string::npos;
  const auto r = eval::google_rouge(gold.at("needle").get<std::string>(), output, /*use_stemmer=*/false);
  return {{"score", found ? 1.0 : 0.0}, {"rouge1_recall", r.rouge1.recall}};
}

}  // namespace kvlab
