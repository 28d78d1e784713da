// kvlab ppl --model M --text FILE [--max-tokens N] [--segments K] [--method a,b] [--cache-size 50,100]
//           [--rerotate] [--param k=v] [--seed S] [--out DIR | --results-dir D --name N] [--overwrite]
// Perplexity of a text read token by token through each method's cache of --cache-size entries per
// KV head and layer, streamed from the first token (BUZZ Table 3's protocol), beside the full
// cache's, with each method's fidelity to the full cache on the same text: mean KL(full ‖ method)
// of the next-token distribution and top-1 agreement (generate/ppl.h). --segments K reads K
// consecutive segments of the text, each from an empty cache (BOS + the next max_tokens − 1 tokens),
// so a difference between methods has an interval over segments; result.json is rewritten after
// each segment and the same --out resumes. Prints a table (means over segments) and writes
// result.json (one row per segment, method and cache size).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/config.h"
#include "kvlab/core/check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/generate/ppl.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct PplOptionsCmd : RunFolderOptions {
  PplOptionsCmd() : RunFolderOptions("ppl") {}
  std::string model;
  std::string text;
  int64_t max_tokens = 0;  // 0 = 1024, or the model's context when that is shorter
  int64_t segments = 1;
  bool rerotate = false;
  int64_t compress_every = 0;
  std::string method = "buzz,buzz-logn,h2o,streaming_llm,local";
  std::vector<int64_t> cache_size = {50, 100};
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  int64_t seed = 42;
  std::string dtype = "fp32";
  std::string weights = "fp32";
  std::string device = "cpu";
  bool quiet = false;
  bool no_batch = false;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)").required();
    f.add("text", text, "a raw text file, e.g. ../shared/data/wikitext2/wiki.test.raw").required();
    f.add("max_tokens", max_tokens, "read the first N tokens of the text (BOS included); 0 = 1024 or the model's "
                                    "context when shorter");
    f.add("segments", segments, "read K consecutive segments of --max-tokens tokens each (BOS + the text's next "
                                "tokens), each from an empty cache: an interval over segments");
    f.add("rerotate", rerotate, "re-rotate each method's held keys to contiguous positions after every token "
                                "(StreamingLLM's and BUZZ's code); default: keys keep their cached positions");
    f.add("compress_every", compress_every, "every method compresses what it holds every N tokens to --cache-size "
          "(kvpress's DecodingPress; then any method that keeps tokens, and each holds --cache-size to --cache-size "
          "+ N entries) instead of streaming by its own rule; 0 = off");
    f.add("method", method, "comma-separated streaming methods (exact = the full cache token by token); with "
          "--compress-every any method that keeps tokens");
    f.add("cache_size", cache_size, "entries per KV head and layer each method may hold, e.g. 50,100");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("params", params, "config only: {\"method\": {\"key\": value}}");
    f.add("seed", seed, "seed of random methods");
    f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16 | fp64");
    f.add("weights", weights, "a GGUF's matrices: stored = used as the file stores them (CPU, fp32; issue 51), fp32 = dequantized at load").one_of({"fp32", "stored"});
    f.add("device", device, "cpu | cuda | cuda:N");
    run_folder_fields(f, /*resumes=*/true);
    f.add("quiet", quiet, "no progress output");
    f.add("no_batch", no_batch, "feed each token to the branches one after another instead of in one batch (the same "
          "rows up to float rounding)");
  }
  void check() const {
    KVLAB_CHECK(max_tokens == 0 || max_tokens >= 2, "--max-tokens must be >= 2 (or 0 = fit the model), got {}",
                max_tokens);
    KVLAB_CHECK(!cache_size.empty(), "--cache-size: give at least one size");
    KVLAB_CHECK(segments >= 1, "--segments must be >= 1, got {}", segments);
    KVLAB_CHECK(compress_every >= 0, "--compress-every must be >= 0 (0 = off), got {}", compress_every);
    KVLAB_CHECK(seed >= 0, "--seed must be >= 0, got {}", seed);
    require_run_keeps(build_methods(method, param, params, "default", "", /*need_files=*/false),
                      "the command's own exact-token flags");
    parse_compute_dtype(dtype, "--dtype");
    parse_device(device, "--device");
  }
};

nlohmann::json row_json(const PplRow& r) {
  return {{"method", r.method},       {"cache_size", r.cache_size}, {"rerotate", r.rerotate},
          {"compress_every", r.compress_every}, {"n_predicted", r.n_predicted},
          {"nll", r.nll},             {"ppl", r.ppl},               {"kl_full", r.kl},
          {"top1_agree", r.top1},     {"kv_bytes_peak", r.kv_bytes_peak}, {"seconds", r.seconds}};
}

void run_ppl_cmd(const PplOptionsCmd& o, const nlohmann::json& effective) {
  auto methods = build_methods(o.method, o.param, o.params);
  const std::string text = read_text_file(o.text, "--text");
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.stored_weights = parse_weights_flag(o.weights, "--weights");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  Model model = load_model(src, lo);
  Tokenizer tok = load_model_tokenizer(src);
  std::vector<int64_t> ids = tok.encode(text, /*add_bos=*/true);
  const int64_t context = model.config.max_position_embeddings;
  // The default fits the model: a 512-position model read 1024 tokens and failed (issue 26).
  const int64_t max_tokens = o.max_tokens > 0 ? o.max_tokens : (context > 0 ? std::min<int64_t>(1024, context) : 1024);
  KVLAB_CHECK(context <= 0 || max_tokens <= context, "--max-tokens {} exceeds {}'s context of {} positions",
              max_tokens, model.id, context);
  KVLAB_CHECK(ids.size() >= 2, "--text {}: {} tokens; at least 2 are needed", o.text, ids.size());
  // Segment i: the first token (BOS when the tokenizer adds one) + the text's next max_tokens − 1
  // tokens from 1 + i·(max_tokens − 1); segment 0 is the first max_tokens tokens, as with one segment.
  const bool bos = tok.encode("", /*add_bos=*/true).size() == 1;
  const int64_t lead = bos ? 1 : 0, step = max_tokens - lead, body = int64_t(ids.size()) - lead;
  KVLAB_CHECK(o.segments == 1 || o.segments * step <= body,
              "--segments {} of --max-tokens {}: --text {} has {} tokens, enough for {} segment(s)", o.segments,
              max_tokens, o.text, ids.size(), body / step);
  auto segment = [&](int64_t i) {
    std::vector<int64_t> seg(ids.begin(), ids.begin() + lead);
    const int64_t b = lead + i * step, e = std::min<int64_t>(int64_t(ids.size()), b + step);
    seg.insert(seg.end(), ids.begin() + b, ids.begin() + e);
    return seg;
  };

  std::vector<PplBranch> branches;
  for (const auto& m : methods)
    for (int64_t c : o.cache_size) branches.push_back({m, c, static_cast<uint64_t>(o.seed), o.rerotate, o.compress_every});
  check_ppl_branches(model, branches);
  RunDir run = o.open_run(effective);
  auto context_json = context_block(o.device, static_cast<uint64_t>(o.seed), effective);
  context_json["model_id"] = model.id;
  context_json["text"] = o.text;

  // The rows of the segments an interrupted run of the same config finished (open_run refuses a
  // folder of another config).
  nlohmann::json rows = nlohmann::json::array();
  std::set<int64_t> done_segments;
  if (std::filesystem::exists(run.file("result.json")))
    for (const auto& r : read_result_rows(run.file("result.json"))) {
      rows.push_back(r);
      done_segments.insert(r.value("segment", int64_t(0)));
    }
  const int64_t todo = o.segments - int64_t(done_segments.size());
  fmt::print(stderr, "[ppl] {} segment(s) of {} tokens of {} ({} done before), {} branches (each token by token) + "
             "the full cache -> {}\n", o.segments, max_tokens, o.text, done_segments.size(), branches.size(),
             run.path());
  Progress progress("ppl", todo * (max_tokens - 1), !o.quiet);
  for (int64_t i = 0; i < o.segments; ++i) {
    if (done_segments.count(i)) continue;
    int64_t done = 0;
    PplOptions po;
    po.batch = !o.no_batch;
    po.progress = [&](int64_t pos, int64_t) {
      progress.advance(pos - done);
      done = pos;
    };
    PplResult res = run_ppl(model, segment(i), branches, po);
    auto full = row_json(res.full);
    full["segment"] = i, full["n_tokens"] = res.n_tokens;
    rows.push_back(full);
    for (size_t b = 0; b < res.rows.size(); ++b) {
      auto j = row_json(res.rows[b]);
      j["segment"] = i, j["n_tokens"] = res.n_tokens;
      j["params"] = branches[b].method.compressor->params();
      rows.push_back(j);
    }
    done_segments.insert(i);
    const bool complete = int64_t(done_segments.size()) == o.segments;
    run.write_result(context_json, rows, {{"n_tokens", res.n_tokens}, {"segments", o.segments}, {"complete", complete}});
  }
  progress.finish();

  // The table: means over segments per (method, cache size); ppl = exp(mean nll).
  nlohmann::json table = nlohmann::json::array();
  std::vector<std::pair<std::string, int64_t>> order;
  std::map<std::pair<std::string, int64_t>, std::vector<const nlohmann::json*>> groups;
  for (const auto& r : rows) {
    const bool full = r["method"] == "full";
    auto key = std::make_pair(r["method"].get<std::string>(), full ? int64_t(0) : r["cache_size"].get<int64_t>());
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&r);
  }
  for (const auto& key : order) {
    const auto& g = groups[key];
    double nll = 0, kl = 0, top1 = 0, secs = 0;
    for (const auto* r : g) {
      nll += (*r)["nll"].get<double>(), kl += (*r)["kl_full"].get<double>();
      top1 += (*r)["top1_agree"].get<double>(), secs += (*r)["seconds"].get<double>();
    }
    const double k = double(g.size());
    table.push_back({{"method", key.first}, {"cache_size", (*g[0])["cache_size"]}, {"segments", g.size()},
                     {"ppl", std::exp(nll / k)}, {"kl_full", kl / k}, {"top1_agree", top1 / k},
                     {"kv_bytes_peak", (*g[0])["kv_bytes_peak"]}, {"seconds", secs}});
  }
  std::cout << render_table(table, {"method", "cache_size", "segments", "ppl", "kl_full", "top1_agree",
                                    "kv_bytes_peak", "seconds"});
  fmt::print(stderr, "[ppl] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_ppl(CLI::App& app) {
  add_command<PplOptionsCmd>(app, "ppl",
                             "Perplexity through streamed caches of N entries, with KL and top-1 agreement to the full cache",
                             run_ppl_cmd);
}

}  // namespace kvlab::cli
