// A method as a run names it: its registry name, its preset (preset.h), the parameters given, the
// exact tokens the harness keeps around its region, and the compressor built from them; and the
// lists of budgets and methods a command's flags ask for. Shared by replay, generation and the
// benchmarks.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/compress/budget.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/quant/kv_quantizer.h"

namespace kvlab {

struct MethodSpec {
  std::string name;
  // One method at several parameter settings in one run: "buzz@tw15" is buzz, its own branch and
  // label, scoped by --param buzz@tw15.window=38 or the config's params {"buzz@tw15": {...}}.
  // Empty for a method named alone.
  std::string variant;
  std::string preset = "default";
  nlohmann::json params = nlohmann::json::object();  // the preset's, overridden by config then flags
  std::shared_ptr<const Compressor> compressor;      // built from name + params
  // The quantizer storing what the method keeps (issue 52; "snapkv+kivi2", or "kivi2" alone for the
  // full cache quantized: name "exact"); null = full precision.
  std::shared_ptr<const KvQuantizer> quant;
  // Exact positions the harness keeps before / after the method's region; -1 = the run's
  // --keep-first / --keep-last. Set by the preset or the harness-level parameters keep_first /
  // keep_last (e.g. --param balancekv.keep_first=32).
  int64_t keep_first = -1;
  int64_t keep_last = -1;

  int64_t keep_first_or(int64_t run) const { return keep_first >= 0 ? keep_first : run; }
  int64_t keep_last_or(int64_t run) const { return keep_last >= 0 ? keep_last : run; }
  // What results call it: "snapkv", "snapkv@w100", "snapkv+kivi2", "kivi2" (the full cache quantized).
  std::string label() const;
  // The full-precision full cache, every run's reference.
  bool full_cache() const { return name == "exact" && !quant; }
  // One branch whatever the run's budgets: the full cache (quantized or not), or a method that keeps
  // what its own threshold decides (CompressorInfo::own_memory).
  bool budget_free() const;
  bool own_memory() const;  // CompressorInfo::own_memory of the method
  // What ran: {"method", "preset", "params" (every effective value), "keep_first", "keep_last"}
  // with the run's keep values filled in.
  nlohmann::json describe(int64_t run_keep_first, int64_t run_keep_last) const;
};

// The budgets a method runs at, given the run's: a method whose own threshold decides its memory
// runs once, at ratio 1 (labelled "own"); every other method at each budget given.
std::vector<Budget> method_budgets(const MethodSpec& method, const std::vector<Budget>& given);
// A row's "setting": "own" for such a method, else the budget's label ("ratio=0.2").
std::string setting_label(const MethodSpec& method, const Budget& budget);

// Exactly one of the lists must be non-empty; each value validated by Budget with the flag's name.
std::vector<Budget> budget_settings(const std::vector<double>& ratios, const std::vector<int64_t>& budgets,
                                    const std::vector<int64_t>& halvings, const std::vector<double>& bytes = {});

// `spec`: "a,b" or "all"; an entry may be "method+quantizer" or a quantizer alone
// (quant/kv_quantizer.h), and a method may carry a variant tag, "method@tag" (letters, digits, '_'
// and '-'; not on exact), to run it at other parameters beside itself. `flag_params`: "key=value" (every method) or "method.key=value";
// `config_params`: {"method": {"key": value}}. Unknown methods and parameters are errors.
// `preset` ("default" | "paper") gives each method's starting parameters and exact tokens; `model`
// (the run's --model) fills "{model}" in a preset's file names. A preset's required file (Chelsea's
// outlier heads) must exist: the error names it and the command that makes it. With
// `need_files` false (a command's check() before a dry run: an earlier step may make the file) a
// method whose calibration file does not exist yet is left out of the result instead. "all" leaves
// out the methods that need a calibration file (CompressorInfo::calibration) and are given none.
std::vector<MethodSpec> build_methods(const std::string& spec, const std::vector<std::string>& flag_params,
                                      const nlohmann::json& config_params, const std::string& preset = "default",
                                      const std::string& model = "", bool need_files = true);

// A quantized method ("h2o+kivi2") that would compress while decoding (a streaming method, when
// the run `streams`) is an error naming --method and `fix`, the flag that makes it compress once:
// streaming caches are not quantized yet.
void check_quantized_methods(const std::vector<MethodSpec>& methods, bool streams, const std::string& fix);

// A method whose keys lose channels (think with key_channel_compression_ratio > 0) in a run that
// would quantize it, or whose `flags` (e.g. {"--bytes", "--decode-rule compress"}) are set: left
// out of `all` (`spec`), named alone an error naming --method and the flag, before the model loads.
// kvlab counts the narrower keys only in a full-precision cache compressed once (issue 53).
std::vector<MethodSpec> without_channel_pruning(std::vector<MethodSpec> methods, const std::string& spec,
                                                const std::vector<std::pair<bool, std::string>>& flags);

// For commands whose exact tokens come from their own flags only (replay, ppl, bench): a method
// with keep_first/keep_last parameters is an error naming `flags`.
void require_run_keeps(const std::vector<MethodSpec>& methods, const std::string& flags);

// Methods that score with the question's queries (their registry entry reads inputs::question_start:
// finch) where `command`'s prefill holds no question (replay, generate, the task commands under
// --protocol context), unless a `window` parameter gives their window: left out of `all`, named
// alone an error naming --param.
std::vector<MethodSpec> without_question(std::vector<MethodSpec> methods, const std::string& spec,
                                         const std::string& command);

// For commands that run methods without a model (replay, bench compress: the context's out_proj is
// undefined there): with `spec` "all" the methods that need the model (CompressorInfo::needs_model:
// its W_o, or a second prefill through it) are left out; named explicitly they are an error naming --method
// and `command`.
std::vector<MethodSpec> without_model_weights(std::vector<MethodSpec> methods, const std::string& spec,
                                              const std::string& command);

// A method parameter naming a kvlab calibration file (`kvlab calibrate chelsea | duo`: "kind"
// chelsea_outlier_scores or duo_head_scores) made on another model than the one run, whose identity
// is `model_key` (model/model.h), is an error naming the parameter, the file and both models (issue
// 50: a DuoAttention heads file of another model of the same shape was used). A file written before
// calibrations recorded their model ("model_key" absent) is taken as it is.
void check_calibrated_on(const std::vector<MethodSpec>& methods, const std::string& model_key,
                         const std::string& model_id);

}  // namespace kvlab
