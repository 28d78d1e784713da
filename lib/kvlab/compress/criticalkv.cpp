// criticalkv — a scorer's choice refined by how much each value moves the layer's output, ‖W_o v‖₁.
//
// Paper: Yuan Feng, Junlin Lv, Yukun Cao, Xike Xie, S. Kevin Zhou, "Identify Critical KV Cache in
//   LLM Inference from an Output Perturbation Perspective", arXiv:2502.03805 (2025). Checked against
//   NVIDIA kvpress 0.5.5 `CriticalKVPress` (kvpress/presses/criticalkv_press.py), which wraps any
//   ScorerPress.
//
// Summary. An entry's attention weight alone does not say how much dropping it perturbs the
// output: that also scales with its value after the output projection. With a budget of b entries
// per KV head and a per-head top-k scorer (`scorer`, as adakv takes: the methods with
// Compressor::keep_scores):
//   stage 1  the scorer's ⌊first_stage_ratio · b⌋ best (at least 1) are kept outright;
//   stage 2  every score becomes (s + ε) · ‖W_o v‖₁, where for each query head h the value is
//            projected by its slice of W_o, W_o[:, h·d : (h+1)·d] v, the L1 norm taken over the hidden
//            dimension and averaged over the query heads of the KV head; the rest of the budget goes
//            to the best of those.
//
//   scores    [Hkv, n] float64 from the scorer (+inf = always kept)
//   out_proj  [hidden, Hq·d] the context's out_proj, the layer's W_o
//   wov       [Hkv, n] mean over the group of ‖W_o,h v_j‖₁
//
// Parameters: scorer [snapkv], epsilon [1e-4], first_stage_ratio [0.5]; every other parameter is the
//   scorer's own (e.g. `--param criticalkv.window=32`), checked by the scorer.
//
// criticaladakv (the paper's CriticalAdaKV; kvpress `CriticalAdaKVPress`): the layer's H·b entries
// are first shared across its KV heads as adakv shares them (each head its ⌊α·b⌋ best, at least 1,
// then the best across heads: head h gets B_h), then each head runs the two stages above on its own
// budget B_h: stage 1 keeps its max(⌊first_stage_ratio · B_h⌋, safeguard) best scores (kvpress
// raises the safeguarded entries to the float maximum, so they survive both stages), stage 2 the
// best of (s + ε)·‖W_o v‖₁ for the rest. Parameters: criticalkv's and alpha_safeguard [0.2].
//
// Deviations and notes:
//   - Needs the layer's W_o, which generation and the task commands pass (the model's wo); replay
//     refuses it, since captures hold no weights.
//   - Stage 1's count: kvpress takes int((1 − compression_ratio) · n · first_stage_ratio); kvlab
//     takes ⌊ratio · n · first_stage_ratio⌋ for a --ratio budget (the same) and
//     ⌊first_stage_ratio · b⌋ for an entry budget.
//   - kvpress warns that expected_attention should run with use_vnorm=false under criticalkv (‖v‖
//     would be counted twice); kvlab leaves that to the user, as kvpress does.
//   - Ties go to the lower index (torch.topk leaves them unspecified). Prefill-only, as kvpress.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// values [Hkv, n, d], out_proj [hidden, Hq·d] -> [Hkv, n]: per query head h the L1 norm of
// W_o[:, h·d:(h+1)·d] v_j, averaged over the query heads of each KV head.
// The query heads are W_o's columns / d (the region may come without queries).
at::Tensor projected_value_norms(const at::Tensor& values, const at::Tensor& out_proj) {
  const int64_t h_kv = values.size(0), n = values.size(1), d = values.size(2);
  KVLAB_CHECK(out_proj.dim() == 2 && out_proj.size(1) % (h_kv * d) == 0,
              "criticalkv: the output projection is {}, expected [hidden, Hq * {}] with Hq a multiple of the {} KV "
              "heads", out_proj.sizes(), d, h_kv);
  const int64_t h_q = out_proj.size(1) / d, g = h_q / h_kv;
  auto v = values.to(at::kCPU, at::kDouble);                                                 // [Hkv, n, d]
  auto wo = out_proj.to(at::kCPU, at::kDouble);                                              // [hidden, Hq·d]
  auto out = at::zeros({h_kv, n}, at::kDouble);
  for (int64_t h = 0; h < h_q; ++h) {
    auto proj = at::matmul(v[h / g], wo.narrow(1, h * d, d).t());                           // [n, hidden]
    out[h / g] += proj.abs().sum(-1);
  }
  return out / double(g);
}

// The parameters criticalkv and criticaladakv share (criticaladakv adds alpha_safeguard), read
// with the method's name in every error, and the scorer they wrap.
struct CriticalParams {
  std::string scorer_name;
  double epsilon = 1e-4, first_stage = 0.5, alpha = 0.2;
  std::unique_ptr<Compressor> scorer;
  nlohmann::json effective;

  CriticalParams(const nlohmann::json& given, const std::string& method, bool adaptive) {
    std::vector<std::string> own_keys = {"scorer", "epsilon", "first_stage_ratio"};
    if (adaptive) own_keys.push_back("alpha_safeguard");
    const auto [own, inner] = detail::split_wrapper_params(given, own_keys);
    Params p(own, method);
    scorer_name = p.get_string("scorer", "snapkv", detail::top_score_methods());
    epsilon = p.get_double("epsilon", 1e-4);
    first_stage = p.get_double("first_stage_ratio", 0.5);
    if (adaptive) alpha = p.get_double("alpha_safeguard", 0.2);
    KVLAB_CHECK(epsilon >= 0, "{}: parameter 'epsilon' must be >= 0, got {}", method, epsilon);
    KVLAB_CHECK(first_stage >= 0 && first_stage <= 1, "{}: parameter 'first_stage_ratio' must be in [0, 1], got {}",
                method, first_stage);
    KVLAB_CHECK(alpha >= 0 && alpha <= 1, "{}: parameter 'alpha_safeguard' must be in [0, 1], got {}", method, alpha);
    p.finish();
    scorer = make_compressor(scorer_name, inner);
    effective = detail::wrapper_params(p.effective(), *scorer);
  }

  // The scorer's [Hkv, n] scores, after checking the layer's W_o is there.
  at::Tensor scores(const LayerKV& kv, const CompressOptions& opt, const std::string& method) const {
    KVLAB_CHECK(kv.context.has(inputs::out_proj), "{}: needs the layer's output projection W_o, which captures do not hold, so "
                "`kvlab replay` cannot run it (input out_proj); run it in generation or a task command, where the "
                "model is loaded", method);
    at::Tensor s = scorer->keep_scores(kv, opt);  // [Hkv, n]
    KVLAB_CHECK(s.defined(), "{}: scorer '{}' gives no per-position scores", method, scorer_name);
    return s;
  }
};

class CriticalKV final : public Compressor {
 public:
  explicit CriticalKV(const nlohmann::json& given) : p_(given, "criticalkv", /*adaptive=*/false) {}
  std::string name() const override { return "criticalkv"; }
  nlohmann::json params() const override { return p_.effective; }
  int64_t observation_queries() const override { return p_.scorer->observation_queries(); }
  ReconstructionRequest reconstruction() const override { return p_.scorer->reconstruction(); }

  // The stage-2 scores with stage 1's choice at +inf.
  at::Tensor keep_scores(const LayerKV& kv, const CompressOptions& opt) const override {
    const at::Tensor scores = p_.scores(kv, opt, "criticalkv");  // [Hkv, n]
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
    int64_t first = opt.budget.kind == Budget::Kind::ratio
                        ? static_cast<int64_t>(opt.budget.ratio * double(n) * p_.first_stage)
                        : static_cast<int64_t>(double(b) * p_.first_stage);
    if (p_.first_stage > 0) first = std::max<int64_t>(1, first);
    auto out = ((scores + p_.epsilon) * projected_value_norms(kv.values, kv.context.get(inputs::out_proj))).contiguous();
    const double* sc = scores.data_ptr<double>();
    double* o = out.data_ptr<double>();
    for (int64_t h = 0; h < h_kv; ++h)
      for (int64_t i : detail::top_k_indices(sc + h * n, n, std::min(first, n)))
        o[h * n + i] = std::numeric_limits<double>::infinity();
    return out;  // [Hkv, n]
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    return detail::compress_top_scores(*this, kv, opt);  // [Hkv, b]
  }

 private:
  CriticalParams p_;
};

class CriticalAdaKV final : public Compressor {
 public:
  explicit CriticalAdaKV(const nlohmann::json& given) : p_(given, "criticaladakv", /*adaptive=*/true) {}
  std::string name() const override { return "criticaladakv"; }
  nlohmann::json params() const override { return p_.effective; }
  int64_t observation_queries() const override { return p_.scorer->observation_queries(); }
  ReconstructionRequest reconstruction() const override { return p_.scorer->reconstruction(); }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads(), b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const at::Tensor scores = p_.scores(kv, opt, "criticaladakv");  // [Hkv, n]
    const double* sc = scores.data_ptr<double>();
    const std::vector<char> ada = detail::adakv_selection(sc, h_kv, n, b, p_.alpha);  // [Hkv·n] the layer's H·b
    const at::Tensor wov = ((scores + p_.epsilon) * projected_value_norms(kv.values, kv.context.get(inputs::out_proj))).contiguous();
    const double* re = wov.data_ptr<double>();  // [Hkv, n] stage 2's scores
    const int64_t n_safe = detail::adakv_safeguard(b, p_.alpha);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    for (int64_t h = 0; h < h_kv; ++h) {
      const int64_t budget = std::count(ada.begin() + h * n, ada.begin() + (h + 1) * n, char(1));  // B_h
      const int64_t first = std::min(budget, std::max(static_cast<int64_t>(double(budget) * p_.first_stage), n_safe));
      std::vector<char> kept(static_cast<size_t>(n), 0);
      for (int64_t i : detail::top_k_indices(sc + h * n, n, first)) kept[i] = 1;
      std::vector<double> rest(re + h * n, re + (h + 1) * n);  // the others by (s + eps)·|W_o v|_1
      for (int64_t i = 0; i < n; ++i)
        if (kept[i]) rest[i] = -std::numeric_limits<double>::infinity();
      for (int64_t i : detail::top_k_indices(rest.data(), n, budget - first)) kept[i] = 1;
      for (int64_t i = 0; i < n; ++i)
        if (kept[i]) rows[h].push_back(i);
    }
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, max_h B_h]
  }

 private:
  CriticalParams p_;
};

}  // namespace

std::unique_ptr<Compressor> make_criticaladakv(const nlohmann::json& params) {
  return std::make_unique<CriticalAdaKV>(params);
}

// Preset "paper": the paper's CriticalAdaKV on SnapKV (window 32, max-pool kernel 7), kvpress's
// ε = 1e-4, first_stage_ratio = 0.5 and Ada-KV's safeguard α = 0.2.
MethodPreset paper_preset_criticaladakv() {
  return {{{"scorer", "snapkv"}, {"epsilon", 1e-4}, {"first_stage_ratio", 0.5}, {"alpha_safeguard", 0.2},
           {"window", 32}, {"kernel", 7}, {"pooling", "max"}},
          0,
          0,
          "Feng et al. 2025 (CriticalAdaKV) on SnapKV (window 32, kernel 7 max-pool); kvpress CriticalAdaKVPress "
          "epsilon 1e-4, first_stage_ratio 0.5, alpha 0.2",
          "",
          ""};
}

std::unique_ptr<Compressor> make_criticalkv(const nlohmann::json& params) {
  return std::make_unique<CriticalKV>(params);
}

// Preset "paper": the paper's CriticalKV refines SnapKV's selection (window 32, max-pool kernel 7,
// as SnapKV's LongBench config), with kvpress's ε = 1e-4 and first_stage_ratio = 0.5.
MethodPreset paper_preset_criticalkv() {
  return {{{"scorer", "snapkv"}, {"epsilon", 1e-4}, {"first_stage_ratio", 0.5}, {"window", 32}, {"kernel", 7},
           {"pooling", "max"}},
          0,
          0,
          "Feng et al. 2025 (CriticalKV) on SnapKV (window 32, kernel 7 max-pool); kvpress CriticalKVPress "
          "epsilon 1e-4, first_stage_ratio 0.5",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_criticalkv() {
  CompressorInfo m;
  m.name = "criticalkv";
  m.description =
      "a scorer's top half kept, the rest by score times |W_o v|_1 (CriticalKV; kvpress CriticalKVPress); needs the model's W_o";
  m.make = make_criticalkv;
  m.paper = paper_preset_criticalkv;
  m.cost = {1.0, "known: the scorer's cost + O(H n d D) projected values",
            "known cost: the wrapped scorer's, then each value through its head's slice of W_o, O(H·n·d·D) for hidden size D, and a top-k (CriticalKV, Feng et al. 2025)"};
  m.wrapper = true;
  m.inputs = {inputs::out_proj};
  return m;
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_criticaladakv() {
  CompressorInfo m;
  m.name = "criticaladakv";
  m.description =
      "adakv's budgets across a layer's KV heads, then criticalkv's two stages on each head's own (CriticalAdaKV; kvpress CriticalAdaKVPress); needs the model's W_o";
  m.make = make_criticaladakv;
  m.paper = paper_preset_criticaladakv;
  m.cost = {1.0, "known: the scorer's cost + O(H n d D) projected values",
            "known cost: the wrapped scorer's, a top-k over the layer's H·n scores, each value through its head's slice of W_o, O(H·n·d·D), and per-head top-ks (CriticalKV, Feng et al. 2025)"};
  m.wrapper = true;
  m.inputs = {inputs::out_proj};
  return m;
}
}  // namespace kvlab
