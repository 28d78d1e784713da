#include "kvlab/compress/compressor.h"

#include <cmath>
#include <limits>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

namespace kvlab {

double CompressedKV::mean_entries() const {
  if (!bias.defined()) return static_cast<double>(keys.size(1));
  auto real = (bias != -std::numeric_limits<double>::infinity()).sum(1);  // [n_kv_heads]
  return real.to(at::kDouble).mean().item<double>();
}

double CompressedKV::mean_memory_entries() const {
  double m = mean_entries();
  if (has_separate_den()) {
    if (!den_bias.defined()) return m + static_cast<double>(den_keys.size(1));
    auto real = (den_bias != -std::numeric_limits<double>::infinity()).sum(1);
    m += real.to(at::kDouble).mean().item<double>();
  }
  return m;
}

int64_t CompressedKV::key_bytes_saved() const {
  if (!pruned_channels.defined()) return 0;
  const int64_t h_kv = keys.size(0), m = keys.size(1), d = keys.size(2);
  const at::Tensor live = bias.defined() ? at::isfinite(bias).sum(1).to(at::kCPU)                      // [Hkv]
                                         : at::full({h_kv}, m, at::TensorOptions().dtype(at::kLong));
  const at::Tensor pruned = pruned_channels.sum(1).to(at::kCPU, at::kLong);                            // [Hkv]
  const int64_t channel_bytes = (live.to(at::kLong) * pruned).sum().item<int64_t>() * int64_t(keys.element_size());
  return channel_bytes - h_kv * ((d + 7) / 8);  // each head's d-bit mask
}

int64_t check_observation_queries(const std::vector<const Compressor*>& methods, int64_t obs_queries) {
  KVLAB_CHECK(obs_queries >= -1, "--obs-queries must be >= 0 (or -1 for every prompt query), got {}", obs_queries);
  int64_t need = obs_queries;
  for (const Compressor* c : methods) {
    if (!c) continue;
    const int64_t want = c->observation_queries();
    if (want < 0) {
      need = -1;  // every prompt query: the prefill keeps them all
      continue;
    }
    KVLAB_CHECK(obs_queries < 0 || want <= obs_queries,
                "{} scores keys with the last {} prompt queries (its window parameter, {}) but --obs-queries "
                "keeps {}: raise --obs-queries to {} or lower the window",
                c->name(), want, c->params().dump(), obs_queries, want);
  }
  return need;
}

int64_t resolve_budget(const CompressOptions& opt, int64_t n) { return opt.budget.entries_for(n); }

double resolve_kept_fraction(const CompressOptions& opt, int64_t n) {
  return opt.budget.kind == Budget::Kind::ratio ? opt.budget.ratio : double(resolve_budget(opt, n)) / double(n);
}

CompressedKV gather_kept(const LayerKV& kv, const at::Tensor& idx) {
  // idx [Hkv, m] int64, -1 = padding
  const int64_t h = kv.n_kv_heads(), d = kv.keys.size(2);
  auto safe = idx.clamp_min(0);                                          // [Hkv, m]
  auto gi = safe.unsqueeze(-1).expand({h, idx.size(1), d});              // [Hkv, m, d]
  CompressedKV out;
  out.keys = kv.keys.gather(1, gi);
  out.values = kv.values.gather(1, gi.expand({h, idx.size(1), kv.values.size(2)}));
  out.bias = at::zeros({h, idx.size(1)}, kv.keys.options())
                 .masked_fill(idx < 0, -std::numeric_limits<double>::infinity());
  out.kept_idx = idx;
  return out;
}

CompressedKV keep_all(const LayerKV& kv) {
  const int64_t h = kv.n_kv_heads(), n = kv.n_tokens();
  auto idx = at::arange(n, kv.keys.options().dtype(at::kLong)).unsqueeze(0).expand({h, n}).contiguous();
  CompressedKV out;
  out.keys = kv.keys;
  out.values = kv.values;
  out.bias = at::zeros({h, n}, kv.keys.options());
  out.kept_idx = idx;
  return out;
}

at::Tensor visible_keys(const LayerKV& kv) {
  if (!kv.n_prefix() && !kv.n_suffix()) return kv.keys;
  std::vector<at::Tensor> parts;
  if (kv.n_prefix()) parts.push_back(kv.prefix_keys.to(kv.keys.scalar_type()));
  parts.push_back(kv.keys);
  if (kv.n_suffix()) parts.push_back(kv.suffix_keys.to(kv.keys.scalar_type()));
  return at::cat(parts, 1);  // [Hkv, n_prefix + n + n_suffix, d]
}

at::Tensor group_attention_probs(const LayerKV& kv, const std::string& reduce) {
  // -> [Hkv, n_obs, n]
  KVLAB_CHECK(kv.queries.defined() && kv.queries.size(1) > 0,
              "this method scores keys with queries, but the region came with none");
  const int64_t h_kv = kv.n_kv_heads(), h_q = kv.queries.size(0), n_obs = kv.queries.size(1);
  const int64_t n = kv.n_tokens(), d = kv.keys.size(2), g = h_q / h_kv;
  const int64_t n_pre = kv.n_prefix();
  KVLAB_CHECK(n_pre == 0 || n_pre == kv.pos0, "prefix_keys hold {} positions, but the region starts at {}",
              n_pre, kv.pos0);
  auto keys = visible_keys(kv);                                          // [Hkv, n_all, d]
  const int64_t n_all = keys.size(1), first = kv.pos0 - n_pre;          // position of keys[:, 0]
  auto qg = kv.queries.to(kv.keys.scalar_type()).reshape({h_kv, g, n_obs, d});
  auto s = at::matmul(qg, keys.unsqueeze(1).transpose(2, 3)) /
           std::sqrt(static_cast<double>(d));                            // [Hkv, g, n_obs, n_all]
  if (kv.query_pos.defined()) {
    auto kp = at::arange(first, first + n_all, kv.query_pos.options()).view({1, 1, 1, n_all});
    s = s.masked_fill(kp > kv.query_pos.view({1, 1, n_obs, 1}),
                      -std::numeric_limits<double>::infinity());
  }
  auto p = at::softmax(s, -1).nan_to_num(0.0).narrow(3, n_pre, n);     // [Hkv, g, n_obs, n]
  if (reduce == "mean") return p.mean(1);
  if (reduce == "sum") return p.sum(1);
  if (reduce == "max") return std::get<0>(p.max(1));
  KVLAB_FAIL("--param gqa_reduce must be one of mean, max, sum; got '{}'", reduce);
}

// ---- Params ----------------------------------------------------------------

Params::Params(nlohmann::json given, std::string method)
    : given_(given.is_null() ? nlohmann::json::object() : std::move(given)),
      effective_(nlohmann::json::object()),
      method_(std::move(method)) {
  KVLAB_CHECK(given_.is_object(), "{}: parameters must be a JSON object, got {}", method_,
              given_.dump());
}

namespace {
// Values given on the command line arrive as strings ("0.5"); accept those for numbers.
template <class T>
T parse_number(const nlohmann::json& v, const std::string& key, const std::string& method,
               const char* kind) {
  try {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      size_t used = 0;
      T out;
      if constexpr (std::is_same_v<T, double>) out = std::stod(s, &used);
      else out = static_cast<T>(std::stoll(s, &used));
      if (used == s.size()) return out;
    } else if constexpr (std::is_same_v<T, double>) {
      if (v.is_number()) return v.get<double>();
    } else if (v.is_number_integer() || v.is_number_unsigned()) {
      return v.get<T>();
    } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
      return static_cast<T>(v.get<double>());
    }
  } catch (const std::exception&) {
  }
  KVLAB_FAIL("{}: parameter '{}' must be {}, got {}", method, key, kind, v.dump());
}
}  // namespace

double Params::get_double(const std::string& key, double def) {
  double v = given_.contains(key) ? parse_number<double>(given_[key], key, method_, "a number") : def;
  effective_[key] = v;
  return v;
}

std::vector<double> Params::get_double_list(const std::string& key, const std::vector<double>& def) {
  std::vector<double> v = def;
  if (given_.contains(key)) {
    const auto& j = given_[key];
    v.clear();
    if (j.is_array()) {
      for (const auto& x : j) v.push_back(parse_number<double>(x, key, method_, "a list of numbers"));
    } else if (j.is_string()) {  // from the command line: "0.1,0.2,0.3" (or "" for none)
      const std::string s = j.get<std::string>();
      for (size_t from = 0; from < s.size();) {
        const size_t comma = std::min(s.find(',', from), s.size());
        v.push_back(parse_number<double>(nlohmann::json(s.substr(from, comma - from)), key, method_,
                                         "a list of numbers"));
        from = comma + 1;
      }
    } else {
      KVLAB_FAIL("{}: parameter '{}' must be a list of numbers ([0.1, 0.2] or \"0.1,0.2\"), got {}", method_, key,
                 j.dump());
    }
  }
  effective_[key] = v;
  return v;
}

int64_t Params::get_int(const std::string& key, int64_t def) {
  int64_t v =
      given_.contains(key) ? parse_number<int64_t>(given_[key], key, method_, "an integer") : def;
  effective_[key] = v;
  return v;
}

bool Params::get_bool(const std::string& key, bool def) {
  bool v = def;
  if (given_.contains(key)) {
    const auto& j = given_[key];
    if (j.is_boolean()) v = j.get<bool>();
    else if (j.is_string() && (j == "true" || j == "1")) v = true;
    else if (j.is_string() && (j == "false" || j == "0")) v = false;
    else KVLAB_FAIL("{}: parameter '{}' must be true or false, got {}", method_, key, j.dump());
  }
  effective_[key] = v;
  return v;
}

std::string Params::get_string(const std::string& key, const std::string& def,
                               const std::vector<std::string>& allowed) {
  std::string v = def;
  if (given_.contains(key)) {
    KVLAB_CHECK(given_[key].is_string(), "{}: parameter '{}' must be a string, got {}", method_, key,
                given_[key].dump());
    v = given_[key].get<std::string>();
  }
  if (!allowed.empty()) {
    bool ok = std::find(allowed.begin(), allowed.end(), v) != allowed.end();
    KVLAB_CHECK(ok, "{}: parameter '{}' must be one of {}, got '{}'", method_, key,
                fmt::join(allowed, ", "), v);
  }
  effective_[key] = v;
  return v;
}

void Params::finish() const {
  for (auto it = given_.begin(); it != given_.end(); ++it) {
    if (effective_.contains(it.key())) continue;
    std::vector<std::string> known;
    for (auto e = effective_.begin(); e != effective_.end(); ++e) known.push_back(e.key());
    std::string hint = closest_match(it.key(), known);
    KVLAB_FAIL("{}: unknown parameter '{}'{}; known: {}", method_, it.key(),
               hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
               known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", ")));
  }
}

}  // namespace kvlab
