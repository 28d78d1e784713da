// The method registry: a list of methods, each stating its own facts in its own file
// (`CompressorInfo method_<id>()`, compressor.h). No self-registering statics: a static library
// would drop their object files. --list-methods, the benches and the tests read these entries;
// nothing outside compress/ keeps a list of methods.
//
// Adding a method: its file (class, factory, paper preset, method_<id>()), one line in
// KVLAB_METHODS below, one line in CMakeLists.txt.
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

// Every method, in --list-methods order: X(id) for the function method_<id>() of its file.
#define KVLAB_METHODS(X)                                                                          \
  X(exact) X(uniform) X(uniform_halving) X(streaming_llm) X(local) X(h2o) X(snapkv) X(knorm)        \
  X(tova) X(keydiff) X(lagkv) X(cur) X(expected_attention) X(capkv) X(compactor) X(adakv) X(criticalkv)            \
  X(criticaladakv) X(chunkkv) X(entropy_chunkkv) X(chunk) X(block) X(per_layer) X(merging) X(simlayerkv) X(dms) X(think) X(finch) X(kvzip) X(kvcompose) X(duo_attention) X(pyramidkv) X(cam) X(buzz) X(buzz_interval)          \
  X(buzz_logn) X(chelsea) X(balancekv) X(balancekv_mr) X(subgen) X(clustergen)

namespace kvlab {

#define KVLAB_DECLARE_METHOD(id) CompressorInfo method_##id();
KVLAB_METHODS(KVLAB_DECLARE_METHOD)
#undef KVLAB_DECLARE_METHOD

namespace {

std::vector<CompressorInfo>& table() {
#define KVLAB_METHOD_ENTRY(id) method_##id(),
  static std::vector<CompressorInfo> t = {KVLAB_METHODS(KVLAB_METHOD_ENTRY)};
#undef KVLAB_METHOD_ENTRY
  return t;
}

}  // namespace

namespace {

// "wrapper:scorer" -> {wrapper, scorer}; a plain name -> {name, ""}. Errors name the method.
std::pair<std::string, std::string> split_composed(const std::string& name) {
  const auto colon = name.find(':');
  if (colon == std::string::npos) return {name, ""};
  const std::string w = name.substr(0, colon), s = name.substr(colon + 1);
  const CompressorInfo* info = nullptr;
  for (const auto& e : table())
    if (e.name == w) info = &e;
  KVLAB_CHECK(info && info->wrapper, "method '{}': '{}' is not a wrapper (wrappers compose as wrapper:scorer, e.g. "
              "adakv:knorm)", name, w);
  KVLAB_CHECK(!s.empty() && s.find(':') == std::string::npos, "method '{}': give one scorer after '{}:'", name, w);
  compressor_info(s);  // a known method, or the error suggesting one
  return {w, s};
}

}  // namespace

std::unique_ptr<Compressor> make_compressor(const std::string& name, const nlohmann::json& params) {
  const auto [w, s] = split_composed(name);
  if (s.empty()) return compressor_info(name).make(params);
  nlohmann::json p = params.is_null() ? nlohmann::json::object() : params;
  KVLAB_CHECK(!p.contains("scorer") || p["scorer"] == s, "method '{}': parameter 'scorer' ({}) contradicts the name",
              name, p["scorer"].dump());
  p["scorer"] = s;
  return compressor_info(w).make(p);
}

const CompressorInfo& compressor_info(const std::string& name) {
  if (name.find(':') != std::string::npos) return compressor_info(split_composed(name).first);
  for (const auto& e : table())
    if (name == e.name) return e;
  auto names = compressor_names();
  std::string hint = closest_match(name, names);
  KVLAB_FAIL("Unknown compressor '{}'.{} Available: {}", name,
             hint.empty() ? "" : fmt::format(" Did you mean: {}?", hint), fmt::join(names, ", "));
}

const std::vector<CompressorInfo>& compressor_infos() { return table(); }

void add_compressor(CompressorInfo info) {
  KVLAB_CHECK(!info.name.empty() && info.name.find(':') == std::string::npos && info.make && info.paper,
              "add_compressor: a method needs a name (without ':'), a factory and a paper preset");
  for (const auto& e : table())
    KVLAB_CHECK(e.name != info.name, "add_compressor: a method named '{}' exists", info.name);
  table().push_back(std::move(info));
}

std::vector<std::string> compressor_names() {
  std::vector<std::string> out;
  for (const auto& e : table()) out.push_back(e.name);
  return out;
}

MethodPreset method_preset(const std::string& name, const std::string& preset) {
  check_preset_name(preset);
  auto [w, s] = split_composed(name);
  const CompressorInfo& info = compressor_info(w);
  if (preset != "paper") {
    MethodPreset d;
    d.source = "the method's parameter defaults";
    if (!s.empty()) d.params["scorer"] = s;
    return d;
  }
  if (!info.wrapper) return info.paper();
  // A wrapper's paper setting over its scorer's: the scorer's parameters and exact tokens from the
  // scorer's own preset, the wrapper's own parameters (those its preset sets that its default
  // scorer's preset does not) on top.
  const MethodPreset own = info.paper();
  const std::string default_scorer = own.params.value("scorer", std::string());
  if (s.empty()) s = default_scorer;
  const MethodPreset inner = method_preset(s, "paper"), base = method_preset(default_scorer, "paper");
  MethodPreset out = inner;
  for (auto it = own.params.begin(); it != own.params.end(); ++it)
    if (!base.params.contains(it.key())) out.params[it.key()] = it.value();
  out.params["scorer"] = s;
  out.source = own.source + "; scorer: " + inner.source;
  return out;
}

}  // namespace kvlab
