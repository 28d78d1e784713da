// chelsea
//
// Paper: J. Hu, S. Wang, Y. He, P. Gong, J. Yi, J. Zhang, Y. Bai, R. Chen, G. Zhang, C. Li, K. Yuan,
// "Efficient Long-Context LLM Inference via KV Cache Clustering" (Chelsea), arXiv:2506.11418
// (shared/papers/chelsea.txt: §5, Alg. 1, Theorem 6.1, App. B, App. C.2). No public code; the
// parent algorithm is ToMe's bipartite soft matching (Bolya et al., arXiv:2210.09461).
//
// Summary. The first n1 and last n2 entries are kept apart; the rest (the compressible part) is
// cut into chunks of c. Inside a chunk the entries alternate between sets A (even local index) and
// B (odd) — the partition Theorem 6.1 proves optimal for a convex decreasing similarity-vs-distance
// profile. Each A entry draws one edge to the B entry of its chunk with the largest cosine
// similarity of keys; the edges of all chunks are pooled, the top r·(#compressible entries) by
// similarity are kept, and each connected set (a B entry and the A entries pointing at it: a star)
// is merged into one entry whose key and value are the degree-weighted means (Eq. 2), degree =
// sum of degrees (tokens represented), attention bias log(degree). Steps repeat with
// r_i = r_init − α·min(m, i) until the budget is met; the last step merges only the edges still
// needed so the budget is hit exactly. Generation drives the same ChelseaCache (append, and
// compress_to(B) when the cache reaches B + g, Alg. 1).
//
// Cost (issue 13; replay, n = 4096: ~16 ms per (layer, KV head), ~28x uniform). Each merge
// round computes the c x c cosine similarities inside every chunk, O(n·c·d), and the r schedule
// runs several rounds (Alg. 1), each on the previous round's merged entries; uniform draws O(n)
// indices. The paper's own complexity claim is O(n·c·d) per round, which is what this costs.
//
// Budget. The budget B (entries per KV head) comes from resolve_budget; n1 and n2 count inside it.
// Kept entries == B exactly for every head not listed in `full_heads`. When B < n1 + n2 + 1 the
// protected ends shrink (n1' = min(n1, ⌊(B−1)/2⌋), n2' = min(n2, B − 1 − n1')) so that at least
// one compressible entry remains. A budget of T halvings is honoured through resolve_budget (n/2^T).
//
// Parameters [defaults]: n_sink [16], n_recent [64], chunk [256] (integer >= 2 or "none"),
//   family [llama2] selecting r_init/alpha/m presets (llama2 0.45/0.05/3, llama3 0.35/0.1/2,
//   qwen2 0.2/0.1/2), r_init, alpha, m (override the preset), r_min [0.05], full_heads [""],
//   full_layers [""], outliers [""] (a `kvlab calibrate chelsea` file), outlier_fraction [0.04],
//   reallocate [model] (model | layer), interval [32] (g: decoding re-clusters at budget + g).
//
// Deviations / decisions:
// - Steps re-chunk the current (already merged) entries in order; a merged entry sits at its B
//   entry's place. The paper's Alg. 1 calls Chelsea on the current cache, which implies the same.
// - #compressible entries in r·(#compressible) is the current compressible count at each step.
// - r floor: the paper restricts r "to exceed 0" without a value; kvlab uses r_min = 0.05, and
//   every step merges at least one edge.
// - Ties in similarity resolve by at::topk / at::max on CPU (deterministic for a given input).
// - Zero keys get cosine 0 to everything (norm clamped at 1e-12).
// - Outlier heads (App. B, §5.4, C.2): `kvlab calibrate chelsea` writes each (layer, KV head)'s
//   outlier score over WikiText-2 windows (chelsea_outlier_scores); `outliers=FILE` reads it and
//   gives the top `outlier_fraction` [0.04] of all heads the full cache. `full_layers` ("0" keeps
//   the first layer full, the paper's Llama-2 setting) and `full_heads` ("L:H,L:H") add heads by
//   hand; full layers count inside the fraction, as in App. C.2. The budget is reallocated so the
//   total matches (`reallocate` [model]): over the whole model, as the paper does: every other head
//   of every layer gets (L·H·B − F·n)/(L·H − F), the remainder to the first heads in (layer, head)
//   order — so a layer without outliers holds fewer than B per head; `reallocate=layer` keeps each
//   layer's total at H·B instead. A compressor sees one layer; the reallocation needs only n, L
//   (LayerKV::n_layers) and the full set, which every layer computes alike (n is the same for every
//   layer of a sample). The head index is the row of `kv.keys`: correct when the region holds
//   every KV head of the layer in order (replay without --heads).
// - Generation (start_stream, ChelseaStream): after prefill every KV head is compressed to its
//   budget as compress() does; while decoding a head is compressed again to its budget when it
//   reaches budget + g, g = parameter `interval` [32] (Alg. 1; the paper gives no default). The
//   budget follows the tokens seen (a ratio r keeps r·(n + decoded)); the paper fixes
//   B = R·(n + Γ) for a maximum decoding length Γ, which --budget N reproduces. Replay ignores
//   `interval` (it compresses once).
#include "kvlab/compress/preset.h"
#include "kvlab/compress/chelsea.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/core/config.h"

namespace kvlab {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}

ChelseaEdges chelsea_edges(const at::Tensor& keys, int64_t n1, int64_t n2, int64_t chunk) {
  // keys [H, n, d]
  const int64_t h = keys.size(0), n = keys.size(1), d = keys.size(2);
  const int64_t mc = n - n1 - n2;
  ChelseaEdges e;
  auto lopt = keys.options().dtype(at::kLong);
  if (mc < 2) {
    e.best = at::empty({h, 0}, keys.options());
    e.a_pos = at::empty({0}, lopt);
    e.b_pos = at::empty({h, 0}, lopt);
    return e;
  }
  const int64_t c = chunk > 0 ? std::min(chunk, mc) : mc;
  const int64_t nc = (mc + c - 1) / c, padded = nc * c, ca = (c + 1) / 2, cb = c / 2;
  auto kc = keys.narrow(1, n1, mc);                                              // [H, mc, d]
  auto kn = kc / kc.norm(2, -1, true).clamp_min(1e-12);                          // [H, mc, d]
  if (padded > mc) kn = at::cat({kn, at::zeros({h, padded - mc, d}, kn.options())}, 1);
  auto kv = kn.view({h, nc, c, d});                                              // [H, nc, c, d]
  auto ka = kv.slice(2, 0, c, 2);                                                // [H, nc, ca, d]
  auto kb = kv.slice(2, 1, c, 2);                                                // [H, nc, cb, d]
  auto local = at::arange(nc, lopt).view({nc, 1}) * c;                           // [nc, 1]
  auto a_off = local + at::arange(0, c, 2, lopt).view({1, ca});                  // [nc, ca]
  auto b_off = local + at::arange(1, c, 2, lopt).view({1, cb});                  // [nc, cb]
  auto a_ok = a_off < mc;                                                        // [nc, ca]
  auto b_ok = b_off < mc;                                                        // [nc, cb]
  auto sim = at::matmul(ka, kb.transpose(-1, -2));                               // [H, nc, ca, cb]
  sim = sim.masked_fill(b_ok.logical_not().view({1, nc, 1, cb}), kNegInf);
  auto mx = sim.max(-1);
  auto best = std::get<0>(mx).masked_fill(a_ok.logical_not().view({1, nc, ca}), kNegInf);
  auto arg = std::get<1>(mx);                                                    // [H, nc, ca]
  e.best = best.reshape({h, nc * ca});
  e.a_pos = a_off.reshape({nc * ca});
  e.b_pos = (local.view({1, nc, 1}) + 2 * arg + 1).reshape({h, nc * ca});
  // An A entry has a partner iff its chunk has a B entry: every chunk but a 1-entry tail.
  const int64_t tail = mc - (nc - 1) * c;
  e.n_valid = (nc - 1) * ca + (tail >= 2 ? (tail + 1) / 2 : 0);
  return e;
}

ChelseaCache::ChelseaCache(const ChelseaConfig& cfg, int64_t n_kv_heads)
    : cfg_(cfg), n_kv_heads_(n_kv_heads), n1_(cfg.n_sink), n2_(cfg.n_recent) {}

void ChelseaCache::append(const at::Tensor& keys, const at::Tensor& values) {
  // keys, values [H, t, d]
  auto deg = at::ones({keys.size(0), keys.size(1)}, keys.options());   // [H, t]
  if (!keys_.defined()) {
    keys_ = keys.contiguous();
    values_ = values.contiguous();
    degree_ = deg;
  } else {
    keys_ = at::cat({keys_, keys}, 1);
    values_ = at::cat({values_, values}, 1);
    degree_ = at::cat({degree_, deg}, 1);
  }
}

bool ChelseaCache::maybe_compress(int64_t budget, int64_t g) {
  if (size() < budget + g) return false;
  compress_to(budget);
  return true;
}

int64_t ChelseaCache::step(int64_t n_edges) {
  const int64_t h = n_kv_heads_, m = size();
  const ChelseaEdges e = chelsea_edges(keys_, n1_, n2_, cfg_.chunk);
  const int64_t n_merge = std::min(n_edges, e.n_valid);
  if (n_merge <= 0) return 0;
  auto top = std::get<1>(e.best.topk(n_merge, 1));                      // [H, E]
  auto a_pos = e.a_pos.index_select(0, top.reshape({-1})).view({h, n_merge}) + n1_;  // [H, E]
  auto b_pos = e.b_pos.gather(1, top) + n1_;                            // [H, E]

  // Every entry maps to itself, a merged A entry to its B partner: stars, one B per set.
  auto target = at::arange(m, a_pos.options()).view({1, m}).repeat({h, 1});  // [H, M]
  target.scatter_(1, a_pos, b_pos);
  const int64_t d = keys_.size(2), dv = values_.size(2);
  auto w = degree_.unsqueeze(-1);                                        // [H, M, 1]
  auto sum_k = at::zeros_like(keys_).scatter_add_(1, target.unsqueeze(-1).expand({h, m, d}), keys_ * w);
  auto sum_v = at::zeros_like(values_).scatter_add_(1, target.unsqueeze(-1).expand({h, m, dv}), values_ * w);
  auto sum_n = at::zeros_like(degree_).scatter_add_(1, target, degree_);  // [H, M]
  auto keep = at::ones({h, m}, a_pos.options().dtype(at::kBool));
  keep.scatter_(1, a_pos, false);
  // nonzero lists (head, index) row-major, so each head's kept indices come out ascending.
  auto idx = keep.nonzero().select(1, 1).view({h, m - n_merge});         // [H, M - E]
  auto nk = sum_n.gather(1, idx);                                        // [H, M - E]
  // Unmerged entries keep their exact key/value (x·N/N can round): take them as they were.
  auto merged = (nk != degree_.gather(1, idx)).unsqueeze(-1);            // [H, M - E, 1]
  auto old_k = keys_.gather(1, idx.unsqueeze(-1).expand({h, m - n_merge, d}));
  auto old_v = values_.gather(1, idx.unsqueeze(-1).expand({h, m - n_merge, dv}));
  auto new_k = sum_k.gather(1, idx.unsqueeze(-1).expand({h, m - n_merge, d})) / nk.unsqueeze(-1);
  auto new_v = sum_v.gather(1, idx.unsqueeze(-1).expand({h, m - n_merge, dv})) / nk.unsqueeze(-1);
  keys_ = at::where(merged, new_k, old_k);
  values_ = at::where(merged, new_v, old_v);
  degree_ = nk;
  return n_merge;
}

int ChelseaCache::compress_to(int64_t budget) {
  KVLAB_CHECK(budget >= 1, "chelsea: budget must be >= 1, got {}", budget);
  n1_ = cfg_.n_sink;
  n2_ = cfg_.n_recent;
  if (n1_ + n2_ + 1 > budget) {
    n1_ = std::min(cfg_.n_sink, (budget - 1) / 2);
    n2_ = std::min(cfg_.n_recent, budget - 1 - n1_);
  }
  int steps = 0;
  while (size() > budget) {
    const int64_t mc = size() - n1_ - n2_;
    const double r = cfg_.step_ratio(steps);
    int64_t want = std::max<int64_t>(1, static_cast<int64_t>(std::floor(r * static_cast<double>(mc))));
    want = std::min(want, size() - budget);
    const int64_t got = step(want);
    TORCH_INTERNAL_ASSERT(got > 0, "chelsea: no edge left to merge at size ", size());
    ++steps;
  }
  return steps;
}

at::Tensor chelsea_outlier_scores(const at::Tensor& keys, const ChelseaConfig& cfg,
                                  double sim_threshold) {
  // keys [H, n, d] -> [H]
  const ChelseaEdges e = chelsea_edges(keys, cfg.n_sink, cfg.n_recent, cfg.chunk);
  KVLAB_CHECK(e.n_valid > 0, "chelsea outlier score: no A entry has a partner (n = {})", keys.size(1));
  auto valid = e.best > kNegInf;                                              // [H, n_a]
  auto weak = (e.best < sim_threshold) & valid;                               // [H, n_a]
  return weak.sum(1).to(at::kDouble) / static_cast<double>(e.n_valid);
}

std::vector<std::pair<int, int>> chelsea_select_outlier_heads(const at::Tensor& scores,
                                                              double fraction) {
  // scores [L, H]
  const int64_t l = scores.size(0), h = scores.size(1);
  const int64_t k = static_cast<int64_t>(std::llround(fraction * static_cast<double>(l * h)));
  std::vector<std::pair<int, int>> out;
  if (k <= 0) return out;
  auto top = std::get<1>(scores.reshape({-1}).to(at::kDouble).topk(k));
  auto acc = top.contiguous();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t flat = acc[i].item<int64_t>();
    out.emplace_back(static_cast<int>(flat / h), static_cast<int>(flat % h));
  }
  return out;
}

namespace {

struct Preset {
  double r_init, alpha;
  int64_t m;
};
// App. C.2.
const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> p = {
      {"llama2", {0.45, 0.05, 3}}, {"llama3", {0.35, 0.1, 2}}, {"qwen2", {0.2, 0.1, 2}}};
  return p;
}

// "L:H,L:H" -> pairs; empty string -> none.
std::set<std::pair<int64_t, int64_t>> parse_full_heads(const std::string& s) {
  std::set<std::pair<int64_t, int64_t>> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    long long l = -1, h = -1;
    size_t used_l = 0, used_h = 0;
    bool ok = colon != std::string::npos;
    try {
      if (ok) {
        l = std::stoll(item.substr(0, colon), &used_l);
        h = std::stoll(item.substr(colon + 1), &used_h);
        ok = used_l == colon && used_h == item.size() - colon - 1 && l >= 0 && h >= 0;
      }
    } catch (const std::exception&) {
      ok = false;
    }
    KVLAB_CHECK(ok, "chelsea: parameter 'full_heads' must be a list \"layer:head,layer:head\" of "
                "0-based indices, got '{}' (bad item '{}')", s, item);
    out.insert({l, h});
  }
  return out;
}

// One layer of Chelsea while decoding (stream.h): a ChelseaCache per KV head (heads may have
// different budgets: outlier heads keep everything), held as one padded set with bias log(degree).
// Every entry is visible to every later query (pos -1): a step pushes one token.
class ChelseaStream final : public LayerStream {
 public:
  using Budgets = std::function<std::vector<int64_t>(int64_t n_seen)>;
  ChelseaStream(const ChelseaConfig& cfg, const LayerKV& kv, Budgets budgets, int64_t interval)
      : budgets_(std::move(budgets)), interval_(interval), n_seen_(kv.n_tokens()) {
    const int64_t h = kv.n_kv_heads(), n = kv.n_tokens();
    const auto b = budgets_(n);
    for (int64_t i = 0; i < h; ++i) {
      heads_.emplace_back(cfg, 1);
      heads_.back().append(kv.keys.narrow(0, i, 1), kv.values.narrow(0, i, 1));
      if (b[i] < n) heads_.back().compress_to(b[i]);
    }
    rebuild();
  }
  void push(const at::Tensor& k, const at::Tensor& v, int64_t) override {
    KVLAB_CHECK(k.size(1) == 1, "chelsea: decoding pushes one token per step, got {}", k.size(1));
    for (size_t i = 0; i < heads_.size(); ++i) heads_[i].append(k.narrow(0, i, 1), v.narrow(0, i, 1));
    n_seen_ += 1;
    rebuild();
  }
  void settle(const at::Tensor&, const at::Tensor&) override {
    const auto b = budgets_(n_seen_);
    bool changed = false;
    for (size_t i = 0; i < heads_.size(); ++i) changed |= heads_[i].maybe_compress(b[i], interval_);
    if (changed) rebuild();
  }
  const KVSet& held() const override { return held_; }
  int64_t n_seen() const override { return n_seen_; }

 private:
  void rebuild() {
    int64_t m = 0;
    for (const auto& c : heads_) m = std::max(m, c.size());
    const auto& k0 = heads_.front().keys();
    const int64_t h = static_cast<int64_t>(heads_.size());
    held_.keys = at::zeros({h, m, k0.size(2)}, k0.options());
    held_.values = at::zeros({h, m, heads_.front().values().size(2)}, k0.options());
    held_.bias = at::full({h, m}, -std::numeric_limits<double>::infinity(), k0.options());
    held_.pos = at::full({h, m}, -1, k0.options().dtype(at::kLong));
    for (int64_t i = 0; i < h; ++i) {
      const auto& c = heads_[i];
      held_.keys[i].narrow(0, 0, c.size()).copy_(c.keys()[0]);
      held_.values[i].narrow(0, 0, c.size()).copy_(c.values()[0]);
      held_.bias[i].narrow(0, 0, c.size()).copy_(c.degree()[0].log());
    }
  }
  Budgets budgets_;
  int64_t interval_;
  int64_t n_seen_;
  std::vector<ChelseaCache> heads_;
  KVSet held_;  // keys, values [Hkv, m, d], bias [Hkv, m] (log degree; -inf padding), pos -1
};

class Chelsea final : public Compressor {
 public:
  explicit Chelsea(const nlohmann::json& given_in) {
    nlohmann::json given = given_in.is_null() ? nlohmann::json::object() : given_in;
    bool chunk_none = false;
    if (given.is_object() && given.contains("chunk") && given["chunk"].is_string() &&
        given["chunk"] == "none") {
      given.erase("chunk");
      chunk_none = true;
    }
    Params p(given, "chelsea");
    cfg_.n_sink = p.get_int("n_sink", 16);
    KVLAB_CHECK(cfg_.n_sink >= 0, "chelsea: parameter 'n_sink' must be >= 0, got {}", cfg_.n_sink);
    cfg_.n_recent = p.get_int("n_recent", 64);
    KVLAB_CHECK(cfg_.n_recent >= 0, "chelsea: parameter 'n_recent' must be >= 0, got {}", cfg_.n_recent);
    if (!chunk_none) {
      cfg_.chunk = p.get_int("chunk", 256);
      KVLAB_CHECK(cfg_.chunk >= 2, "chelsea: parameter 'chunk' must be >= 2 or \"none\", got {}",
                  cfg_.chunk);
    } else {
      cfg_.chunk = 0;
    }
    const std::string fam = p.get_string("family", "llama2", {"llama2", "llama3", "qwen2"});
    const Preset pr = presets().at(fam);
    cfg_.r_init = p.get_double("r_init", pr.r_init);
    KVLAB_CHECK(cfg_.r_init > 0 && cfg_.r_init <= 0.5, "chelsea: parameter 'r_init' must be in (0, 0.5], got {}",
                cfg_.r_init);
    cfg_.alpha = p.get_double("alpha", pr.alpha);
    KVLAB_CHECK(cfg_.alpha >= 0, "chelsea: parameter 'alpha' must be >= 0, got {}", cfg_.alpha);
    cfg_.m = p.get_int("m", pr.m);
    KVLAB_CHECK(cfg_.m >= 0, "chelsea: parameter 'm' must be >= 0, got {}", cfg_.m);
    cfg_.r_min = p.get_double("r_min", 0.05);
    KVLAB_CHECK(cfg_.r_min > 0 && cfg_.r_min <= 0.5, "chelsea: parameter 'r_min' must be in (0, 0.5], got {}",
                cfg_.r_min);
    full_heads_ = parse_full_heads(p.get_string("full_heads", ""));
    for (const auto& item : split_list(p.get_string("full_layers", ""))) {
      int64_t l = -1;
      try {
        size_t used = 0;
        l = std::stoll(item, &used);
        if (used != item.size()) l = -1;
      } catch (const std::exception&) {
      }
      KVLAB_CHECK(l >= 0, "chelsea: parameter 'full_layers' must be 0-based layer indices like \"0\" or \"0,1\", "
                  "got bad item '{}'", item);
      full_layers_.insert(l);
    }
    outliers_path_ = p.get_string("outliers", "");
    outlier_fraction_ = p.get_double("outlier_fraction", 0.04);
    KVLAB_CHECK(outlier_fraction_ >= 0 && outlier_fraction_ < 1,
                "chelsea: parameter 'outlier_fraction' must be in [0, 1), got {}", outlier_fraction_);
    reallocate_ = p.get_string("reallocate", "model", {"model", "layer"});
    interval_ = p.get_int("interval", 32);
    KVLAB_CHECK(interval_ >= 0, "chelsea: parameter 'interval' (g) must be >= 0, got {}", interval_);
    if (!outliers_path_.empty()) outlier_scores_ = read_outlier_scores(outliers_path_);
    p.finish();
    params_ = p.effective();
    if (chunk_none) params_["chunk"] = "none";
  }

  std::string name() const override { return "chelsea"; }
  nlohmann::json params() const override { return params_; }

  // Generation (Alg. 1): each KV head's cache is compressed to its budget after prefill, as
  // compress() does, and again whenever it reaches budget + g while decoding.
  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t h = kv.n_kv_heads(), layer = kv.layer, n_layers = std::max(kv.n_layers, kv.layer + 1);
    auto budgets = [this, h, layer, n_layers, budget = opt.budget](int64_t n) {
      return n == 0 ? std::vector<int64_t>(h, 0) : head_budgets(n, h, layer, n_layers, budget.entries_for(n));
    };
    return std::make_unique<ChelseaStream>(cfg_, kv, budgets, interval_);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h = kv.n_kv_heads();
    const int64_t budget = resolve_budget(opt, n);
    const std::vector<int64_t> per_head = head_budgets(kv, budget);
    bool all_full = true;
    for (int64_t b : per_head) all_full = all_full && b >= n;
    if (all_full) return keep_all(kv);

    // Heads with equal budgets run together; results are padded to the longest head.
    std::map<int64_t, std::vector<int64_t>> groups;
    for (int64_t i = 0; i < h; ++i) groups[std::min(per_head[i], n)].push_back(i);
    int64_t longest = 0;
    for (const auto& g : groups) longest = std::max(longest, g.first);
    const int64_t d = kv.keys.size(2), dv = kv.values.size(2);
    CompressedKV out;
    out.keys = at::zeros({h, longest, d}, kv.keys.options());       // [H, m, d]
    out.values = at::zeros({h, longest, dv}, kv.values.options());  // [H, m, dv]
    out.bias = at::full({h, longest}, kNegInf, kv.keys.options());   // [H, m]
    for (const auto& [b, heads] : groups) {
      auto hi = at::tensor(heads, kv.keys.options().dtype(at::kLong));  // [h_g]
      ChelseaCache cache(cfg_, static_cast<int64_t>(heads.size()));
      cache.append(kv.keys.index_select(0, hi), kv.values.index_select(0, hi));
      cache.compress_to(b);
      const int64_t m = cache.size();
      out.keys.narrow(1, 0, m).index_copy_(0, hi, cache.keys());
      out.values.narrow(1, 0, m).index_copy_(0, hi, cache.values());
      out.bias.narrow(1, 0, m).index_copy_(0, hi, cache.degree().log());
    }
    return out;
  }

 private:
  // Every (layer, head) of the model that keeps the full cache: full_heads, full_layers, and the
  // top outlier_fraction of the calibrated scores (full layers counted inside the fraction).
  std::set<std::pair<int64_t, int64_t>> full_set(int64_t n_layers, int64_t h) const {
    std::set<std::pair<int64_t, int64_t>> full = full_heads_;
    for (int64_t l : full_layers_) {
      KVLAB_CHECK(l < n_layers, "chelsea: parameter 'full_layers' names layer {}, but the model has {}", l, n_layers);
      for (int64_t i = 0; i < h; ++i) full.insert({l, i});
    }
    for (const auto& [l, i] : full_heads_)
      KVLAB_CHECK(l < n_layers && i < h, "chelsea: parameter 'full_heads' names head {} of layer {}; the model has "
                  "{} layers of {} KV heads", i, l, n_layers, h);
    if (outlier_scores_.defined()) {
      KVLAB_CHECK(outlier_scores_.size(0) == n_layers && outlier_scores_.size(1) == h,
                  "chelsea: parameter 'outliers' ({}) holds scores of {} layers x {} KV heads, but this model has "
                  "{} x {}", outliers_path_, outlier_scores_.size(0), outlier_scores_.size(1), n_layers, h);
      const int64_t want = std::llround(outlier_fraction_ * static_cast<double>(n_layers * h));
      auto masked = outlier_scores_.clone();                                   // [L, H]
      for (const auto& [l, i] : full) masked[l][i] = -std::numeric_limits<double>::infinity();
      const int64_t extra = std::min<int64_t>(want - static_cast<int64_t>(full.size()), n_layers * h - full.size());
      if (extra > 0)
        for (const auto& [l, i] : chelsea_select_outlier_heads(masked, static_cast<double>(extra) / (n_layers * h)))
          full.insert({l, i});
    }
    return full;
  }

  // Per-head budgets of this layer: full heads keep n, the others share the rest so that the
  // total over the model (reallocate=model) or over the layer (reallocate=layer) stays B per head.
  std::vector<int64_t> head_budgets(const LayerKV& kv, int64_t budget) const {
    return head_budgets(kv.n_tokens(), kv.n_kv_heads(), kv.layer, std::max(kv.n_layers, kv.layer + 1), budget);
  }
  std::vector<int64_t> head_budgets(int64_t n, int64_t h, int64_t layer, int64_t n_layers, int64_t budget) const {
    std::vector<int64_t> out(h, budget);
    const auto full = full_set(n_layers, h);
    if (full.empty() || budget >= n) return out;
    const bool by_layer = reallocate_ == "layer";
    // The heads sharing the budget, in (layer, head) order, and this layer's rank among them.
    const int64_t l0 = by_layer ? layer : 0, l1 = by_layer ? layer + 1 : n_layers;
    int64_t n_full = 0, rank = 0;
    std::vector<int64_t> my_rank(h, -1);
    for (int64_t l = l0; l < l1; ++l)
      for (int64_t i = 0; i < h; ++i) {
        if (full.count({l, i})) {
          ++n_full;
          continue;
        }
        if (l == layer) my_rank[i] = rank;
        ++rank;
      }
    const int64_t all = (l1 - l0) * h, others = all - n_full, rest = all * budget - n_full * n;
    KVLAB_CHECK(others > 0, "chelsea: the full heads cover every KV head; the budget {} cannot be met", budget);
    KVLAB_CHECK(rest >= others, "chelsea: the full heads ({} of {}, n = {}) leave {} entries for the other {} heads "
                "at budget {} per head; name fewer full heads or raise the budget", n_full, all, n, rest, others,
                budget);
    const int64_t extra = rest % others;
    for (int64_t i = 0; i < h; ++i)
      out[i] = my_rank[i] < 0 ? n : rest / others + (my_rank[i] < extra ? 1 : 0);
    return out;
  }

  static at::Tensor read_outlier_scores(const std::string& path) {
    const nlohmann::json j = read_json_file(path);
    KVLAB_CHECK(j.is_object() && j.contains("scores") && j["scores"].is_array() && !j["scores"].empty(),
                "chelsea: parameter 'outliers' ({}) is not a 'kvlab calibrate chelsea' file (no \"scores\" array)",
                path);
    const auto& rows = j["scores"];
    const size_t h = rows[0].is_array() ? rows[0].size() : 0;
    auto t = at::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(h)}, at::kDouble);
    for (size_t l = 0; l < rows.size(); ++l) {
      KVLAB_CHECK(rows[l].is_array() && rows[l].size() == h && h > 0,
                  "chelsea: parameter 'outliers' ({}): scores row {} must hold {} numbers", path, l, h);
      for (size_t i = 0; i < h; ++i) {
        KVLAB_CHECK(rows[l][i].is_number() && std::isfinite(rows[l][i].get<double>()),
                    "chelsea: parameter 'outliers' ({}): scores[{}][{}] is not a finite number", path, l, i);
        t[l][i] = rows[l][i].get<double>();
      }
    }
    return t;
  }

  static std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) out.push_back(item);
    return out;
  }

  ChelseaConfig cfg_;
  std::set<std::pair<int64_t, int64_t>> full_heads_;
  std::set<int64_t> full_layers_;
  std::string outliers_path_, reallocate_;
  double outlier_fraction_ = 0.04;
  int64_t interval_ = 32;
  at::Tensor outlier_scores_;  // [L, H] float64, from `outliers`
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_chelsea(const nlohmann::json& params) {
  return std::make_unique<Chelsea>(params);
}

// Preset "paper" (Chelsea §7, App. B–C): n1 = 16 sinks, n2 = 64 recent, chunk c = 256, the r
// schedule of the model family (Table 7; llama2's unless `family` is given), and the top 4% outlier
// heads with the full cache from WikiText-2 calibration (App. B: threshold 0.8), the budget
// reallocated over the model. The outlier file is made by `kvlab calibrate chelsea`; the run
// refuses to start without it. The paper's B = R·(n + Γ) is a budget held through decoding; an
// end-to-end run states its own decode rule (generate/branches.h), which kvlab applies to every method.
MethodPreset paper_preset_chelsea() {
  return {{{"n_sink", 16}, {"n_recent", 64}, {"chunk", 256}, {"outlier_fraction", 0.04},
           {"outliers", "calibration/chelsea_outliers_{model}.json"}, {"reallocate", "model"}},
          0, 0, "Chelsea §7, App. B-C: 16 sinks, 64 recent, chunk 256, top 4% outlier heads full (WikiText-2)",
          "outliers",
          "kvlab calibrate chelsea --model {model} --text ../shared/data/wikitext2/wiki.test.raw "
          "--out calibration/chelsea_outliers_{model}.json"};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_chelsea() {
  CompressorInfo m;
  m.name = "chelsea";
  m.description =
      "chunked soft matching: merge similar keys into degree-weighted centroids (Chelsea)";
  m.make = make_chelsea;
  m.paper = paper_preset_chelsea;
  m.cost = {1.0, "Chelsea §5.2 Tab.1: n c d / 4",
            "Chelsea §5.2 Table 1: chunked soft matching's distance matrix costs n·c·d/4 for chunk size c (vs n²d/4 unchunked); c fixed -> O(n)"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
