// kvlab replay: replays captured q/k/v through compressors and measures single-layer error
// against exact attention (docs/methods.md §2, §4). Rows go to result.json as they are produced.
//
// Resume: after each (sample, layer) unit, result.json is rewritten with every row so far and
// "complete": false. A run into the same --out with the same config (as RunDir checks) picks up
// those rows and skips their units, so an interrupted run, restarted, gives the rows of an
// uninterrupted one (timing fields aside). --overwrite starts from scratch.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>

#include "command.h"
#include "commands.h"
#include "kvlab/core/aggregate.h"
#include "kvlab/core/check.h"
#include "kvlab/core/device.h"
#include "kvlab/core/write_check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/text.h"
#include "kvlab/io/capture.h"
#include "kvlab/replay/plan.h"
#include "kvlab/replay/replay.h"
#include "kvlab/replay/tables.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct ReplayOptions : RunFolderOptions {
  ReplayOptions() : RunFolderOptions("replay") {}
  std::string capture;
  std::string method = "exact";
  std::vector<double> ratio;
  std::vector<int64_t> budget;
  std::vector<int64_t> T;
  std::vector<double> bytes;
  int64_t keep_first = 0;
  int64_t keep_last = 0;
  std::string eval_queries = "last:256";
  int64_t obs_queries = 256;
  bool rerotate = false;
  bool skip_nonfinite = false;
  std::string layers = "all";
  std::string heads = "all";
  std::string samples = "all";
  int64_t seeds = 1;
  std::vector<int64_t> seed_list;
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  std::string shard = "0/1";
  std::string device = "cpu";
  bool list_methods = false;
  bool quiet = false;
  std::string rows_out = "inline";
  bool kept_out = false;

  void fields(FieldList& f) {
    f.add("capture", capture, "capture file (.h5) from 'kvlab dump' or 'kvlab synth'");
    f.add("method", method, "comma-separated method names, or 'all' (see --list-methods)");
    f.add("ratio", ratio, "fractions of the compressible region kept, e.g. 0.1,0.2");
    f.add("budget", budget, "absolute entries kept per KV head for the region (instead of --ratio)");
    f.add("T", T, "halvings for halving methods, e.g. 1,2,3,4 (instead of --ratio)");
    f.add("bytes", bytes, "fractions of the full-precision K and V bytes of the whole layer (exact parts included) "
          "each method may hold, e.g. 0.25; a quantized method keeps as many more entries as its bits allow");
    f.add("keep_first", keep_first, "first tokens kept exact (sinks)");
    f.add("keep_last", keep_last, "last tokens kept exact (the evaluation queries' tail is always exact)");
    f.add("eval_queries", eval_queries, "captured queries the metrics judge: last:N (the last N positions) | all");
    f.add("obs_queries", obs_queries, "captured queries just before the evaluation window that methods may score "
                                      "keys with (never the judged ones); 0 = none");
    f.add("rerotate", rerotate, "re-rotate kept keys to their in-cache positions (StreamingLLM/BUZZ code; "
                                "selection methods only)");
    f.add("layers", layers, "layers: all (captured) | 0,1,4 | 0-3");
    f.add("heads", heads, "KV heads: all | 0,2");
    f.add("samples", samples, "samples: all | 0,1");
    f.add("seeds", seeds, "number of seeds, taken from docs/methods.md §4's list (42, 7, 8, 17, ...)");
    f.add("seed_list", seed_list, "explicit seeds (instead of --seeds)");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("params", params, "config only: {\"method\": {\"key\": value}}");
    run_folder_fields(f);
    f.add("shard", shard, "run shard i of N (i/N) of the (sample, layer) units; merge with 'kvlab merge'");
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("list_methods", list_methods, "list the methods with one-line descriptions and exit");
    f.add("quiet", quiet, "no progress output");
    f.add("skip_nonfinite", skip_nonfinite, "skip (sample, layer) units whose q/k/v hold NaN/Inf and list them in "
                                            "result.json (default: such a unit is an error)");
    f.add("kept_out", kept_out, "write what every (sample, layer, method, setting, seed) kept to <run>/kept.jsonl: "
                                "per KV head the positions held and each entry's weight (-1 = a merged entry)");
    f.add("rows_out", rows_out, "per-head rows: inline in result.json, or jsonl = rows.jsonl beside a result.json "
                                "holding context + aggregate + \"rows_file\" (for big runs)")
        .one_of({"inline", "jsonl"});
  }
  void check() const {
    if (list_methods) return;
    KVLAB_CHECK(!capture.empty(), "--capture is required (a .h5 file from 'kvlab dump' or 'kvlab synth')");
    budget_settings(ratio, budget, T, bytes);
    require_run_keeps(without_question(without_model_weights(build_methods(method, param, params, "default", "",
                                                                           /*need_files=*/false),
                                                             method, "replay"),
                                       method, "replay"),
                      "--keep-first / --keep-last");
    KVLAB_CHECK(seed_list.empty() || seeds == 1, "give --seeds or --seed-list, not both (--seeds {}, --seed-list "
                "of {})", seeds, seed_list.size());
    seed_values(seeds, seed_list);
    parse_shard(shard);
    parse_device(device, "--device");
    KVLAB_CHECK(keep_first >= 0, "--keep-first must be >= 0, got {}", keep_first);
    KVLAB_CHECK(keep_last >= 0, "--keep-last must be >= 0, got {}", keep_last);
    check_queries_spec(eval_queries, "--eval-queries");
    KVLAB_CHECK(obs_queries >= 0, "--obs-queries must be >= 0, got {}", obs_queries);
  }
};

void run_replay(const ReplayOptions& o, const nlohmann::json& effective) {
  if (o.list_methods) {
    // When a method compresses during generation: every decode step (streaming), or once after
    // prefill with decoded tokens appended exactly (prefill).
    for (const auto& info : compressor_infos()) {
      fmt::print("{:<16} {:<9} {}{}\n", info.name, info.streaming ? "streaming" : "prefill", info.description,
                 info.reads(inputs::out_proj)              ? " [not in replay: needs the model's W_o]"
                 : info.reads(inputs::reconstruction_scores) ? " [not in replay: needs a second prefill through the model]"
                 : info.calibration                          ? " [needs a calibration file (see --preset paper); "
                                                               "--method all leaves it out unless one is given]"
                 : info.reads(inputs::question_start)        ? " [in replay only with --param " + info.name +
                                                               ".window=N (no question is prefilled); --method all "
                                                               "leaves it out]"
                                                             : std::string());
      const MethodPreset p = info.paper();
      std::string keep = p.keep_first || p.keep_last
                             ? fmt::format(" + exact {} first / {} last", p.keep_first, p.keep_last) : "";
      fmt::print("{:<16} {:<9} --preset paper: {}{} ({})\n", "", "", p.params.dump(), keep, p.source);
    }
    // Quantizers (issue 52): alone (the full cache quantized) or after a method, "snapkv+kivi2".
    fmt::print("\nquantizers: give one alone (the full cache stored quantized) or after a method with '+', e.g. "
               "snapkv+kivi2; '.r<R>' / '.g<G>' change the window / group (kivi2.r64)\n");
    for (const auto& q : quantizer_list()) fmt::print("{:<16} {:<9} {}\n", q.name, "quantizer", q.description);
    return;
  }
  auto settings = budget_settings(o.ratio, o.budget, o.T, o.bytes);
  auto methods = without_question(without_model_weights(build_methods(o.method, o.param, o.params), o.method, "replay"),
                                  o.method, "replay");
  methods = without_channel_pruning(std::move(methods), o.method, {{!o.bytes.empty(), "--bytes"}, {o.rerotate, "--rerotate"}});
  auto seeds = seed_values(o.seeds, o.seed_list);
  auto [shard_i, shard_n] = parse_shard(o.shard);

  CaptureReader cap(o.capture);
  const auto& meta = cap.meta();
  ReplayProtocol proto;
  proto.keep_first = o.keep_first;
  proto.keep_last = o.keep_last;
  proto.eval_queries = o.eval_queries;
  proto.obs_queries = o.obs_queries;
  proto.rerotate = o.rerotate;
  proto.device = o.device;
  if (o.heads != "all") proto.kv_heads = parse_index_list(o.heads, meta.n_kv_heads, "--heads");
  auto layers = select_layers(meta, o.layers);
  auto samples = o.samples == "all" ? parse_index_list("all", int(cap.n_samples()), "--samples")
                                    : parse_index_list(o.samples, int(cap.n_samples()), "--samples");

  // Both query windows must fit in every selected sample, and something must be left to compress:
  // checked before anything is written.
  for (int s : samples) {
    const auto w = split_queries(cap.sample(s).n_q, proto, fmt::format("{}: sample {}", o.capture, s));
    const int64_t n = cap.sample(s).n_tokens, tail = std::max(o.keep_last, w.n_eval);
    KVLAB_CHECK(n - tail - o.keep_first >= 1, "--keep-first {} and --keep-last {} (the tail holds the {} evaluation "
                "queries) leave nothing to compress in sample {} of {} tokens", o.keep_first, o.keep_last, w.n_eval,
                s, n);
  }

  std::vector<std::pair<int64_t, int>> units;
  for (int s : samples)
    for (int l : layers) units.emplace_back(s, l);
  std::vector<std::pair<int64_t, int>> mine;
  for (size_t i = 0; i < units.size(); ++i)
    if (static_cast<int>(i % shard_n) == shard_i) mine.push_back(units[i]);

  KVLAB_CHECK(!mine.empty(), "--shard {}: this shard has no units ({} (sample, layer) units in all); use at most {} "
              "shards", o.shard, units.size(), units.size());
  // An unfinished run of this config in --out: its checkpoint, read before RunDir rewrites config.json.
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json skipped = nlohmann::json::array();  // units with NaN/Inf (--skip-nonfinite)
  std::set<std::pair<int64_t, int>> done;            // (sample, layer) units already measured
  const std::string checkpoint = o.out + "/result.json";
  const bool resumable = !o.out.empty() && !o.overwrite && std::filesystem::exists(checkpoint);
  RunDir run = o.open_run(effective);
  if (resumable) {
    const nlohmann::json prev = read_json_file(checkpoint);
    if (!prev.value("complete", true)) {
      try {
        rows = read_result_rows(prev, checkpoint);  // prev: the checkpoint, already read
      } catch (const Error& e) {
        KVLAB_FAIL("{}; remove --out {} or pass --overwrite to start again", e.what(), o.out);
      }
      if (prev.contains("skipped_nonfinite")) skipped = prev["skipped_nonfinite"].value("units", skipped);
      for (const auto& r : rows) done.emplace(r.at("sample").get<int64_t>(), r.at("layer").get<int>());
      for (const auto& u : skipped) done.emplace(u.at("sample").get<int64_t>(), u.at("layer").get<int>());
      size_t n_done = 0;
      for (const auto& u : mine) n_done += done.count(u);
      KVLAB_CHECK(n_done == done.size(), "{}: its rows come from units this run does not have; remove --out {} or "
                  "pass --overwrite to start again", checkpoint, o.out);
      fmt::print(stderr, "[replay] resuming {}: {} of {} units already measured ({} rows, \"complete\": false)\n",
                 o.out, n_done, mine.size(), rows.size());
    }
  }
  if (o.kept_out) {
    // Lines of units measured before an interruption stay; a unit cut off before its rows were
    // saved runs again, so its lines go (and a fresh run starts an empty file).
    std::string keep;
    for (const auto& j : read_json_lines(run.file("kept.jsonl")))
      if (done.count({j.at("sample").get<int64_t>(), j.at("layer").get<int>()})) keep += j.dump() + "\n";
    write_text_atomic(run.file("kept.jsonl"), keep);
  }
  auto context = context_block(o.device, seeds.front(), effective);
  context["capture"] = {{"file", o.capture}, {"model_id", meta.model_id}, {"source_dataset", meta.source_dataset},
                        {"git_sha", meta.git_sha}};
  context["shard"] = o.shard;
  fmt::print(stderr, "[replay] {} units (sample x layer) in shard {}, {} methods x {} settings x {} seeds -> {}\n",
             mine.size(), o.shard, methods.size(), settings.size(), seeds.size(), run.path());

  auto write = [&](nlohmann::json extra) {
    if (o.skip_nonfinite) extra["skipped_nonfinite"] = {{"count", skipped.size()}, {"units", skipped}};
    if (o.rows_out == "inline") return run.write_result(context, rows, extra);
    run.write_result_and_rows(context, rows, "rows.jsonl", extra);
  };
  int64_t per_unit = 0;  // method runs a unit: every method at each of its settings, once per seed
  for (const auto& m : methods) per_unit += int64_t(method_budgets(m, settings).size() * seeds.size());
  Progress progress("replay", int64_t(mine.size()) * per_unit, !o.quiet);
  for (const auto& [s, l] : mine) {
    if (done.count({s, l})) {  // measured before the interruption
      progress.skip(per_unit, fmt::format("sample {} layer {} (checkpoint)", s, l));
      continue;
    }
    // Every unit is checked as it is loaded: a NaN or Inf never reaches a method or an aggregate.
    const LayerQKV qkv = cap.read_layer(s, l);
    const NonFinite nf = find_nonfinite(qkv, cap.sample(s).q_start);
    if (nf.count > 0) {
      if (!o.skip_nonfinite) {
        try {
          check_finite(cap, s, l, qkv);
        } catch (const Error& e) {
          KVLAB_FAIL("{}; --skip-nonfinite skips such units and lists them in result.json", e.what());
        }
      }
      skipped.push_back({{"sample", s}, {"sample_id", cap.sample(s).sample_id}, {"layer", l}, {"count", nf.count},
                         {"first", describe_nonfinite(nf)}});
      fmt::print(stderr, "\n[replay] warning: skipped sample {} layer {}: {} non-finite value{} in q/k/v; the first is "
                 "{}\n", s, l, nf.count, nf.count == 1 ? "" : "s", describe_nonfinite(nf));
      progress.advance(per_unit, fmt::format("sample {} layer {} skipped", s, l));
      write({{"complete", false}});
      continue;
    }
    auto unit = load_unit(cap, s, l, proto, qkv);
    std::string kept_lines;
    for (const auto& m : methods)
      for (const Budget& b : method_budgets(m, settings)) {
        const std::string setting = setting_label(m, b);
        for (uint64_t seed : seeds) {
          nlohmann::json kept;
          for (auto& r : replay_rows(unit, cap.sample(s).sample_id, m, b, seed, proto, o.kept_out ? &kept : nullptr)) {
            r["setting"] = setting;
            rows.push_back(std::move(r));
          }
          if (o.kept_out)
            kept_lines += nlohmann::json{{"sample", s}, {"sample_id", cap.sample(s).sample_id}, {"layer", l},
                                         {"method", m.label()}, {"params", m.compressor->params()},
                                         {"setting", setting}, {"seed", seed}, {"kv_heads", kept}}.dump() + "\n";
          progress.advance(1, fmt::format("sample {} layer {} {}", s, l, m.label()));
        }
      }
    if (o.kept_out) {
      std::ofstream kf(run.file("kept.jsonl"), std::ios::app);  // a unit's lines once it is done
      kf << kept_lines;
      check_written(kf, run.file("kept.jsonl"));
    }
    // Keep what is done on disk: a crash or Ctrl-C later loses nothing already measured.
    write({{"complete", false}});
  }
  progress.finish();
  KVLAB_CHECK(!rows.empty(), "--skip-nonfinite: every one of the {} units holds NaN/Inf (listed in {}); nothing to "
              "measure", mine.size(), run.file("result.json"));
  if (!skipped.empty())
    fmt::print(stderr, "[replay] {} of {} units skipped for non-finite q/k/v (listed under skipped_nonfinite in "
               "result.json)\n", skipped.size(), mine.size());
  auto agg = replay_aggregates(rows);
  write({{"complete", true}, {"aggregate", agg}});
  write_replay_tables(run, agg);
  std::cout << render_replay_table(agg["overall"]);
  fmt::print(stderr, "[replay] wrote {}\n", run.file("result.json"));
}

}  // namespace

void setup_replay(CLI::App& app) {
  add_command<ReplayOptions>(app, "replay",
                     "Replay a capture through compressors; single-layer error vs exact attention",
                     run_replay);
}

}  // namespace kvlab::cli
