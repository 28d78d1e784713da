// kvlab generate --model M (--prompt TEXT | --prompt-ids 1,2,3) [--chat-template none|auto|NAME]
//                [--max-new-tokens N] [--logits-out F.json] [--dtype fp32|bf16|fp16] [--device cpu|cuda]
//                [--method a,b (--ratio r1,r2 | --budget N | --T t) [--param k=v] [--keep-first N]
//                 [--keep-last N] [--obs-queries N] [--seed S]]
// Greedy decoding. Without --method: the exact KV cache, one prefill then one-token steps. With
// --method: one exact prefill shared by every (method, budget) branch (generate/branches.h); each
// branch compresses every layer's cache after prefill and decodes through it. Prints the text
// (stdout, generated tokens only) and the ids (prompt + generated); --logits-out writes every step's
// full logits (exact path).
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/core/config.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/bounds.h"
#include "kvlab/core/check.h"
#include "kvlab/core/report.h"
#include "kvlab/core/text.h"
#include "kvlab/generate/branches.h"
#include "kvlab/model/model.h"
#include "kvlab/model/model_tokenizer.h"

namespace kvlab::cli {
namespace {

struct GenerateCmdOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;  // the prompt text from a file (as --prompt)
  std::string prompt_ids;  // "1,2,3": used as they are (no tokenizer, no chat template applied)
  std::string chat_template = "auto";
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;
  std::string logits_out;
  std::string dtype = "fp32";
  std::string weights = "fp32";
  std::string device = "cpu";
  bool json = false;
  std::string method;
  std::vector<double> ratio;
  std::vector<int64_t> budget;
  std::vector<int64_t> T;
  std::vector<double> bytes;
  std::vector<std::string> param;
  nlohmann::json params = nlohmann::json::object();
  int64_t keep_first = 0;
  int64_t keep_last = 0;
  int64_t obs_queries = 256;
  int64_t seed = 42;
  bool prefill_only = false;
  bool rerotate = false;
  int64_t compress_every = 0;
  bool no_batch = false;
  bool overwrite = false;
  std::string preset = "default";
  std::string kept_out;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)").required();
    f.add("prompt", prompt, "prompt text (tokenized with the model's tokenizer)");
    f.add("prompt_file", prompt_file, "file holding the prompt text (as --prompt)");
    f.add("prompt_ids", prompt_ids, "comma-separated token ids, used as they are (kvzip's repeat prompt follows the chat template "
                                    "they start with)");
    f.add("chat_template", chat_template, "none | auto | a template name (chatml, llama3, ...)");
    f.add("max_new_tokens", max_new_tokens, "tokens to generate");
    f.add("ignore_eos", ignore_eos, "keep generating after an end-of-sequence token");
    f.add("logits_out", logits_out, "write each step's full logits to this JSON file");
    f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16 | fp64");
    f.add("weights", weights, "a GGUF's matrices: stored = used as the file stores them (CPU, fp32; issue 51), fp32 = dequantized at load").one_of({"fp32", "stored"});
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("json", json, "print one JSON object instead of text");
    f.add("method", method, "compressed-cache branches: comma-separated methods (see 'kvlab replay --list-methods'); "
                            "one exact prefill is shared by all");
    f.add("ratio", ratio, "fractions of the compressible prompt kept, e.g. 0.1,0.2 (with --method)");
    f.add("budget", budget, "entries kept per KV head (instead of --ratio)");
    f.add("T", T, "halvings for halving methods (instead of --ratio)");
    f.add("bytes", bytes, "fractions of the full-precision K and V bytes each branch may hold, e.g. 0.25 (equal bytes: a quantized branch keeps as many more entries as its bits allow; instead of --ratio)");
    f.add("param", param, "method parameters key=value, or method.key=value to scope one method");
    f.add("params", params, "config only: {\"method\": {\"key\": value}}");
    f.add("keep_first", keep_first, "first prompt positions kept exact, inside the budget (methods whose preset "
                                    "sets none)");
    f.add("keep_last", keep_last, "last prompt positions kept exact, inside the budget (likewise)");
    f.add("preset", preset, "default (the methods' defaults) | paper (each method as its paper's end-to-end runs, "
                            "sinks and windows included)");
    f.add("kept_out", kept_out, "write what each branch's cache holds at the end (positions and weights per layer "
                                "and KV head) to this JSON file");
    f.add("obs_queries", obs_queries, "the last N prompt queries per layer that methods may score keys with");
    f.add("seed", seed, "seed of random methods");
    f.add("overwrite", overwrite, "replace an existing --logits-out file");
    f.add("no_batch", no_batch, "decode the --method branches one after another, each streamed as it comes "
                                "(default: all in one batch, printed when done; the same outputs)");
    f.add("prefill_only", prefill_only, "streaming methods too compress once after prefill and append decoded "
                                        "tokens exactly (default: they keep compressing while decoding)");
    f.add("rerotate", rerotate, "kept keys moved to contiguous positions after compression (kvpress's "
                                "KeyRerotationPress) and, for streaming methods, after every token (StreamingLLM's and "
                                "BUZZ's code); default: keys keep their cached positions");
    f.add("compress_every", compress_every, "every method compresses what it holds again every N decoded tokens, "
          "to its budget on the tokens seen (kvpress's DecodingPress / CompressionRatioDecodingPress; the task "
          "commands' --decode-rule compress:N); 0 = off");
  }
};

// --method: one prefill, one branch per (method, budget); streams each branch's text as it comes.
void run_branches(const GenerateCmdOptions& o, const Model& model, const std::vector<int64_t>& prompt_ids,
                  const Tokenizer* tok, const std::string& template_name, const ModelSource& src,
                  const std::vector<MethodSpec>& methods, const std::vector<Budget>& budgets) {
  check_calibrated_on(methods, model_key(model), model.id);
  std::vector<const Compressor*> compressors;
  for (const auto& m : methods) compressors.push_back(m.compressor.get());
  const int64_t n_obs = check_observation_queries(compressors, o.obs_queries);  // -1 = every prompt query
  Prefill prefill = run_prefill(model, prompt_ids, n_obs < 0 ? int64_t(prompt_ids.size()) : n_obs);
  if (tok) {
    // kvzip's repeat prompt: the model's chat template when the ids start with its prefix, as the task
    // runner chooses (reconstruction_prompt_for), so --prompt-ids and text templated beforehand with
    // --chat-template none reconstruct what KVzipPress does (issue 50: they got "none": prefix '', turn
    // "\n", and kept sets of Jaccard 0.68 to kvpress's on a 1,167-token chat prompt).
    const ReconstructionPrompt plain = reconstruction_prompt(*tok, "none");
    const std::string name = template_name != "none" ? template_name
                                                      : resolve_model_chat_template(o.chat_template == "none" ? "auto"
                                                                                                              : o.chat_template,
                                                                                    src, *tok);
    const ReconstructionPrompt templated = name == "none" ? plain : reconstruction_prompt(*tok, name);
    prefill.reconstruction = reconstruction_prompt_for(prompt_ids, templated, plain);
  }
  size_t n_branches = 0;
  for (const auto& m : methods) n_branches += method_budgets(m, budgets).size();
  fmt::print(stderr, "[generate] one prefill of {} tokens in {:.2f} s ({:.1f} tokens/s), exact cache {:.2f} MiB; "
             "{} branches\n", prompt_ids.size(), prefill.seconds, prompt_ids.size() / std::max(prefill.seconds, 1e-9),
             prefill.exact_kv_bytes() / 1048576.0, n_branches);
  nlohmann::json branches = nlohmann::json::array(), kept = nlohmann::json::array();
  std::vector<BranchSpec> specs;
  std::vector<BranchOptions> bos;
  std::vector<Budget> settings;
  for (const auto& m : methods)
    for (const Budget& b : method_budgets(m, budgets)) {
      specs.push_back({m, b, static_cast<uint64_t>(o.seed), m.keep_first_or(o.keep_first), m.keep_last_or(o.keep_last),
                       !o.prefill_only, /*count_whole=*/true, o.rerotate, DecodingRule{o.compress_every}});
      BranchOptions bo;
      bo.keep_kept = !o.kept_out.empty();
      bo.max_new_tokens = o.max_new_tokens;
      bo.stop_at_eos = !o.ignore_eos;
      bos.push_back(std::move(bo));
      settings.push_back(b);
    }
  // Batched (the default): every branch decodes in one batch and its text is printed when all are
  // done. --no-batch: one after another, each branch's text streamed as it comes.
  std::vector<BranchResult> results;
  std::vector<std::string> shown(specs.size());
  if (!o.no_batch) {
    results = run_branches(model, prefill, specs, bos);
  } else {
    for (size_t i = 0; i < specs.size(); ++i) {
      // The decode of every id so far, printed past what is shown (a token decoded alone loses
      // SentencePiece's leading space and cuts UTF-8 characters), so the text printed equals the
      // plain run's for the same ids.
      std::vector<int64_t> so_far;
      auto show = [&](const std::string& text) {
        if (text.compare(0, shown[i].size(), shown[i]) != 0) return;  // an unfinished character: wait
        fmt::print("{}", text.substr(shown[i].size()));
        std::fflush(stdout);
        shown[i] = text;
      };
      if (!o.json) {
        fmt::print("=== {} {}\n", specs[i].method.label(), settings[i].label());
        if (tok) bos[i].on_token = [&](int64_t id) { so_far.push_back(id), show(tok->decode(so_far)); };
      }
      results.push_back(run_branch(model, prefill, specs[i], bos[i]));
      bos[i].on_token = nullptr;
      const std::string text = tok ? tok->decode(results[i].ids) : std::string();
      if (!o.json && tok && text != shown[i]) fmt::print("{}{}", shown[i].empty() ? "" : "\n", text);  // if a wait never ended
      if (!o.json) fmt::print("\nids: {}\n", fmt::join(results[i].ids, ","));
      std::fflush(stdout);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const MethodSpec& m = specs[i].method;
    const Budget& b = settings[i];
    const BranchSpec& spec = specs[i];
    const BranchResult& r = results[i];
    const std::string text = tok ? tok->decode(r.ids) : std::string();
    if (!o.no_batch && !o.json) {
      fmt::print("=== {} {}\n{}\nids: {}\n", m.label(), b.label(), text, fmt::join(r.ids, ","));
      std::fflush(stdout);
    }
    fmt::print(stderr, "[generate] {} {}: KV cache {:.2f} MiB after prefill ({:.3f} of exact), peak {:.2f} MiB, "
               "entries per (layer, KV head) {:.1f} after prefill, peak {:.1f}; {}compress {:.1f} ms, {} tokens in "
               "{:.2f} s{}\n", m.label(), b.label(), r.kv_bytes / 1048576.0,
               double(r.kv_bytes) / double(prefill.exact_kv_bytes()), r.kv_bytes_peak / 1048576.0, r.entries_start,
               r.entries_peak,
               r.reconstruction_seconds > 0
                   ? fmt::format("context reconstruction (a second prefill) {:.2f} s, ", r.reconstruction_seconds)
                   : std::string(),
               r.compress_ms, r.ids.size(), r.decode_seconds, o.no_batch ? "" : " (its share of the batched steps)");
    if (bos[i].keep_kept) {
      nlohmann::json k = m.describe(o.keep_first, o.keep_last);
      k["setting"] = b.to_json();
      k["layers"] = r.kept["layers"];
      kept.push_back(std::move(k));
    }
    nlohmann::json j = {{"method", m.label()}, {"preset", m.preset}, {"params", m.compressor->params()},
                        {"keep_first", spec.keep_first}, {"keep_last", spec.keep_last}, {"seed", o.seed},
                        {"entries_start", r.entries_start}, {"entries_mean", r.entries_mean},
                        {"entries_peak", r.entries_peak},
                        {"streaming", spec.stream && spec.decoding.every == 0 && compressor_info(m.name).streaming},
                        {"compress_every", spec.decoding.every},
                        {"generated_ids", r.ids}, {"text", text}, {"kv_bytes", r.kv_bytes},
                        {"kv_bytes_peak", r.kv_bytes_peak}, {"kv_bytes_end", r.kv_bytes_end},
                        {"kv_bytes_window_layers", r.kv_bytes_window},
                        {"exact_kv_bytes", prefill.exact_kv_bytes()}, {"compress_ms", r.compress_ms},
                        {"reconstruction_seconds", r.reconstruction_seconds}, {"decode_seconds", r.decode_seconds}};
    const nlohmann::json setting = b.to_json();
    for (auto it = setting.begin(); it != setting.end(); ++it) j[it.key()] = it.value();
    if (m.quant) j["kv_quant"] = m.quant->describe();
    branches.push_back(j);
  }
  if (!o.kept_out.empty()) {
    write_json_atomic(o.kept_out, {{"model", model.id}, {"prompt_tokens", prompt_ids.size()}, {"branches", kept}});
    fmt::print(stderr, "[generate] wrote {}\n", o.kept_out);
  }
  if (o.json)
    std::cout << nlohmann::json({{"model", model.id}, {"prompt_ids", prompt_ids}, {"prefills", 1},
                                 {"prefill_seconds", prefill.seconds}, {"branches", branches}}).dump(2)
              << "\n";
}

void run_generate(const GenerateCmdOptions& o, const nlohmann::json& /*effective*/) {
  KVLAB_CHECK(int(!o.prompt.empty()) + int(!o.prompt_file.empty()) + int(!o.prompt_ids.empty()) == 1,
              "give exactly one of --prompt, --prompt-file and --prompt-ids");
  const std::string prompt_text = o.prompt_file.empty() ? o.prompt : read_text_file(o.prompt_file, "--prompt-file");
  KVLAB_CHECK(!o.prompt_ids.empty() || prompt_text.find_first_not_of(" \t\r\n") != std::string::npos,
              "{}: the prompt is empty", o.prompt_file.empty() ? "--prompt" : "--prompt-file " + o.prompt_file);
  KVLAB_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be >= 1, got {}", o.max_new_tokens);
  if (!o.logits_out.empty()) check_output_file(o.logits_out, "--logits-out", {o.model}, o.overwrite);
  if (!o.kept_out.empty()) {
    KVLAB_CHECK(!o.method.empty(), "--kept-out needs --method (what a compressed cache kept)");
    check_output_file(o.kept_out, "--kept-out", {o.model}, o.overwrite);
  }
  // Branch settings are checked before the model loads.
  std::vector<MethodSpec> methods;
  std::vector<Budget> budgets;
  if (o.method.empty()) {  // a branch flag alone would be ignored: the exact cache has no budget
    const std::pair<bool, const char*> branch_flags[] = {
        {!o.ratio.empty(), "--ratio"}, {!o.budget.empty(), "--budget"}, {!o.T.empty(), "--T"},
        {!o.bytes.empty(), "--bytes"}, {!o.param.empty(), "--param"}, {!o.params.empty(), "--params"}, {o.keep_first != 0, "--keep-first"},
        {o.keep_last != 0, "--keep-last"}, {o.prefill_only, "--prefill-only"}, {o.rerotate, "--rerotate"},
        {o.compress_every != 0, "--compress-every"}, {o.preset != "default", "--preset"}};
    for (const auto& [given, flag] : branch_flags)
      KVLAB_CHECK(!given, "{} applies to compressed-cache branches: give --method too (without it generate "
                  "decodes with the exact cache)", flag);
  } else {
    KVLAB_CHECK(o.keep_first >= 0 && o.keep_last >= 0, "--keep-first and --keep-last must be >= 0, got {} and {}",
                o.keep_first, o.keep_last);
    KVLAB_CHECK(o.logits_out.empty(), "--logits-out applies to exact decoding (without --method)");
    KVLAB_CHECK(o.seed >= 0, "--seed must be >= 0, got {}", o.seed);
    budgets = budget_settings(o.ratio, o.budget, o.T, o.bytes);
    methods = without_question(build_methods(o.method, o.param, o.params, o.preset, o.model), o.method, "generate");
    KVLAB_CHECK(o.compress_every >= 0, "--compress-every must be >= 0 (0 = off), got {}", o.compress_every);
    KVLAB_CHECK(o.compress_every == 0 || !o.rerotate, "--compress-every and --rerotate: re-rotation moves a method's "
                "own stream; give one of them");
    check_quantized_methods(methods, !o.prefill_only || o.compress_every > 0, "--prefill-only");
    methods = without_channel_pruning(std::move(methods), o.method,
                                      {{!o.bytes.empty(), "--bytes"}, {o.compress_every > 0, "--compress-every"},
                                       {o.rerotate, "--rerotate"}});
    if (o.compress_every > 0)
      for (const auto& m : methods)
        if (m.name != "exact") {
          KVLAB_CHECK(!m.quant, "--method {}: a cache compressed while decoding is not stored quantized yet (issue "
                      "52); drop --compress-every", m.label());
          check_decoding_compressible(m.name, *m.compressor, o.compress_every);
        }
    for (const auto& m : methods)
      KVLAB_CHECK(o.prefill_only || o.compress_every > 0 || m.keep_last_or(o.keep_last) == 0 ||
                      !compressor_info(m.name).streaming,
                  "--keep-last {}: {} streams while decoding and keeps its own recent window; --keep-last applies "
                  "to prefill-only methods (or give --prefill-only)", m.keep_last_or(o.keep_last), m.name);
  }
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.stored_weights = parse_weights_flag(o.weights, "--weights");
  lo.device = parse_device(o.device, "--device");
  ModelSource src = resolve_model(o.model, "--model");
  auto t0 = std::chrono::steady_clock::now();
  Model model = load_model(src, lo);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::unique_ptr<Tokenizer> tok;
  std::vector<int64_t> prompt_ids;
  std::string template_name = "none";
  if (!o.prompt_ids.empty()) {
    prompt_ids = parse_id_list(o.prompt_ids, "--prompt-ids");
  } else {
    tok = std::make_unique<Tokenizer>(load_model_tokenizer(src));
    const std::string text = apply_model_chat_template(o.chat_template, src, *tok, prompt_text, &template_name);
    prompt_ids = tok->encode(text, /*add_bos=*/true);
  }
  if (!tok) {
    try {
      tok = std::make_unique<Tokenizer>(load_model_tokenizer(src));  // for printing text only
    } catch (const Error&) {
    }
  }
  const int64_t context = model.config.max_position_embeddings;
  KVLAB_CHECK(fits_context(int64_t(prompt_ids.size()), o.max_new_tokens, context),
              "the prompt ({} tokens) plus --max-new-tokens {} exceed {}'s context of {} positions; shorten the "
              "prompt or lower --max-new-tokens", prompt_ids.size(), o.max_new_tokens, model.id, context);
  fmt::print(stderr, "[generate] {} ({} layers, {:.1f} M parameters, {} on {}) loaded in {:.2f} s; "
             "prompt {} tokens, chat template {}\n", model.id, model.config.n_layers,
             n_parameters(model) / 1e6, o.dtype, model.device.str(), load_s, prompt_ids.size(),
             template_name);

  if (!o.method.empty()) return run_branches(o, model, prompt_ids, tok.get(), template_name, src, methods, budgets);
  ExactAttention attn(model.config.n_layers);
  GenerateOptions go;
  go.max_new_tokens = o.max_new_tokens;
  go.stop_at_eos = !o.ignore_eos;
  std::vector<std::vector<float>> step_logits;
  if (!o.logits_out.empty())
    go.on_logits = [&](int64_t, const at::Tensor& l) {
      at::Tensor c = l.to(at::kCPU, at::kFloat).contiguous();  // [vocab]
      step_logits.emplace_back(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    };
  t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> out = generate_greedy(model, prompt_ids, attn, go);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = tok ? tok->decode(out) : std::string();
  std::vector<int64_t> all_ids = prompt_ids;  // prompt + generated, like reference_greedy.json
  all_ids.insert(all_ids.end(), out.begin(), out.end());

  if (!o.logits_out.empty()) {
    nlohmann::json j = {{"model", model.id}, {"prompt_ids", prompt_ids}, {"generated_ids", out},
                        {"vocab_size", model.config.vocab_size}, {"logits", step_logits}};
    write_json_atomic(o.logits_out, j);
  }
  if (o.json) {
    nlohmann::json j = {{"model", model.id}, {"prompt_ids", prompt_ids}, {"generated_ids", out},
                        {"ids", all_ids}, {"text", text}, {"chat_template", template_name}, {"seconds", gen_s}};
    std::cout << j.dump(2) << "\n";
  } else {
    fmt::print("{}\n", text);
    fmt::print("ids: {}\n", fmt::join(all_ids, ","));  // prompt + generated
  }
  fmt::print(stderr, "[generate] {} tokens in {:.2f} s ({:.1f} tokens/s)\n", out.size(), gen_s,
             out.size() / std::max(gen_s, 1e-9));
}

}  // namespace

void setup_generate(CLI::App& app) {
  add_command<GenerateCmdOptions>(app, "generate",
                     "Greedy decoding with a model (prints text and ids)",
                     run_generate);
}

}  // namespace kvlab::cli
