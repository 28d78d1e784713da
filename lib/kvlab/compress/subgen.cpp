// subgen — SubGen's Algorithm 1 as written: online key clustering + ℓ2 value sampling.
//
// Paper: Amir Zandieh, Insu Han, Vahab Mirrokni, Amin Karbasi, "SubGen: Token Generation in
//   Sublinear Time and Memory", arXiv:2402.06082 (Algorithm 1, Lemmas 1–2 = ClusterGen's
//   Lemmas 2.2–2.3, Theorem 1). No public code.
//
// Summary. The stream's keys are clustered online: a key joins the nearest cluster representative
// within δ, else opens a new cluster (UpdateSoftmaxNormalizer). Each cluster keeps its count n_i
// and t reservoir samples, each slot an independent uniform sample of the cluster (Lemma 2.3).
// Separately, s slots each hold an independent sample of the (k, v) pairs with probability
// ∝ ‖v‖² (UpdateMatrixProduct, Lemma 2.2), and µ = Σ‖v‖². The estimator (QueryStreamAttn) is
//   z/τ,  z = Σ_{(k,v)∈M} µ/(s‖v‖²)·e^{⟨q,k⟩/√d}·v,   τ = Σ_i n_i/t·Σ_{k∈S_i} e^{⟨q,k⟩/√d}
// with the 1/√d softmax scaling the paper folds into q. In kvlab's compressed form that is a
// numerator set (the s samples, bias log(µ/(s‖v‖²))) and a separate denominator set (the m·t
// cluster samples, bias log(n_i/t)). The streaming state lives in subgen.h (`SubGenState`);
// compress() appends the region's tokens to it one by one.
//
// Cost (issue 13; replay, n = 4096: ~31 ms per (layer, KV head), ~55x uniform). Algorithm 1 is a
// streaming algorithm: each key is compared with the m cluster representatives so far (O(m·d))
// and updates reservoirs, one token after another, because whether a key opens a cluster depends
// on every earlier key. n dependent steps are the paper's design, not an implementation choice.
//
// Parameters:
//   t             [8]    samples per cluster (Theorem 1: t = Ω(ε⁻²e^{2δr} log n))
//   s             [0]    value samples; 0 = budget − m·t (the rest of the budget)
//   delta         [0]    cluster radius δ; 0 = chosen per head from the budget (below)
//   den_fraction  [0.5]  share of the budget the denominator (m·t entries) may take when δ is auto
//
// Budget → (s, t, δ). Memory = s + m·t entries (numerator + denominator; mean_memory_entries
// counts both), the paper's O(d(mt + s)). Per KV head: D = max(1, ⌊den_fraction·B⌋) (at most
// B − 1), t_eff = min(t, D); δ = the smallest radius (bisection, 0.1% relative) whose online
// clustering of the head's keys has m ≤ D/t_eff clusters (the finest clustering that fits);
// s = B − m·t_eff. So every head uses exactly B entries. An explicit `delta` or `s` is used as
// given and then the memory is whatever it implies (an explicit δ whose m·t leaves no room for
// s ≥ 1 is an error naming 'delta'). Budget ≥ n returns the exact cache.
//
// Deviations:
//   - The budget mapping above is kvlab's (the paper sets s, t, δ from ε and the data).
//   - Samples are stored as written: a singleton cluster holds t copies of its key and M may hold
//     the same token several times (duplicates count as memory); merging duplicates would give
//     the same estimator in fewer entries.
//   - Distances and weights are computed in float64; kept keys/values are the input's.
//   - If µ + ‖v‖² = 0 (all values so far zero) the M slots take the token (p = 1, as for the
//     first token); entries with ‖v‖ = 0 get weight 0 (bias −inf) in the numerator.
//   - Randomness: one std::mt19937_64 per KV head seeded with (opt.seed, head); coins are
//     uniform doubles from 53 random bits.
//   - kept_idx is left undefined: the numerator is a sample with replacement, not a subset.
#include "kvlab/compress/preset.h"
#include "kvlab/compress/subgen.h"

#include <ATen/ATen.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/window_stream.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace subgen {

int64_t LeaderClustering::assign(const double* k) {
  const int64_t m = size();
  int64_t best = -1;
  double best_d2 = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < m; ++i) {
    const double* r = reps_.data() + i * d_;
    double s = 0;
    for (int64_t j = 0; j < d_; ++j) {
      const double diff = k[j] - r[j];
      s += diff * diff;
    }
    if (s < best_d2) best_d2 = s, best = i;  // arg min, first index on ties
  }
  if (best >= 0 && best_d2 <= delta2_) return best;
  reps_.insert(reps_.end(), k, k + d_);
  return m;
}

SubGenState::SubGenState(int64_t d, double delta, int64_t s, int64_t t, uint64_t seed,
                         uint64_t stream)
    : s_(s), t_(t), lc_(d, delta), m_(static_cast<size_t>(s), -1), m_vnorm2_(static_cast<size_t>(s), 0) {
  std::seed_seq seq{seed, stream};
  gen_.seed(seq);
}

double SubGenState::uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

void SubGenState::append(const double* k, const double* v, int64_t dv) {
  const int64_t id = n_++;
  // UpdateSoftmaxNormalizer.
  const int64_t c = lc_.assign(k);
  if (c == static_cast<int64_t>(clusters_.size())) {
    clusters_.push_back({id, 1, std::vector<int64_t>(static_cast<size_t>(t_), id)});
  } else {
    Cluster& cl = clusters_[c];
    cl.count += 1;
    const double p = 1.0 / static_cast<double>(cl.count);
    for (auto& slot : cl.samples)
      if (uniform() < p) slot = id;
  }
  // UpdateMatrixProduct, then µ += ‖v‖².
  double v2 = 0;
  for (int64_t j = 0; j < dv; ++j) v2 += v[j] * v[j];
  const double p = mu_ + v2 > 0 ? v2 / (mu_ + v2) : 1.0;
  for (int64_t i = 0; i < s_; ++i)
    if (uniform() < p) m_[i] = id, m_vnorm2_[i] = v2;
  mu_ += v2;
}

std::vector<std::pair<int64_t, double>> SubGenState::numerator() const {
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t i = 0; i < s_; ++i) {
    if (m_[i] < 0) continue;
    const double w = m_vnorm2_[i] > 0 ? std::log(mu_ / (static_cast<double>(s_) * m_vnorm2_[i]))
                                      : -std::numeric_limits<double>::infinity();
    out.emplace_back(m_[i], w);
  }
  return out;
}

std::vector<std::pair<int64_t, double>> SubGenState::denominator() const {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& cl : clusters_) {
    const double w = std::log(static_cast<double>(cl.count) / static_cast<double>(t_));
    for (int64_t id : cl.samples) out.emplace_back(id, w);
  }
  return out;
}

}  // namespace subgen

namespace {

// Clusters of the online pass over keys [n, d] at radius delta, counting stops above m_max.
int64_t count_clusters(const double* k, int64_t n, int64_t d, double delta, int64_t m_max) {
  subgen::LeaderClustering lc(d, delta);
  for (int64_t i = 0; i < n; ++i) {
    lc.assign(k + i * d);
    if (lc.size() > m_max) return lc.size();
  }
  return lc.size();
}

// The smallest delta (bisection to 0.1% relative) with at most m_max clusters.
double auto_delta(const double* k, int64_t n, int64_t d, int64_t m_max) {
  if (count_clusters(k, n, d, 0.0, m_max) <= m_max) return 0.0;
  double hi = 0;  // every key within hi of the first: one cluster
  for (int64_t i = 1; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < d; ++j) s += (k[i * d + j] - k[j]) * (k[i * d + j] - k[j]);
    hi = std::max(hi, std::sqrt(s));
  }
  double lo = 0;
  for (int it = 0; it < 40 && hi - lo > 1e-3 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (count_clusters(k, n, d, mid, m_max) <= m_max) hi = mid;
    else lo = mid;
  }
  return hi;
}

// One layer of SubGen while decoding (stream.h): a SubGenState per KV head and the keys and values
// of the tokens it references (cluster samples, value samples); a token no sample refers to any
// more is dropped. Every decoded token is appended to the state when pushed (Alg. 1 processes
// (k_i, v_i) before q_i); the numerator and denominator sets are rebuilt from the state each step.
// All entries are visible to every later query (pos -1).
class SubGenStream final : public LayerStream {
 public:
  SubGenStream(std::vector<subgen::SubGenState> states, const LayerKV& kv, const at::Tensor& kc, const at::Tensor& vc)
      : states_(std::move(states)), store_(states_.size()), n_seen_(kv.n_tokens()), d_(kv.keys.size(2)),
        dv_(kv.values.size(2)), opts_(kv.keys.options()) {
    const int64_t n = kv.n_tokens();
    for (size_t h = 0; h < states_.size(); ++h) {
      const double* kh = kc.data_ptr<double>() + int64_t(h) * n * d_;
      const double* vh = vc.data_ptr<double>() + int64_t(h) * n * dv_;
      for (int64_t i = 0; i < n; ++i) add(h, kh + i * d_, vh + i * dv_);
      collect(h);
    }
    rebuild();
  }
  void push(const at::Tensor& k, const at::Tensor& v, int64_t) override {
    KVLAB_CHECK(k.size(1) == 1, "subgen: decoding pushes one token per step, got {}", k.size(1));
    auto kc = k.to(at::kCPU, at::kDouble).contiguous(), vc = v.to(at::kCPU, at::kDouble).contiguous();
    for (size_t h = 0; h < states_.size(); ++h) {
      add(h, kc.data_ptr<double>() + int64_t(h) * d_, vc.data_ptr<double>() + int64_t(h) * dv_);
      collect(h);
    }
    ++n_seen_;
    rebuild();
  }
  void settle(const at::Tensor&, const at::Tensor&) override {}
  const KVSet& held() const override { return num_; }
  const KVSet* den() const override { return &den_; }
  int64_t n_seen() const override { return n_seen_; }

 private:
  void add(size_t h, const double* k, const double* v) {
    const int64_t id = states_[h].n_tokens();
    states_[h].append(k, v, dv_);
    std::vector<double> row(k, k + d_);
    row.insert(row.end(), v, v + dv_);
    store_[h].emplace(id, std::move(row));
  }
  // Drops the tokens no sample of head h refers to.
  void collect(size_t h) {
    std::unordered_set<int64_t> used;
    for (const auto& [id, w] : states_[h].numerator()) used.insert(id);
    for (const auto& [id, w] : states_[h].denominator()) used.insert(id);
    for (auto it = store_[h].begin(); it != store_[h].end();)
      it = used.count(it->first) ? std::next(it) : store_[h].erase(it);
  }
  // One set from (id, log-weight) lists per head (padded_entry_set).
  KVSet build(const std::vector<std::vector<std::pair<int64_t, double>>>& lists, bool with_values) const {
    std::vector<std::vector<EntryRow>> heads(lists.size());
    for (size_t i = 0; i < lists.size(); ++i)
      for (const auto& [id, w] : lists[i]) {
        const auto& row = store_[i].at(id);  // [k | v]
        heads[i].push_back({row.data(), row.data() + d_, w});
      }
    return padded_entry_set(heads, d_, dv_, with_values, opts_);
  }
  void rebuild() {
    std::vector<std::vector<std::pair<int64_t, double>>> num, den;
    for (const auto& st : states_) num.push_back(st.numerator()), den.push_back(st.denominator());
    num_ = build(num, true);
    den_ = build(den, false);
  }

  std::vector<subgen::SubGenState> states_;
  std::vector<std::unordered_map<int64_t, std::vector<double>>> store_;  // per head: id -> [k | v]
  int64_t n_seen_, d_, dv_;
  at::TensorOptions opts_;
  KVSet num_, den_;
};

class SubGen final : public Compressor {
 public:
  explicit SubGen(Params p) {
    t_ = p.get_int("t", 8);
    s_ = p.get_int("s", 0);
    delta_ = p.get_double("delta", 0.0);
    den_fraction_ = p.get_double("den_fraction", 0.5);
    KVLAB_CHECK(t_ >= 1, "subgen: parameter 't' must be >= 1, got {}", t_);
    KVLAB_CHECK(s_ >= 0, "subgen: parameter 's' must be >= 0 (0 = from the budget), got {}", s_);
    KVLAB_CHECK(delta_ >= 0 && std::isfinite(delta_),
                "subgen: parameter 'delta' must be >= 0 (0 = from the budget), got {}", delta_);
    KVLAB_CHECK(den_fraction_ > 0 && den_fraction_ < 1,
                "subgen: parameter 'den_fraction' must be in (0, 1), got {}", den_fraction_);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "subgen"; }

  // The state of KV head h for a budget of `budget` entries: t, delta (from the region's keys
  // [n, d] unless given) and s (the rest of the budget unless given), as Alg. 1 is run in replay.
  subgen::SubGenState make_state(const double* kh, int64_t n, int64_t d, int64_t budget, uint64_t seed,
                                 int64_t h) const {
    const int64_t den_budget =
        std::max<int64_t>(1, std::min<int64_t>(budget - 1, static_cast<int64_t>(den_fraction_ * budget)));
    const int64_t t = std::min(t_, den_budget);
    const double delta = delta_ > 0 ? delta_ : auto_delta(kh, n, d, den_budget / t);
    int64_t s = s_;
    if (s == 0) {
      const int64_t m = count_clusters(kh, n, d, delta, std::numeric_limits<int64_t>::max());
      KVLAB_CHECK(m * t < budget, "subgen: parameter 'delta'={} gives {} clusters on KV head {}; "
                  "m·t = {} leaves no room for value samples in a budget of {} (raise delta or "
                  "lower t)", delta, m, h, m * t, budget);
      s = budget - m * t;
    }
    return subgen::SubGenState(d, delta, s, t, seed, static_cast<uint64_t>(h));
  }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), d = kv.keys.size(2);
    const int64_t dv = kv.values.size(2);
    const int64_t budget = resolve_budget(opt, n);
    if (budget >= n || n == 0) return keep_all(kv);
    auto kc = kv.keys.to(at::kCPU).to(at::kDouble).contiguous();     // [H, n, d]
    auto vc = kv.values.to(at::kCPU).to(at::kDouble).contiguous();   // [H, n, dv]
    std::vector<std::vector<std::pair<int64_t, double>>> num(h_kv), den(h_kv);
    int64_t max_num = 1, max_den = 1;
    for (int64_t h = 0; h < h_kv; ++h) {
      const double* kh = kc.data_ptr<double>() + h * n * d;
      const double* vh = vc.data_ptr<double>() + h * n * dv;
      subgen::SubGenState st = make_state(kh, n, d, budget, opt.seed, h);
      for (int64_t i = 0; i < n; ++i) st.append(kh + i * d, vh + i * dv, dv);
      num[h] = st.numerator();
      den[h] = st.denominator();
      max_num = std::max<int64_t>(max_num, num[h].size());
      max_den = std::max<int64_t>(max_den, den[h].size());
    }

    const double ninf = -std::numeric_limits<double>::infinity();
    auto lopt = at::TensorOptions().dtype(at::kLong);
    auto nidx = at::full({h_kv, max_num}, -1, lopt), didx = at::full({h_kv, max_den}, -1, lopt);
    auto nb = at::full({h_kv, max_num}, ninf, at::kDouble), db = at::full({h_kv, max_den}, ninf, at::kDouble);
    auto nia = nidx.accessor<int64_t, 2>(), dia = didx.accessor<int64_t, 2>();
    auto nba = nb.accessor<double, 2>(), dba = db.accessor<double, 2>();
    for (int64_t h = 0; h < h_kv; ++h) {
      for (size_t a = 0; a < num[h].size(); ++a) nia[h][a] = num[h][a].first, nba[h][a] = num[h][a].second;
      for (size_t a = 0; a < den[h].size(); ++a) dia[h][a] = den[h][a].first, dba[h][a] = den[h][a].second;
    }
    auto dev = kv.keys.device();
    CompressedKV out = gather_kept(kv, nidx.to(dev));                              // [H, max_num]
    out.bias = nb.to(kv.keys.options());
    out.kept_idx = at::Tensor();  // a sample with replacement, not a subset
    CompressedKV dset = gather_kept(kv, didx.to(dev));                             // [H, max_den]
    out.den_keys = dset.keys.masked_fill(didx.to(dev).lt(0).unsqueeze(-1), 0.0);
    out.den_bias = db.to(kv.keys.options());
    return out;
  }

  // Generation: the region streamed into the state as compress() does, then every decoded token
  // (s, t and delta fixed from the prefill; the clusters keep opening as the keys require). A ratio
  // that keeps the whole region (ratio 1) keeps the cache exact.
  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), d = kv.keys.size(2);
    const bool entries = opt.budget.kind == Budget::Kind::entries;
    const int64_t budget = entries ? opt.budget.entries : opt.budget.entries_for(n);
    if (!entries && budget >= n) return start_window_stream(kv, opt.budget, 0);
    KVLAB_CHECK(n > 0 || (delta_ > 0 && s_ > 0), "subgen: a cache streamed from the first token needs parameters "
                "'delta' and 's' (they are chosen from the prompt otherwise)");
    auto kc = kv.keys.to(at::kCPU).to(at::kDouble).contiguous();     // [H, n, d]
    auto vc = kv.values.to(at::kCPU).to(at::kDouble).contiguous();   // [H, n, dv]
    std::vector<subgen::SubGenState> states;
    for (int64_t h = 0; h < h_kv; ++h) {
      const double* kh = kc.data_ptr<double>() + h * n * d;
      states.push_back(make_state(kh, n, d, budget, opt.seed, h));
    }
    return std::make_unique<SubGenStream>(std::move(states), kv, kc, vc);
  }

 private:
  int64_t t_ = 8, s_ = 0;
  double delta_ = 0, den_fraction_ = 0.5;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_subgen(const nlohmann::json& params) {
  return std::make_unique<SubGen>(Params(params, "subgen"));
}

// Preset "paper": SubGen's Algorithm 1 has no end-to-end run of its own (the experiments of §4 run
// the k-center variant, kvlab's clustergen): its defaults.
MethodPreset paper_preset_subgen() {
  return {nlohmann::json::object(), 0, 0, "no end-to-end run of Algorithm 1 (§4 runs clustergen): the defaults",
          "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_subgen() {
  CompressorInfo m;
  m.name = "subgen";
  m.description =
      "online key clusters + l2 value samples, separate num/den sets (SubGen Alg. 1)";
  m.make = make_subgen;
  m.paper = paper_preset_subgen;
  m.cost = {1.0, "SubGen Thm 1: O(d(mt+s))/token; =n² if mt+s∝n",
            "SubGen §2.4 Theorem 1: runtime O(d·(m·t + s)) per stream step, so O(n·d·(m·t+s)) for n tokens, sublinear per step when m = n^(1-Ω(1)) (Corollary 1); kvlab sets m·t + s = budget ∝ n at a fixed ratio (and bisects δ), for which the same bound gives n²"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
