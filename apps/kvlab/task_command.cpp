#include "task_command.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "kvlab/compress/decoding_stream.h"
#include "kvlab/compress/method_spec.h"
#include "kvlab/core/check.h"
#include "kvlab/core/device.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/provenance.h"
#include "kvlab/model/model_tokenizer.h"
#include "kvlab/replay/plan.h"

namespace kvlab::cli {

void TaskCommonOptions::fields(FieldList& f) {
  f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)");
  f.add("method", method, "comma-separated methods; exact (the fidelity reference) is added first if missing");
  f.add("ratio", ratio, "fractions of the prompt kept, e.g. 0.2 (or --budget / --T)");
  f.add("budget", budget, "entries kept per KV head");
  f.add("T", T, "halvings for halving methods");
  f.add("bytes", bytes, "fractions of the full-precision K and V bytes each branch may hold, e.g. 0.25 (equal bytes: a quantized branch keeps as many more entries as its bits allow; instead of --ratio)");
  f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
  f.add("params", params, "config only: {\"method\": {\"key\": value}}");
  f.add("chat_template", chat_template, "none | auto | a template name");
  f.add("preset", preset, "paper (each method as its paper's end-to-end runs, sinks and windows included) | default "
        "(the methods' replay defaults)");
  f.add("protocol", protocol, "whole (the prompt prefilled, then compressed) | context (the context compressed, the "
        "question fed through the compressed cache: kvpress's)");
  f.add("decode_rule", decode_rule, "prefill (every method compresses once; later tokens appended: equal memory) | "
        "stream (streaming methods keep compressing while decoding) | rerotate (as stream, kept keys moved to "
        "contiguous positions after compression and, for streaming methods, after every token) | compress[:N] (every "
        "method compresses what it holds again every N decoded tokens, default 512, to its budget on the tokens seen: "
        "kvpress's decoding presses; equal memory at every step)");
  f.add("ratio_of", ratio_of, "prompt (a --ratio R keeps R x the prompt's tokens) | prompt+answer (R x the prompt's "
        "and the record's new tokens, held from the prefill on: Chelsea's B = R(n + new tokens); --protocol whole)");
  f.add("kept_out", kept_out, "write what every branch kept (positions and weights per layer and KV head) to "
        "<run>/kept/<dataset>/<record>.json");
  f.add("layer_error", layer_error, "measure each branch's single-layer attention error on the question's own "
        "queries (--protocol context): the exact model's queries per layer attend over the branch's compressed context "
        "and are compared with the full cache's output; layer_rel_err (mean over layers) and layer_rel_err_by_layer on "
        "every prediction line");
  f.add("obs_queries", obs_queries, "the last N prompt queries per layer that methods may score keys with");
  f.add("keep_first", keep_first, "prompt positions kept exact before the compressed region, inside the budget "
        "(every method whose preset sets none)");
  f.add("keep_last", keep_last, "prompt positions kept exact after it, inside the budget (likewise)");
  f.add("seed", seed, "seed of random methods");
  f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16");
  f.add("weights", weights, "a GGUF's matrices: stored = used as the file stores them (CPU, fp32; issue 51), fp32 = dequantized at load").one_of({"fp32", "stored"});
  f.add("device", device, "cpu | cuda | cuda:N");
  f.add("shard", shard, "i/N: only records i, i+N, i+2N, ... of each dataset (kvlab merge joins the shards)");
  run_folder_fields(f, /*resumes=*/true);
  f.add("quiet", quiet, "no progress output");
  f.add("no_batch", no_batch, "decode a record's branches one after another instead of in one batch (the same "
        "outputs; for comparison)");
}

TaskPlan plan_task(const TaskCommonOptions& o, bool need_files) {
  KVLAB_CHECK(o.seed >= 0, "--seed must be >= 0, got {}", o.seed);
  TaskPlan plan;
  std::tie(plan.shard_i, plan.shard_n) = parse_shard(o.shard);
  plan.protocol = parse_task_protocol(o.protocol, o.decode_rule, o.ratio_of);
  KVLAB_CHECK(!plan.protocol.ratio_of_answer || (o.budget.empty() && o.T.empty() && o.bytes.empty()),
              "--ratio-of prompt+answer sets what a --ratio is of; it does not apply to {}",
              !o.budget.empty() ? "--budget" : !o.T.empty() ? "--T" : "--bytes");
  KVLAB_CHECK(!o.layer_error || plan.protocol.question == TaskProtocol::Question::context,
              "--layer-error judges each branch on the question's queries, which go through the compressed cache only "
              "under --protocol context (found --protocol {})", o.protocol);
  KVLAB_CHECK(!o.layer_error || plan.protocol.decode != TaskProtocol::Decode::rerotate,
              "--layer-error cannot judge re-rotated keys (--decode-rule rerotate): give --decode-rule prefill or stream");
  KVLAB_CHECK(o.keep_first >= 0 && o.keep_last >= 0, "--keep-first and --keep-last must be >= 0, got {} and {}",
              o.keep_first, o.keep_last);
  std::string names = o.method;
  if (("," + names + ",").find(",exact,") == std::string::npos) names = "exact," + names;
  auto methods = build_methods(names, o.param, o.params, o.preset, o.model, need_files);
  if (plan.protocol.question == TaskProtocol::Question::context)
    methods = without_question(std::move(methods), o.method, "a task command under --protocol context");
  check_quantized_methods(methods, plan.protocol.streams(), "--decode-rule prefill");
  methods = without_channel_pruning(std::move(methods), o.method, {{!o.bytes.empty(), "--bytes"},
                                  {plan.protocol.decode == TaskProtocol::Decode::compress, "--decode-rule compress"},
                                  {plan.protocol.decode == TaskProtocol::Decode::rerotate, "--decode-rule rerotate"}});
  if (plan.protocol.decode == TaskProtocol::Decode::compress)
    for (const auto& m : methods) {
      if (m.name == "exact") continue;  // the full cache (quantized or not) never compresses
      KVLAB_CHECK(!m.quant, "--method {}: under --decode-rule compress a cache compressed while decoding is not "
                  "stored quantized yet (issue 52); give --decode-rule prefill", m.label());
      check_decoding_compressible(m.name, *m.compressor, plan.protocol.every);
    }
  std::vector<const Compressor*> compressors;
  for (const auto& m : methods) compressors.push_back(m.compressor.get());
  check_observation_queries(compressors, o.obs_queries);  // a window above --obs-queries fails before the model loads
  std::vector<Budget> budgets;
  if (methods.size() > 1) budgets = budget_settings(o.ratio, o.budget, o.T, o.bytes);
  std::vector<TaskBranch>& branches = plan.branches;
  for (const auto& m : methods) {
    if (m.full_cache()) {
      branches.insert(branches.begin(), {"exact", m, Budget::of_ratio(1.0)});
      continue;
    }
    if (m.budget_free()) {  // the full cache quantized ("kivi2"), or a method's own threshold: no budget applies
      branches.push_back({task_branch_label(m, Budget::of_ratio(1.0)), m, Budget::of_ratio(1.0)});
      continue;
    }
    for (const auto& b : budgets) branches.push_back({task_branch_label(m, b), m, b});
  }
  return plan;
}

std::unique_ptr<TaskModel> load_task_model(const TaskCommonOptions& o) {
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.stored_weights = parse_weights_flag(o.weights, "--weights");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  Model model = load_model(src, lo);
  Tokenizer tok = load_model_tokenizer(src);
  const int64_t context = model.config.max_position_embeddings;
  return std::make_unique<TaskModel>(TaskModel{src, std::move(model), std::move(tok), context});
}

nlohmann::json earlier_runs(const nlohmann::json& prev, const nlohmann::json& now) {
  nlohmann::json runs = prev.value("earlier_runs", nlohmann::json::array());
  auto same = [](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value("git_sha", "") == b.value("git_sha", "") && a.value("git_dirty", false) == b.value("git_dirty", false);
  };
  if (!prev.value("git_sha", "").empty()) {
    const nlohmann::json entry = {{"git_sha", prev["git_sha"]}, {"git_dirty", prev.value("git_dirty", false)},
                                  {"date", prev.value("date", "")}};
    if (!runs.empty() && same(runs.back(), entry))
      runs.back()["date"] = entry["date"];
    else
      runs.push_back(entry);
  }
  // This very binary is not an earlier one, unless dirty: its sha does not say what code it ran.
  if (!runs.empty() && same(runs.back(), now) && !now.value("git_dirty", false)) runs.erase(runs.size() - 1);
  return runs;
}

TaskRun open_task_run(const TaskCommonOptions& o, const TaskModel& tm, const nlohmann::json& effective,
                      const TaskPlan& plan) {
  const std::vector<TaskBranch>& branches = plan.branches;
  TaskRun tr{o.open_run(effective),
             context_block(o.device, static_cast<uint64_t>(o.seed), effective)};
  // --overwrite replaces another config's results: its branches this run does not have go now
  // (issue 50: they stayed in pred/ and `ruler eval` scored them beside this run's).
  if (o.overwrite && std::filesystem::is_directory(tr.run.file("pred")))
    for (const auto& folder : task_branch_folders(tr.run.file("pred"))) {
      const std::string name = std::filesystem::path(folder).filename().string();
      if (std::none_of(branches.begin(), branches.end(), [&](const TaskBranch& b) { return b.label == name; })) {
        std::filesystem::remove_all(folder);
        fmt::print(stderr, "[kvlab] --overwrite: removed pred/{} (a branch this config does not run)\n", name);
      }
    }
  tr.ctx["model_id"] = tm.model.id;
  tr.ctx["protocol"] = plan.protocol.to_json();
  tr.ctx["preset"] = o.preset;
  // The binaries that wrote this folder's predictions before (a resumed run, or --overwrite, which
  // reuses the lines still valid) stay named: result.json is rewritten with them now, before any
  // line is written, so a run killed before its first dataset finished is named too.
  const std::string prev_file = tr.run.file("result.json");
  nlohmann::json prev_rows = nlohmann::json::array();
  if (std::filesystem::exists(prev_file)) {
    const nlohmann::json prev = read_json_file(prev_file);
    const nlohmann::json runs = earlier_runs(prev.value("context", nlohmann::json::object()), tr.ctx);
    if (!runs.empty()) tr.ctx["earlier_runs"] = runs;
    if (!o.overwrite) prev_rows = prev.value("rows", prev_rows);
    // A complete run (same config: open_run_dir refused another) resumed: every prediction is there
    // unless its input or model changed. It stays named by the binaries that made it until this one
    // decodes a record; before, a resume that did nothing rewrote it as this binary's run.
    if (!o.overwrite && prev.value("complete", false) && prev.contains("context")) {
      tr.kept_ctx = prev["context"];
      return tr;
    }
  }
  tr.run.write_result(tr.ctx, prev_rows, {{"complete", false}});
  return tr;
}

std::string task_table_header(const TaskCommonOptions& o, const TaskPlan& plan) {
  return fmt::format("# preset {}; {}\n# entries_start / entries_peak: live entries per (layer, KV head) right after "
                     "compression / the most held (own generated tokens included); mem *: entries_start more than "
                     "1% from the median of its setting\n",
                     o.preset, plan.protocol.line());
}

void remove_other_datasets(const TaskCommonOptions& o, const TaskRun& tr) {
  if (!o.overwrite || !std::filesystem::is_directory(tr.run.file("pred"))) return;
  for (const auto& folder : task_branch_folders(tr.run.file("pred")))
    for (const auto& e : std::filesystem::directory_iterator(folder))
      if (e.path().extension() == ".jsonl" && !tr.datasets.count(e.path().stem().string())) {
        std::filesystem::remove(e.path());
        fmt::print(stderr, "[kvlab] --overwrite: removed {} (a dataset this config does not run)\n", e.path().string());
      }
}

nlohmann::json run_task_dataset(const TaskCommonOptions& o, const TaskModel& tm, TaskRun& tr, const TaskSpec& task,
                                const std::vector<TaskRecord>& records, const TaskPlan& plan, nlohmann::json& rows,
                                bool last) {
  TaskOptions to;
  to.pred_dir = tr.run.file("pred");
  to.seed = static_cast<uint64_t>(o.seed);
  to.obs_queries = o.obs_queries;
  to.keep_first = o.keep_first;
  to.keep_last = o.keep_last;
  to.batch = !o.no_batch;
  to.protocol = plan.protocol;
  to.reconstruction_templated = reconstruction_prompt(tm.tok, resolve_model_chat_template(o.chat_template, tm.src, tm.tok));
  to.reconstruction_plain = reconstruction_prompt(tm.tok, "none");
  if (o.kept_out) to.kept_dir = tr.run.file("kept");
  to.layer_error = o.layer_error;
  // Shard i of N takes units i, i + N, ...: a unit is a record, or the consecutive records asking
  // about one context (TaskRecord::context_group), which stay together to share its prefill.
  std::vector<TaskRecord> mine;
  int64_t unit = -1;
  for (size_t k = 0; k < records.size(); ++k) {
    if (k == 0 || records[k].context_group.empty() || records[k].context_group != records[k - 1].context_group) ++unit;
    if (int(unit % plan.shard_n) == plan.shard_i) mine.push_back(records[k]);
  }
  Progress progress(o.name + " " + task.dataset, int64_t(mine.size()), !o.quiet);
  to.progress = [&](int64_t, int64_t, const std::string& note, bool resumed) {
    resumed ? progress.skip(1, note) : progress.advance(1, note);
  };
  // Before a prediction file changes (not after the first record decoded: a kill in between left a
  // complete result.json over files that had lost their stale lines).
  to.before_change = [&] {
    if (tr.computed) return;
    tr.computed = true;  // from now on this binary's run: say so, and that it is not complete yet
    if (tr.kept_ctx) tr.write(rows, {{"complete", false}});
  };
  nlohmann::json got = run_task(tm.model, tm.tok, task, mine, plan.branches, to);
  for (auto& row : got) rows.push_back(row);
  progress.finish();
  tr.datasets.insert(task.dataset);
  if (last) remove_other_datasets(o, tr);
  if (last || !tr.kept_ctx || tr.computed) tr.write(rows, {{"complete", last}});
  return got;
}

std::vector<std::string> task_branch_folders(const std::string& pred_dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> branches;
  for (const auto& entry : fs::directory_iterator(pred_dir))
    if (entry.is_directory()) branches.push_back(entry.path());
  std::sort(branches.begin(), branches.end(), [](const fs::path& a, const fs::path& b) {
    const bool ea = a.filename() == "exact", eb = b.filename() == "exact";
    return ea != eb ? ea : a < b;
  });
  return std::vector<std::string>(branches.begin(), branches.end());
}

}  // namespace kvlab::cli
