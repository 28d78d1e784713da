#include "kvlab/compress/method_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/text.h"

namespace kvlab {

std::vector<Budget> budget_settings(const std::vector<double>& ratios, const std::vector<int64_t>& budgets,
                                    const std::vector<int64_t>& halvings, const std::vector<double>& bytes) {
  int given = int(!ratios.empty()) + int(!budgets.empty()) + int(!halvings.empty()) + int(!bytes.empty());
  KVLAB_CHECK(given == 1, "give exactly one of --ratio, --budget, --T, --bytes (got {})", given);
  std::vector<Budget> out;
  for (double r : ratios) out.push_back(Budget::of_ratio(r));
  for (double f : bytes) out.push_back(Budget::of_bytes(f));
  for (int64_t b : budgets) out.push_back(Budget::of_entries(b));
  for (int64_t t : halvings) out.push_back(Budget::of_halvings(t));
  return out;
}

namespace {

// A harness-level parameter (keep_first / keep_last): a JSON integer or a flag's string, >= 0.
int64_t keep_value(const nlohmann::json& v, const std::string& method, const std::string& key) {
  int64_t out = -1;
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_string()) {
    try {
      size_t used = 0;
      out = std::stoll(v.get<std::string>(), &used);
      if (used != v.get<std::string>().size()) out = -1;
    } catch (const std::exception&) {
      out = -1;
    }
  }
  KVLAB_CHECK(out >= 0, "{}: parameter '{}' must be an integer >= 0, got {}", method, key, v.dump());
  return out;
}

}  // namespace

void check_quantized_methods(const std::vector<MethodSpec>& methods, bool streams, const std::string& fix) {
  for (const auto& m : methods)
    KVLAB_CHECK(!m.quant || !streams || !compressor_info(m.name).streaming,
                "--method {}: {} compresses while decoding, and a streaming cache is not stored quantized yet "
                "(issue 52); give {} (it then compresses once after the prefill)", m.label(), m.name, fix);
}

namespace {

// `methods` less those for which `why_not` says why they cannot run here: under `all` (`spec`) left
// out, named alone the error why_not gives (what without_model_weights, without_question and
// without_channel_pruning share).
std::vector<MethodSpec> runnable(std::vector<MethodSpec> methods, const std::string& spec,
                                 const std::function<std::string(const MethodSpec&)>& why_not) {
  std::vector<MethodSpec> out;
  for (auto& m : methods) {
    const std::string why = why_not(m);
    KVLAB_CHECK(why.empty() || spec == "all", "{}", why);
    if (why.empty()) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

std::vector<MethodSpec> without_channel_pruning(std::vector<MethodSpec> methods, const std::string& spec,
                                                const std::vector<std::pair<bool, std::string>>& flags) {
  return runnable(std::move(methods), spec, [&](const MethodSpec& m) {
    const nlohmann::json p = m.compressor ? m.compressor->params() : nlohmann::json::object();
    std::string flag = m.quant ? "a quantizer" : "";
    for (const auto& [set, name] : flags)
      if (set && flag.empty()) flag = name;
    if (p.value("key_channel_compression_ratio", 0.0) <= 0.0 || flag.empty()) return std::string();
    return fmt::format("--method {} with {}: its keys lose channels (ThinK), which kvlab counts only in a "
                       "full-precision cache compressed once after the prefill and sized in entries; not yet (issue "
                       "53): give --ratio or --budget and the default decode rule", m.label(), flag);
  });
}

void require_run_keeps(const std::vector<MethodSpec>& methods, const std::string& flags) {
  for (const auto& m : methods)
    KVLAB_CHECK(m.keep_first < 0 && m.keep_last < 0,
                "{}: the parameters keep_first/keep_last apply to generation and the task commands; here use {}",
                m.name, flags);
}

nlohmann::json MethodSpec::describe(int64_t run_keep_first, int64_t run_keep_last) const {
  nlohmann::json out = {{"method", name},
                        {"preset", preset},
                        {"params", compressor ? compressor->params() : params},
                        {"keep_first", keep_first_or(run_keep_first)},
                        {"keep_last", keep_last_or(run_keep_last)}};
  if (quant) out["kv_quant"] = quant->describe();
  return out;
}

std::string MethodSpec::label() const {
  const std::string base = variant.empty() ? name : name + "@" + variant;
  if (!quant) return base;
  return name == "exact" ? quant->name() : base + "+" + quant->name();
}

bool MethodSpec::own_memory() const { return name != "exact" && compressor_info(name).own_memory; }
bool MethodSpec::budget_free() const { return name == "exact" || own_memory(); }

std::vector<Budget> method_budgets(const MethodSpec& method, const std::vector<Budget>& given) {
  if (method.own_memory()) return {Budget::of_ratio(1.0)};
  return given;
}

std::string setting_label(const MethodSpec& method, const Budget& budget) {
  return method.own_memory() ? "own" : budget.label();
}

namespace {

// "snapkv+kivi2" -> {"snapkv", kivi2}; "kivi2" -> {"exact", kivi2}; "snapkv" -> {"snapkv", null}.
std::pair<std::string, std::shared_ptr<const KvQuantizer>> split_quantizer(const std::string& entry) {
  const auto plus = entry.find('+');
  if (plus != std::string::npos) {
    KVLAB_CHECK(plus > 0 && entry.find('+', plus + 1) == std::string::npos,
                "--method: '{}': expected <method>+<quantizer> (e.g. snapkv+kivi2)", entry);
    return {entry.substr(0, plus), make_quantizer(entry.substr(plus + 1))};
  }
  // A quantizer's scheme and bits ("kivi2", "int4.r64", "fp8"): its errors name what is wrong.
  static const std::regex scheme(R"(^(kivi|int|hqq|fp)\d)");
  const auto names = compressor_names();
  if (std::find(names.begin(), names.end(), entry) == names.end() && std::regex_search(entry, scheme))
    return {"exact", make_quantizer(entry)};
  return {entry, nullptr};
}

}  // namespace

std::vector<MethodSpec> build_methods(const std::string& spec, const std::vector<std::string>& flag_params,
                                      const nlohmann::json& config_params, const std::string& preset,
                                      const std::string& model, bool need_files) {
  check_preset_name(preset);
  const std::vector<std::string> entries = spec == "all" ? compressor_names() : split(spec, ',');
  // Each entry is a method, a quantizer alone (the full cache quantized) or method+quantizer; `names`
  // holds the methods, which --param and the config's params scope by.
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const KvQuantizer>> quants;
  std::vector<std::string> methods, variants;  // "buzz@tw15": scope name "buzz@tw15", method buzz, variant tw15
  for (const auto& e : entries) {
    auto [base, q] = split_quantizer(e);
    names.push_back(base);
    quants.push_back(q);
    const auto at = base.find('@');
    methods.push_back(base.substr(0, at));
    variants.push_back(at == std::string::npos ? std::string() : base.substr(at + 1));
    if (at == std::string::npos) continue;
    const std::string& tag = variants.back();
    const bool ok = !tag.empty() && std::all_of(tag.begin(), tag.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    KVLAB_CHECK(ok, "--method: '{}': a variant tag after '@' is letters, digits, '_' and '-' (e.g. snapkv@w100), "
                "found '{}'", e, tag);
    KVLAB_CHECK(methods.back() != "exact", "--method: '{}': the full cache takes no variant (it has no parameters)", e);
  }
  KVLAB_CHECK(config_params.is_object(), "'params' in the config must be an object of method -> parameters");
  for (auto it = config_params.begin(); it != config_params.end(); ++it) {
    bool listed = std::find(names.begin(), names.end(), it.key()) != names.end();
    KVLAB_CHECK(listed, "config 'params' names method '{}', which is not in --method ({})", it.key(), spec);
  }
  std::vector<MethodSpec> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& scope = names[i];  // what --param and the config's params name it by
    const std::string& name = methods[i];
    KVLAB_CHECK(!name.empty(), "--method: empty method name in '{}'", spec);
    KVLAB_CHECK(std::count(entries.begin(), entries.end(), entries[i]) == 1,
                "--method: '{}' is listed more than once in '{}'", entries[i], spec);
    const MethodPreset pre = method_preset(name, preset);
    nlohmann::json params = pre.params;
    if (pre.keep_first > 0) params["keep_first"] = pre.keep_first;
    if (pre.keep_last > 0) params["keep_last"] = pre.keep_last;
    if (config_params.contains(scope))
      for (auto it = config_params[scope].begin(); it != config_params[scope].end(); ++it) params[it.key()] = it.value();
    // issue 50: two --param setting one method's key (snapkv.window=8 and snapkv.window=16, or
    // window=8 and snapkv.window=16) used the last one.
    std::map<std::string, std::string> set_by;  // key -> the --param that set it for this method
    for (const auto& kv : flag_params) {
      auto eq = kv.find('=');
      KVLAB_CHECK(eq != std::string::npos && eq > 0, "--param: expected key=value or method.key=value, got '{}'", kv);
      std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
      auto dot = key.find('.');
      if (dot != std::string::npos) {
        const std::string named = key.substr(0, dot);
        bool known = std::find(names.begin(), names.end(), named) != names.end();
        KVLAB_CHECK(known, "--param {}: method '{}' is not in --method ({})", kv, named, spec);
        if (named != scope) continue;
        key = key.substr(dot + 1);
      }
      const auto [first, fresh] = set_by.emplace(key, kv);
      KVLAB_CHECK(fresh, "--param '{}' and '{}' both set {}'s '{}': give it once", first->second, kv, scope, key);
      params[key] = value;  // strings; Params parses numbers and booleans with the key's name
    }
    MethodSpec m;
    m.name = name;
    m.variant = variants[i];
    m.preset = preset;
    nlohmann::json method_params = params;
    for (const char* key : {"keep_first", "keep_last"}) {
      if (!method_params.contains(key)) continue;
      (std::string(key) == "keep_first" ? m.keep_first : m.keep_last) = keep_value(method_params[key], name, key);
      method_params.erase(key);
    }
    if (!pre.required_file.empty() && method_params.contains(pre.required_file) &&
        method_params[pre.required_file].is_string())
      method_params[pre.required_file] = expand_model(method_params[pre.required_file].get<std::string>(), model);
    // Before a dry run (need_files false) a calibration file an earlier step makes may not exist
    // yet, whether the preset names it or `--param chelsea.outliers=F` does: leave the method out
    // (its compressor reads the file when made).
    const std::string file_key = method_preset(name, "paper").required_file;
    // `all` leaves out a method that cannot run without a calibration file when none is named
    // (duo_attention without `heads`); named in --method, it runs with its file or says which it needs.
    if (spec == "all" && compressor_info(name).calibration && !file_key.empty() &&
        !(method_params.contains(file_key) && method_params[file_key].is_string() &&
          !method_params[file_key].get<std::string>().empty()))
      continue;
    if (!need_files && !file_key.empty() && method_params.contains(file_key) && method_params[file_key].is_string() &&
        !method_params[file_key].get<std::string>().empty() &&
        !std::filesystem::exists(method_params[file_key].get<std::string>()))
      continue;
    // `--param chelsea.outliers=` (given, empty) runs the method without the file (Chelsea's NIAH
    // run omits the outlier heads); the method decides what none means, or refuses.
    const bool none_given = method_params.contains(pre.required_file) && method_params[pre.required_file] == "";
    if (!pre.required_file.empty() && !none_given) {
      const std::string file = method_params.value(pre.required_file, std::string());
      KVLAB_CHECK(!file.empty() && std::filesystem::is_regular_file(file),
                  "{} --preset {} needs the file of its parameter '{}' ({}), which does not exist; make it with: {} "
                  "(or give --param {}.{}= to run without it)",
                  name, preset, pre.required_file, file.empty() ? "not given" : "'" + file + "'",
                  expand_model(pre.make_command, model), name, pre.required_file);
    }
    m.params = method_params;
    m.compressor = make_compressor(name, method_params);
    m.quant = quants[i];
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<MethodSpec> without_model_weights(std::vector<MethodSpec> methods, const std::string& spec,
                                              const std::string& command) {
  return runnable(std::move(methods), spec, [&](const MethodSpec& m) {
    const CompressorInfo& info = compressor_info(m.name);
    if (!info.needs_model()) return std::string();
    // Only where it runs (issue 50: this advice named ppl, which refuses a method that does not stream).
    return fmt::format("--method {}: needs {}, and `kvlab {}` runs without the model (captures hold no weights); "
                       "run it in {}", m.name,
                       info.reads(inputs::out_proj) ? "the layer's output projection W_o"
                                                    : "a second prefill through the model",
                       command, info.streaming ? "generate, ppl or a task command" : "generate or a task command");
  });
}

std::vector<MethodSpec> without_question(std::vector<MethodSpec> methods, const std::string& spec,
                                         const std::string& command) {
  return runnable(std::move(methods), spec, [&](const MethodSpec& m) {
    const nlohmann::json p = m.compressor ? m.compressor->params() : nlohmann::json::object();
    if (!compressor_info(m.name).reads(inputs::question_start) || p.value("window", int64_t{0}) > 0)
      return std::string();
    return fmt::format("--method {}: scores with the question's queries, and {} prefills no question; give "
                       "--param {}.window=N (the prompt's last N tokens), or run a task command under --protocol whole",
                       m.label(), command, m.label());
  });
}

void check_calibrated_on(const std::vector<MethodSpec>& methods, const std::string& model_key,
                         const std::string& model_id) {
  for (const auto& m : methods)
    for (auto it = m.params.begin(); it != m.params.end(); ++it) {
      if (!it->is_string()) continue;
      const std::string path = it->get<std::string>();
      std::error_code ec;
      if (path.size() < 5 || path.substr(path.size() - 5) != ".json" || !std::filesystem::is_regular_file(path, ec))
        continue;
      const nlohmann::json j = read_json_file(path);
      const std::string kind = j.is_object() ? j.value("kind", std::string()) : std::string();
      if (kind != "duo_head_scores" && kind != "chelsea_outlier_scores") continue;
      if (!j.contains("model_key") || !j["model_key"].is_string()) continue;
      auto short_name = [](const std::string& id) { return std::filesystem::path(id).filename().string(); };
      KVLAB_CHECK(j["model_key"].get<std::string>() == model_key, "--method {}: parameter '{}' ({}) was calibrated on "
                  "another model ({}, not {}); calibrate it on this one", m.name, it.key(), path,
                  short_name(j.value("model", std::string("?"))), short_name(model_id));
    }
}

}  // namespace kvlab
