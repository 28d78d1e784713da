// balancekv — BalanceKV's practical parallel version (§4), as released.
//
// Paper: Insu Han, Michael Kapralov, Ekaterina Kochetkova, Kshiteej Sheth, Amir Zandieh,
//   "BalanceKV: KV Cache Compression through Discrepancy Theory", arXiv:2502.07861.
//   Official code: github.com/ksheth96/BalanceKV (src/balanced_walk.py `balanced_walk`,
//   src/single_layer_approx.ipynb for the single-layer study, balancekv_press.py for LongBench).
//
// Summary. T halvings of the region. Each round re-blocks the current survivors, in order, into
// blocks of b tokens (the last one zero-padded), centres the keys by their block mean, and builds
// the kernel K_ij = exp(temp·⟨k̄_i,k̄_j⟩/√d)·(⟨ṽ_i,ṽ_j⟩ + 0.025) with ṽ = value × the token's
// accumulated weight. A self-balancing walk assigns signs sequentially inside every block (all
// blocks in parallel): the first token +1, then p_i = 0.5 − γ·Σ_{j<i} K_ij s_j (unclamped) and
// s_i = +1 iff U < p_i — tokens that look like the ones already signed get the opposite sign, so
// each sign class is a balanced half. The keep rule (balancekv.h `keep_rule`) keeps exactly ⌊n/2⌋
// tokens with round weight 2 or 1; weights multiply across rounds.
//
// Cost (issue 13; replay, n = 4096: ~25 ms per (layer, KV head), ~43x uniform). Each of the T
// rounds builds the b x b kernel of every block, O(n·b·d), and the self-balancing walk signs the
// tokens of a block one after another (p_i depends on every earlier sign): b sequential steps per
// round, batched over blocks as the release does. The walk's sequential signs are the method.
//
// Estimator. Default: each kept entry carries bias log(w), w its accumulated weight, in both the
// numerator and the denominator (docs/methods.md §3). `release_weights=true` gives the single-layer
// notebook's form: it repeats every kept key 2^T times (so log 2^T on every compressed logit, in
// the numerator and the denominator) and scales the kept values by w/2^T (numerator only). With
// the CompressedKV fields that is exactly: values × w/2^T, bias log 2^T — no separate denominator
// set is needed, because Σ e^{s+log 2^T}·v·w/2^T = Σ e^s·w·v and the denominator is Σ 2^T·e^s.
// (The numerator and the denominator then disagree for ×1 tokens; that is the release's estimator.)
// T is each entry's own number of halvings: with a budget between powers of two (below), the
// younger survivors went through one halving fewer and carry 2^(T−1), so Σ 2^T_i over the entries
// is the number of tokens they stand for (before the fix every entry got 2^T: replay rel_err 0.300
// instead of 0.141 at ratio 0.2, issue 21).
//
// Parameters:
//   T                [2]     halvings when the call gives no budget
//   block            [256]   b (LongBench runs use 128)
//   temp             [0.1]   single-layer study; LongBench uses 1.0
//   gamma            [4]     γ of the walk
//   value_offset     [0.025] the release's constant added to ⟨ṽ_i,ṽ_j⟩
//   release_weights  [false] see Estimator
//
// Budget. A budget of T halvings is used as T. Given a ratio or an entry count B instead, T is the
// smallest number of halvings with ⌊n/2^T⌋ ≤ B; when ⌊n/2^T⌋ < B (B between powers of two), the
// first T − 1 halvings run over every token and the last one over the oldest 2(m − B) of the m
// survivors only, so the head holds exactly B entries: methods are compared at equal memory. (A
// deviation: the paper compresses by 2^T only. The younger survivors keep weight 2^(T−1).)
// Halving stops when one token is left (⌊1/2⌋ = 0 would empty the head). T = 0 is the exact cache.
//
// Deviations:
//   - First/last tokens exact (the single-layer study's 256/256; the release's LongBench run 32 sink
//     + 32 recent): kept by the harness around the region (--keep-first/--keep-last, or the paper
//     preset's keep_first/keep_last = 32/32 below), inside the budget in end-to-end runs, not by
//     this method.
//   - The release's β (exp(... − β), 0 in every released run) is not a parameter; its query-kernel
//     variant (`balanced_walk(query=...)`, called by no released run) and its needle detection are
//     not implemented. Needle detection (main branch, run_needle_in_haystack.py → src/llama_forward.py
//     `manual_forward_llama_needle_detection`): layer 1's tokens whose raw keys have a negative mean
//     inner product with their block, dilated by ±25 tokens, are kept exactly, their mask reused
//     by every later layer; only the release's NIAH script turns it on. Its RULER runs (kvpress
//     branch, 9eb325d: run.py + balancekv_press.py, kvpress's pipeline, i.e. `--protocol context`)
//     call the walk without it, with sink 32, window 32, block 128, T = 2, temp 1, γ 4: this
//     file's paper preset.
//   - Randomness: ATen's CPU generator seeded with opt.seed, one at::rand call per round of shape
//     [n_kv_heads·blocks, b] (the release draws [batch, heads, blocks, b] on CUDA): same shape of
//     process, different random stream.
//   - Computation in the input dtype (the release mixes bf16 and fp32).
#include "kvlab/compress/preset.h"
#include "kvlab/compress/balancekv.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"

namespace kvlab {
namespace balancekv {

KeepRule keep_rule(const std::vector<int>& signs) {
  const int64_t m = static_cast<int64_t>(signs.size());
  const int64_t half = m / 2;
  KeepRule out;
  if (half == 0) return out;
  int64_t c_pos = 0, c_neg = 0, n_pos = 0, n_neg = 0;
  bool got_pos = false, got_neg = false;
  for (int64_t i = 0; i < m; ++i) {
    (signs[i] > 0 ? n_pos : n_neg) += 1;
    if (!got_pos && n_pos == half) c_pos = i, got_pos = true;
    if (!got_neg && n_neg == half) c_neg = i, got_neg = true;
  }
  const int64_t c = std::max(c_pos, c_neg);
  const int sc = signs[c];
  // Descending weight, stable: the +2 group (opposite to sign[c], at or before c), then the +1
  // group (after c), then the −2 group; only the first two are ever reached (they hold ≥ ⌊m/2⌋).
  for (int64_t i = 0; i <= c && static_cast<int64_t>(out.keep.size()) < half; ++i)
    if (signs[i] != sc) out.keep.push_back(i), out.weight.push_back(2);
  for (int64_t i = c + 1; i < m && static_cast<int64_t>(out.keep.size()) < half; ++i)
    out.keep.push_back(i), out.weight.push_back(1);
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(out.keep.size()) == half, "keep rule came up short");
  return out;
}

at::Tensor round_kernel(const at::Tensor& keys, const at::Tensor& values_w, double temp,
                        double value_offset) {
  const double d = static_cast<double>(keys.size(-1));
  auto kc = keys - keys.mean(1, /*keepdim=*/true);                       // [B, b, d]
  auto kk = at::matmul(kc, kc.transpose(1, 2));                          // [B, b, b]
  auto vv = at::matmul(values_w, values_w.transpose(1, 2));              // [B, b, b]
  return (kk * (temp / std::sqrt(d))).exp() * (vv + (1e-8 + value_offset));
}

namespace {
template <class T>
void walk_impl(const at::Tensor& kernel, const at::Tensor& u, double gamma, at::Tensor& signs) {
  const int64_t nb = kernel.size(0), b = kernel.size(1);
  const T* K = kernel.data_ptr<T>();   // [B, b, b]
  const T* U = u.data_ptr<T>();        // [B, b]
  int8_t* S = signs.data_ptr<int8_t>();  // [B, b]
  for (int64_t blk = 0; blk < nb; ++blk) {
    const T* Kb = K + blk * b * b;
    int8_t* s = S + blk * b;
    s[0] = 1;
    for (int64_t i = 1; i < b; ++i) {
      const T* row = Kb + i * b;
      T acc = 0;
      for (int64_t j = 0; j < i; ++j) acc += row[j] * static_cast<T>(s[j]);
      const T p = static_cast<T>(0.5) - static_cast<T>(gamma) * acc;
      s[i] = U[blk * b + i] < p ? 1 : -1;
    }
  }
}
}  // namespace

at::Tensor walk_signs(const at::Tensor& kernel, const at::Tensor& u, double gamma) {
  auto kc = kernel.to(at::kCPU).contiguous();                            // [B, b, b]
  auto uc = u.to(at::kCPU).to(kc.scalar_type()).contiguous();            // [B, b]
  auto signs = at::empty({kc.size(0), kc.size(1)}, at::TensorOptions().dtype(at::kChar));  // [B, b]
  if (kc.scalar_type() == at::kDouble) walk_impl<double>(kc, uc, gamma, signs);
  else walk_impl<float>(kc.to(at::kFloat), uc.to(at::kFloat), gamma, signs);
  return signs;
}

HalvingResult halve(const at::Tensor& keys, const at::Tensor& values, const HalvingOptions& opt,
                    at::Generator& gen) {
  return halve(keys, values, opt,
               [&gen](int /*round*/, at::IntArrayRef shape, const at::TensorOptions& options) {
                 return at::rand(shape, gen, options);
               });
}

HalvingResult halve(const at::Tensor& keys, const at::Tensor& values, const HalvingOptions& opt,
                    const UniformSource& uniforms) {
  const int64_t h = keys.size(0), n = keys.size(1), d = keys.size(2), dv = values.size(2);
  const int64_t b = opt.block;
  auto lopt = at::TensorOptions().dtype(at::kLong);
  HalvingResult res;
  res.idx = at::arange(n, lopt).unsqueeze(0).expand({h, n}).contiguous();   // [H, m]
  res.weight = at::ones({h, n}, at::TensorOptions().dtype(at::kDouble));    // [H, m]
  auto kcpu = keys.to(at::kCPU), vcpu = values.to(at::kCPU);
  for (int t = 0; t < opt.halvings; ++t) {
    const int64_t m = res.idx.size(1);
    if (m < 2) break;
    const int64_t nb = (m + b - 1) / b, pad = nb * b - m;
    auto gi = res.idx.unsqueeze(-1);                                         // [H, m, 1]
    auto k = kcpu.gather(1, gi.expand({h, m, d}));                           // [H, m, d]
    auto v = vcpu.gather(1, gi.expand({h, m, dv})) *
             res.weight.to(vcpu.scalar_type()).unsqueeze(-1);                // [H, m, dv]  ṽ
    k = at::constant_pad_nd(k, {0, 0, 0, pad}).view({h * nb, b, d});         // [H·nb, b, d]
    v = at::constant_pad_nd(v, {0, 0, 0, pad}).view({h * nb, b, dv});        // [H·nb, b, dv]
    auto ker = round_kernel(k, v, opt.temp, opt.value_offset);               // [H·nb, b, b]
    auto u = uniforms(t, {h * nb, b}, ker.options());                        // [H·nb, b]
    TORCH_CHECK(u.dim() == 2 && u.size(0) == h * nb && u.size(1) == b,
                "balancekv::halve: round ", t, " uniforms must be [", h * nb, ", ", b, "], got ",
                u.sizes());
    auto signs = walk_signs(ker, u, opt.gamma).view({h, nb * b});            // [H, nb·b] int8
    const int64_t half = m / 2;
    auto pos = at::empty({h, half}, lopt);                                   // [H, m/2]
    auto rw = at::empty({h, half}, at::TensorOptions().dtype(at::kDouble));  // [H, m/2]
    auto pa = pos.accessor<int64_t, 2>();
    auto wa = rw.accessor<double, 2>();
    for (int64_t hh = 0; hh < h; ++hh) {
      const int8_t* s = signs.data_ptr<int8_t>() + hh * nb * b;
      KeepRule kr = keep_rule(std::vector<int>(s, s + m));                   // padding dropped
      for (int64_t i = 0; i < half; ++i) pa[hh][i] = kr.keep[i], wa[hh][i] = kr.weight[i];
    }
    res.idx = res.idx.gather(1, pos);                                        // [H, m/2]
    res.weight = res.weight.gather(1, pos) * rw;                             // [H, m/2]
    res.round_idx.push_back(res.idx);
    res.round_weight.push_back(rw);
    res.rounds = t + 1;
  }
  return res;
}

}  // namespace balancekv

namespace {

class BalanceKV final : public Compressor {
 public:
  explicit BalanceKV(Params p) {
    default_T_ = static_cast<int>(p.get_int("T", 2));
    hopt_.block = p.get_int("block", 256);
    hopt_.temp = p.get_double("temp", 0.1);
    hopt_.gamma = p.get_double("gamma", 4.0);
    hopt_.value_offset = p.get_double("value_offset", 0.025);
    release_weights_ = p.get_bool("release_weights", false);
    KVLAB_CHECK(default_T_ >= 0 && default_T_ < 63, "balancekv: parameter 'T' must be in [0, 62], got {}",
                default_T_);
    KVLAB_CHECK(hopt_.block >= 1, "balancekv: parameter 'block' must be >= 1, got {}", hopt_.block);
    KVLAB_CHECK(std::isfinite(hopt_.temp), "balancekv: parameter 'temp' must be finite, got {}", hopt_.temp);
    KVLAB_CHECK(hopt_.gamma >= 0 && std::isfinite(hopt_.gamma),
                "balancekv: parameter 'gamma' must be >= 0, got {}", hopt_.gamma);
    KVLAB_CHECK(hopt_.value_offset >= 0, "balancekv: parameter 'value_offset' must be >= 0, got {}",
                hopt_.value_offset);
    params_ = p.effective();
    p.finish();
  }
  std::string name() const override { return "balancekv"; }
  nlohmann::json params() const override { return params_; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens();
    int T = default_T_;
    int64_t target = -1;  // a budget strictly between ⌊n/2^T⌋ and ⌊n/2^(T-1)⌋ (see "Budget")
    if (opt.budget.is_halvings()) {
      T = opt.budget.halvings;
    } else if (opt.budget.is_set()) {
      const int64_t budget = resolve_budget(opt, n);
      T = 0;
      while ((n >> T) > budget && T < 62) ++T;
      if (T > 0 && (n >> T) < budget) target = budget;
    }
    if (T == 0 || n < 2) return keep_all(kv);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    balancekv::HalvingOptions ho = hopt_;
    ho.halvings = target < 0 ? T : T - 1;
    balancekv::HalvingResult r = balancekv::halve(kv.keys, kv.values, ho, gen);
    at::Tensor idx = r.idx, weight = r.weight;                               // [H, m] (CPU)
    const int64_t m = idx.size(1);
    // Halvings each entry went through (the release's 2^T is per entry: a younger survivor of a
    // partial last round went through one fewer).
    at::Tensor rounds = at::full({kv.n_kv_heads(), m}, double(r.rounds), at::TensorOptions().dtype(at::kDouble));
    if (target >= 0 && m > target) {
      // The last halving runs over the oldest 2(m - target) survivors only: m - target of them
      // stay, with the m - 2(m - target) younger survivors the head holds exactly `target`.
      const int64_t m_sub = 2 * (m - target);
      auto sub_idx = idx.narrow(1, 0, m_sub), sub_w = weight.narrow(1, 0, m_sub);  // [H, m_sub]
      auto gi = sub_idx.to(kv.keys.device()).unsqueeze(-1);
      auto k = kv.keys.gather(1, gi.expand({kv.n_kv_heads(), m_sub, kv.keys.size(2)}));
      auto v = kv.values.gather(1, gi.expand({kv.n_kv_heads(), m_sub, kv.values.size(2)})) *
               sub_w.to(kv.values.options()).unsqueeze(-1);                // ṽ = value × weight
      ho.halvings = 1;
      balancekv::HalvingResult last = balancekv::halve(k, v, ho, gen);      // [H, m - target]
      idx = at::cat({sub_idx.gather(1, last.idx), idx.narrow(1, m_sub, m - m_sub)}, 1);
      weight = at::cat({sub_w.gather(1, last.idx) * last.weight, weight.narrow(1, m_sub, m - m_sub)}, 1);
      rounds = at::cat({rounds.narrow(1, 0, m - target) + double(last.rounds), rounds.narrow(1, m_sub, m - m_sub)}, 1);
    }
    CompressedKV out = gather_kept(kv, idx.to(kv.keys.device()));
    if (!release_weights_) {
      out.bias = weight.log().to(kv.keys.options());                         // [H, m] log w
    } else {
      const at::Tensor two_t = at::exp2(rounds);                             // [H, m] 2^T_i
      out.values = out.values * (weight / two_t).to(kv.values.options()).unsqueeze(-1);
      out.bias = (rounds * std::log(2.0)).to(kv.keys.options());             // [H, m] log 2^T_i
    }
    return out;
  }

 private:
  int default_T_ = 2;
  balancekv::HalvingOptions hopt_;
  bool release_weights_ = false;
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_balancekv(const nlohmann::json& params) {
  return std::make_unique<BalanceKV>(Params(params, "balancekv"));
}

// Preset "paper": the release's LongBench run (ksheth96/BalanceKV run_longbench.py and
// balancekv_press.py; docs/methods.md §3): 32 sink + 32 recent tokens exact (harness-kept, inside the
// budget), T = 2, block 128, temp 1.0, γ 4, the release's estimator weights off (kvlab's per-entry
// log w; see Estimator). The sinks matter: without them the walk's first-token-is-+1 rule drops
// or reweights the attention sink (issue 21: replay rel_err 0.494 -> 0.141 with 32 sinks).
MethodPreset paper_preset_balancekv() {
  return {{{"T", 2}, {"block", 128}, {"temp", 1.0}, {"gamma", 4.0}},
          32, 32, "BalanceKV release run_longbench.py: 32 sinks + 32 recent exact, T 2, block 128, temp 1, gamma 4",
          "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_balancekv() {
  CompressorInfo m;
  m.name = "balancekv";
  m.description =
      "T discrepancy halvings by a self-balancing walk, bias log w (BalanceKV, practical)";
  m.make = make_balancekv;
  m.paper = paper_preset_balancekv;
  m.cost = {1.0, "BalanceKV §4+Thm 3.2: O(n b d)/halving",
            "BalanceKV §4.1 (SoftmaxBalance run in parallel on blocks of b) with Theorem 3.2 (SoftmaxBalance on m points: O((d+s)m²)): O(n·b·(d+s)) per halving, geometric over T; derived, the paper states no total"};
  m.halving = true;
  return m;
}
}  // namespace kvlab
