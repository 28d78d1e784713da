// uniform, uniform-halving — the random-subset baselines of BalanceKV's single-layer study.
//
// Paper: Insu Han, Michael Kapralov, Ekaterina Kochetkova, Kshiteej Sheth, Amir Zandieh,
//   "BalanceKV: KV Cache Compression through Discrepancy Theory", arXiv:2502.07861, §4.1
//   ("independent uniform sampling ... sampling a 2^{-T} fraction of key and value embeddings
//   uniformly at random"); official code ksheth96/BalanceKV (src/single_layer_approx.ipynb runs
//   the same balanced walk with gamma = 0 as its uniform baseline).
//
// Summary. `uniform` keeps a uniformly random subset of `budget` tokens of the region, chosen
// independently per KV head, and gives each kept entry the bias log(n / budget) = log(1/ratio):
// each kept token stands for 1/ratio tokens, so the numerator and the denominator of softmax
// attention are unbiased estimates of their full-cache values. `uniform-halving` reaches the
// budget by T rounds, each keeping exactly ⌊m/2⌋ of the m survivors, bias T·log 2 — the shape of
// BalanceKV's estimator without its discrepancy-minimising signs. Default `selection=signs`
// follows the release: random ±1 signs (the first token +1, the rest fair coins) and BalanceKV's
// keep rule (c± = first index where the count of ±1 reaches ⌊m/2⌋, c = max(c−, c+); keep the
// minority sign before c, then fill from the tokens after c in order); `selection=permutation`
// keeps a uniformly random half instead.
//
// Parameters:
//   uniform:          reweight [true]  bias log(n/budget) on every entry (false: bias 0)
//   uniform-halving:  selection [signs] signs | permutation
//
// Deviations:
//   - uniform-halving: when the call gives a ratio or an entry count B instead of T halvings, T is
//     the smallest number of halvings with ⌊n/2^T⌋ <= B; when ⌊n/2^T⌋ < B, the last round halves
//     only the oldest 2(m - B) of the m survivors, so the head holds exactly B entries (equal
//     memory with the other methods); each entry's bias is log 2 times the rounds it went through.
//   - uniform-halving stops early when one token is left (⌊1/2⌋ = 0 would empty the head); its bias
//     is then log 2 times the rounds actually done.
//   - The release weights tokens kept from after c by ×1 and the minority before c by ×2; as
//     docs/methods.md §3 specifies, every entry here carries the uniform bias T·log 2.
//   - `selection=signs` is the release's rule and docs/methods.md §3's wording, but it is not uniform
//     over positions (token 0 always draws +1; the tokens after c fill in order): at n = 16, T = 1
//     some tokens are kept with probability ~0.2 or ~0.8 instead of 1/2 (test_baselines prints
//     it). The paper's "uniformly at random" baseline is `uniform` (or selection=permutation).
//   - Randomness: a std::mt19937_64 seeded with opt.seed, one stream over heads in order (the
//     release's torch.Generator stream is not reproduced).
#include <ATen/ATen.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kvlab/compress/preset.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// A uniform double in [0, 1) from 53 random bits (portable, unlike std::uniform_real_distribution).
double unit_uniform(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1.0p-53; }

// k distinct indices of [0, n) uniformly at random, ascending (partial Fisher–Yates).
std::vector<int64_t> random_subset(int64_t n, int64_t k, std::mt19937_64& gen) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  for (int64_t i = 0; i < k; ++i) {
    int64_t j = i + static_cast<int64_t>(gen() % static_cast<uint64_t>(n - i));
    std::swap(idx[i], idx[j]);
  }
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

class Uniform final : public Compressor {
 public:
  explicit Uniform(Params p) {
    reweight_ = p.get_bool("reweight", true);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "uniform"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    std::mt19937_64 gen(opt.seed);
    std::vector<std::vector<int64_t>> rows;
    for (int64_t h = 0; h < h_kv; ++h) rows.push_back(random_subset(n, b, gen));
    auto idx = detail::pad_index_rows(rows).to(kv.keys.device());        // [Hkv, b]
    CompressedKV out = gather_kept(kv, idx);
    if (reweight_) out.bias.fill_(std::log(static_cast<double>(n) / static_cast<double>(b)));
    return out;
  }

 private:
  bool reweight_ = true;
  nlohmann::json params_;
};

// One halving round over m survivors with the release's sign rule: positions (0..m-1) of the
// ⌊m/2⌋ tokens kept, ascending.
std::vector<int64_t> halve_by_signs(int64_t m, std::mt19937_64& gen) {
  const int64_t half = m / 2;
  std::vector<int> sign(static_cast<size_t>(m));
  sign[0] = 1;
  for (int64_t i = 1; i < m; ++i) sign[i] = unit_uniform(gen) < 0.5 ? 1 : -1;
  // c± = first index where the running count of ±1 reaches half (0 if it never does, as
  // torch.argmax of an all-false mask gives in the release).
  int64_t c_pos = 0, c_neg = 0, n_pos = 0, n_neg = 0;
  bool got_pos = false, got_neg = false;
  for (int64_t i = 0; i < m; ++i) {
    (sign[i] > 0 ? n_pos : n_neg) += 1;
    if (!got_pos && n_pos == half) c_pos = i, got_pos = true;
    if (!got_neg && n_neg == half) c_neg = i, got_neg = true;
  }
  const int64_t c = std::max(c_pos, c_neg);
  // Weights: +2 for the sign opposite to sign[c] at or before c, -2 for sign[c]'s, +1 after c;
  // keep the first `half` by descending weight, stable.
  std::vector<int64_t> keep;
  keep.reserve(static_cast<size_t>(half));
  for (int64_t i = 0; i <= c && static_cast<int64_t>(keep.size()) < half; ++i)
    if (sign[i] != sign[c]) keep.push_back(i);
  for (int64_t i = c + 1; i < m && static_cast<int64_t>(keep.size()) < half; ++i) keep.push_back(i);
  for (int64_t i = 0; i <= c && static_cast<int64_t>(keep.size()) < half; ++i)
    if (sign[i] == sign[c]) keep.push_back(i);
  std::sort(keep.begin(), keep.end());
  return keep;
}

class UniformHalving final : public Compressor {
 public:
  explicit UniformHalving(Params p) {
    selection_ = p.get_string("selection", "signs", {"signs", "permutation"});
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "uniform-halving"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    int halvings = opt.budget.is_halvings() ? opt.budget.halvings : -1;
    int64_t target = -1;  // a budget strictly between ⌊n/2^T⌋ and ⌊n/2^(T-1)⌋: a partial last round
    if (halvings < 0) {
      const int64_t b = resolve_budget(opt, n);
      halvings = 0;
      while ((n >> halvings) > b) ++halvings;
      if (halvings > 0 && (n >> halvings) < b) target = b;
    }
    if (halvings == 0 || n < 2) return keep_all(kv);
    std::mt19937_64 gen(opt.seed);
    std::vector<std::vector<int64_t>> rows;
    std::vector<std::vector<double>> log_w;  // per kept entry: (halvings it went through) · log 2
    for (int64_t h = 0; h < h_kv; ++h) {
      std::vector<int64_t> alive(static_cast<size_t>(n));                // region indices
      std::iota(alive.begin(), alive.end(), 0);
      std::vector<double> lw(static_cast<size_t>(n), 0.0);
      for (int t = 0; t < halvings && alive.size() >= 2; ++t) {
        const int64_t m = static_cast<int64_t>(alive.size());
        // The last round of a partial budget halves only the oldest 2(m - target) survivors.
        const bool partial = t == halvings - 1 && target >= 0;
        const int64_t m_sub = partial ? std::min<int64_t>(m, 2 * std::max<int64_t>(0, m - target)) : m;
        if (m_sub < 2) break;
        std::vector<int64_t> pick = selection_ == "signs" ? halve_by_signs(m_sub, gen)
                                                          : random_subset(m_sub, m_sub / 2, gen);
        std::vector<int64_t> next;
        std::vector<double> next_w;
        for (int64_t j : pick) next.push_back(alive[j]), next_w.push_back(lw[j] + std::log(2.0));
        for (int64_t j = m_sub; j < m; ++j) next.push_back(alive[j]), next_w.push_back(lw[j]);
        alive.swap(next);
        lw.swap(next_w);
      }
      rows.push_back(std::move(alive));
      log_w.push_back(std::move(lw));
    }
    auto idx = detail::pad_index_rows(rows).to(kv.keys.device());        // [Hkv, m]
    CompressedKV out = gather_kept(kv, idx);
    auto bias = out.bias.to(at::kCPU, at::kDouble).contiguous();           // [Hkv, m]: 0 or -inf
    auto ba = bias.accessor<double, 2>();
    for (int64_t h = 0; h < h_kv; ++h)
      for (size_t j = 0; j < log_w[h].size(); ++j) ba[h][j] = log_w[h][j];
    out.bias = bias.to(out.bias.options());
    return out;
  }

 private:
  std::string selection_;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_uniform(const nlohmann::json& params) {
  return std::make_unique<Uniform>(Params(params, "uniform"));
}

std::unique_ptr<Compressor> make_uniform_halving(const nlohmann::json& params) {
  return std::make_unique<UniformHalving>(Params(params, "uniform-halving"));
}

// Preset "paper": uniform sampling has no end-to-end experiment in the five papers (BalanceKV
// compares with uniform-halving only in its single-layer study, §4.1): its defaults.
MethodPreset paper_preset_uniform() {
  return {nlohmann::json::object(), 0, 0, "no end-to-end experiment in a paper: the defaults", "", ""};
}
MethodPreset paper_preset_uniform_halving() {
  return {nlohmann::json::object(), 0, 0, "BalanceKV §4.1's single-layer baseline; no end-to-end run: the defaults",
          "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_uniform() {
  CompressorInfo m;
  m.name = "uniform";
  m.description =
      "uniformly random subset per KV head, bias log(1/ratio)";
  m.make = make_uniform;
  m.paper = paper_preset_uniform;
  m.cost = {1.0, "known: random subset O(n)",
            "known cost: a random permutation / subset of n tokens, O(n) (docs/methods.md §3)"};
  return m;
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_uniform_halving() {
  CompressorInfo m;
  m.name = "uniform-halving";
  m.description =
      "T random halvings (BalanceKV's baseline), bias T log 2";
  m.make = make_uniform_halving;
  m.paper = paper_preset_uniform_halving;
  m.cost = {1.0, "known: T random halvings O(n)",
            "known cost: T rounds of random signs over the survivors, O(n) (BalanceKV §4.1's baseline)"};
  m.halving = true;
  return m;
}
}  // namespace kvlab
