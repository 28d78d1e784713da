// tova — Token Omission Via Attention: keep the tokens the current query attends to most,
// averaged over the layer's heads.
//
// Paper: Matanel Oren, Michael Hassid, Nir Yarden, Yossi Adi, Roy Schwartz, "Transformers are
//   Multi-State RNNs", EMNLP 2024, arXiv:2401.06104 (§3.3, TOVA). Checked against NVIDIA kvpress
//   0.5.5 `TOVAPress` (kvpress/presses/tova_press.py): the last prompt query's attention (softmax
//   over every key it sees) averaged over all query heads of the layer, the last token padded with
//   the maximum score so it is always kept; one score per position, shared by every KV head.
//
// Summary. When the cache is over budget, TOVA drops the tokens with the lowest attention from the
// current query, averaged over the layer's heads (the paper found head-averaged scores better than
// per-head ones). After the prefill that is the last prompt query's attention; while decoding,
// each new token's query scores the held tokens and the lowest go until the budget holds
// (start_stream), the newest token never among them.
//
// Cost: one query's attention over n keys, O(Hq·n·d), and a top-k.
//
// Parameters: none.
//
// Deviations:
//   - The newest token scores the maximum of the others (kvpress pads it so), so it is kept from a
//     budget of two entries on (at one entry it ties with the best token and the older one wins);
//     the paper's rule would let the current token compete with the others.
//   - In replay the last query may lie after the region (behind --keep-last); then no region token
//     is its own and none is protected.
//   - Ties go to the lower index (torch.topk leaves them unspecified).
#include <ATen/ATen.h>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/held_set.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/stream.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// probs [Hkv, m] (one query, each KV group's mean over its query heads) -> [m] float64, the mean
// over all query heads (equal groups), with entry `own` (the query's own token, or -1) set to the max.
std::vector<double> head_mean_scores(const at::Tensor& probs, int64_t own) {
  auto s = probs.to(at::kCPU, at::kDouble).mean(0).contiguous();  // [m]
  std::vector<double> out(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
  if (own >= 0 && own < static_cast<int64_t>(out.size())) {
    double mx = 0;
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int64_t>(i) != own) mx = std::max(mx, out[i]);
    out[own] = mx;
  }
  return out;
}

// The region indices TOVA keeps after the prefill: [b] ascending.
std::vector<int64_t> tova_select(const LayerKV& kv, int64_t b) {
  const int64_t n = kv.n_tokens();
  detail::require_queries(kv, "tova");
  LayerKV last = detail::last_queries(kv, 1);
  auto probs = group_attention_probs(last, "mean").select(1, 0);  // [Hkv, n]
  int64_t own = -1;
  if (last.query_pos.defined()) {
    const int64_t q = last.query_pos.item<int64_t>() - kv.pos0;  // the query's own region index
    if (q >= 0 && q < n) own = q;
  }
  const auto scores = head_mean_scores(probs, own);
  return detail::top_k_indices(scores.data(), n, b);
}

// Decoding: every head holds the same positions; each step the new token's query scores the held
// entries and the lowest go until the budget on the tokens seen holds (the new token stays).
class TovaStream final : public LayerStream {
 public:
  TovaStream(const LayerKV& kv, const Budget& budget, const std::vector<int64_t>& kept)
      : budget_(budget), n_seen_(kv.n_tokens()) {
    held_ = HeldSet(region_entries(kv));
    if (static_cast<int64_t>(kept.size()) < kv.n_tokens()) held_.keep_same(kept);
  }

  void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) override {
    held_.append(k, v, pos0);
    last_pos_ = at::arange(pos0, pos0 + k.size(1), held_.set().pos.options());  // [T]
    n_seen_ += k.size(1);
  }

  void settle(const at::Tensor& q, const at::Tensor& prefix_keys) override {
    const int64_t b = budget_.entries_for(n_seen_), m = held_.size();
    if (m <= b || q.size(1) == 0) return;  // a replay step without a query cannot score
    KVLAB_CHECK(last_pos_.defined() && last_pos_.numel() == q.size(1), "tova: settle got {} queries for {} pushed "
                "tokens", q.size(1), last_pos_.defined() ? last_pos_.numel() : 0);
    const int64_t t = q.size(1);
    auto probs = stream_attention_probs(q.narrow(1, t - 1, 1), last_pos_.narrow(0, t - 1, 1), prefix_keys, held_.set(),
                                        1.0, "mean").select(1, 0);  // [Hkv, m]: the newest query
    const auto scores = head_mean_scores(probs, m - 1);  // the newest token is held last
    held_.keep_same(detail::top_k_indices(scores.data(), m, b));  // ascending
  }

  const KVSet& held() const override { return held_.set(); }
  double live_entries() const override { return double(held_.size()); }  // every entry exact
  int64_t n_seen() const override { return n_seen_; }

 private:
  Budget budget_;
  HeldSet held_;  // keys, values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m]
  at::Tensor last_pos_;
  int64_t n_seen_ = 0;
};

class Tova final : public Compressor {
 public:
  explicit Tova(Params p) : params_(p.effective()) { p.finish(); }
  std::string name() const override { return "tova"; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return 1; }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const auto kept = tova_select(kv, b);
    auto idx = at::tensor(kept, at::kLong).view({1, b}).expand({h_kv, b}).contiguous();  // [Hkv, b]
    return gather_kept(kv, idx.to(kv.keys.device()));
  }

  std::unique_ptr<LayerStream> start_stream(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), b = resolve_budget(opt, n);
    // A region with no query to score it (the registry's probe) is held whole until the first
    // decoded token's query settles it; generation always passes the last prompt query.
    const bool scorable = kv.queries.defined() && kv.queries.dim() == 3 && kv.queries.size(1) > 0;
    std::vector<int64_t> kept;
    if (n > 0 && b < n && scorable) kept = tova_select(kv, b);
    else for (int64_t i = 0; i < n; ++i) kept.push_back(i);
    return std::make_unique<TovaStream>(kv, opt.budget, kept);
  }

 private:
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_tova(const nlohmann::json& params) {
  return std::make_unique<Tova>(Params(params, "tova"));
}

// Preset "paper": no parameters (TOVA has none besides the budget).
MethodPreset paper_preset_tova() {
  return {nlohmann::json::object(), 0, 0, "Oren et al. 2024 (TOVA) / kvpress TOVAPress: no parameters", "", ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_tova() {
  CompressorInfo m;
  m.name = "tova";
  m.description =
      "the current query's head-averaged attention, lowest evicted (TOVA; kvpress TOVAPress)";
  m.make = make_tova;
  m.paper = paper_preset_tova;
  m.cost = {1.0, "known: one query's attention O(H n d) per step",
            "known cost: one query's attention over the n held keys per step, O(H·n·d), and a top-k (TOVA, Oren et al. 2024)"};
  m.streaming = true;
  return m;
}
}  // namespace kvlab
