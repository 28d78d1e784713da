// entropy_chunkkv — chunkkv whose important but spiky chunks keep only their best few tokens, the
// budget they free going to further chunks.
//
// Source: NVIDIA kvpress 0.5.5 `EntropyGatedChunkKVPress` (kvpress/presses/entropy_gated_chunkkv_press.py,
//   an extension of ChunkKVPress defined in kvpress, no paper of its own; ChunkKV is Liu et al.,
//   arXiv:2502.00299). Followed as kvpress defines it and checked against it
//   (tests/generate/test_kvpress_golden.cpp).
//
// Summary. A per-head top-k scorer scores every position; the scores are summed over the layer's KV
// heads, s [n]. The region is cut into chunks of `chunk_length` [10] (the last one shorter); chunk c
// scores the mean of its s and has a normalised entropy: its s shifted by min(0, min s) to be
// non-negative, p = s / (Σ s + 1e-8), H = −Σ p log(p + 1e-8) / log(len) clamped to [0, 1] (0 for a
// chunk of one). With the lower medians m_s of the chunk means and m_H of the entropies, chunks are
// visited by mean, best first: each takes min(len, what is left of b) positions, but a chunk with
// mean ≥ m_s and H < m_H (important, spiky) at most `low_entropy_chunk_length` [4], its best by s;
// a chunk taking fewer than its length keeps its best by s. Budget left at the end goes to the best
// remaining positions by s. Every head keeps the same b positions.
//
//   scores   [Hkv, n] float64 from the scorer -> s [n] summed over heads
//   chunks   [C] means and entropies; the medians are the lower middle values (torch.median)
//   kept     b positions, ascending, the same on every head
//
// Parameters: scorer [snapkv] (any method with per-position scores, as chunkkv), chunk_length [10],
// low_entropy_chunk_length [4] (>= 1, < chunk_length); every other parameter is the scorer's.
//
// Deviations and notes:
//   - Positions the scorer always keeps (+inf in kvlab) count as the layer's largest other score + 1,
//     kvpress's value for snapkv's window and expected_attention's and capkv's sinks (compactor's
//     is the largest score itself).
//   - kvpress sums and takes the entropies in float32, kvlab in float64; ties in the chunk order,
//     inside a chunk and in the top-up go to the lower position (torch leaves them unspecified).
//   - Exactly b kept, as kvpress. Prefill-only, as kvpress.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

constexpr double kEps = 1e-8;  // kvpress's EPSILON

// The normalised entropy of one chunk's scores (kvpress's, the tail's rule for a chunk of one).
double chunk_entropy(const double* s, int64_t len) {
  if (len <= 1) return 0.0;
  double lo = 0.0, sum = 0.0, h = 0.0;
  for (int64_t i = 0; i < len; ++i) lo = std::min(lo, s[i]);
  for (int64_t i = 0; i < len; ++i) sum += s[i] - lo;
  for (int64_t i = 0; i < len; ++i) {
    const double p = (s[i] - lo) / (sum + kEps);
    h -= p * std::log(p + kEps);
  }
  return std::clamp(h / std::log(double(len)), 0.0, 1.0);
}

// torch.median: the lower of the two middle values for an even count.
double lower_median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + (v.size() - 1) / 2, v.end());
  return v[(v.size() - 1) / 2];
}

class EntropyChunkKV final : public detail::ScorerWrapper {
 public:
  explicit EntropyChunkKV(const nlohmann::json& given) : ScorerWrapper("entropy_chunkkv") {
    Params p = own_params(given, {"scorer", "chunk_length", "low_entropy_chunk_length"});
    const std::string scorer = p.get_string("scorer", "snapkv", detail::top_score_methods());
    chunk_ = p.get_int("chunk_length", 10);
    low_ = p.get_int("low_entropy_chunk_length", 4);
    KVLAB_CHECK(low_ >= 1 && low_ < chunk_,
                "entropy_chunkkv: parameters 'low_entropy_chunk_length' ({}) and 'chunk_length' ({}) must satisfy "
                "1 <= low_entropy_chunk_length < chunk_length",
                low_, chunk_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const at::Tensor scores = scorer_scores(kv, opt);  // [Hkv, n]
    // Positions a scorer always keeps (snapkv's window, the sinks) score +inf in kvlab and the
    // layer's largest other score + 1 in kvpress: a finite value the chunk means and entropies can
    // use, as kvpress's.
    const at::Tensor finite = scores.isfinite();
    const double top = finite.any().item<bool>() ? scores.masked_select(finite).max().item<double>() : 0.0;
    const at::Tensor summed = at::where(finite, scores, at::full_like(scores, top + 1.0)).sum(0).contiguous();  // [n]
    const double* s = summed.data_ptr<double>();
    const int64_t chunks = (n + chunk_ - 1) / chunk_;
    const std::vector<double> mean = detail::chunk_means(s, n, chunk_);  // [C]
    std::vector<double> entropy(static_cast<size_t>(chunks));                  // [C]
    for (int64_t c = 0; c < chunks; ++c) entropy[c] = chunk_entropy(s + c * chunk_, std::min(chunk_, n - c * chunk_));
    const double m_s = lower_median(mean), m_h = lower_median(entropy);
    std::vector<char> keep(static_cast<size_t>(n), 0);
    int64_t left = b;
    for (int64_t c : detail::best_first(mean)) {
      if (left <= 0) break;
      const int64_t from = c * chunk_, len = std::min(chunk_, n - from);
      int64_t take = std::min(len, left);
      if (mean[c] >= m_s && entropy[c] < m_h) take = std::min(take, low_);  // important but spiky
      for (int64_t i : detail::top_k_indices(s + from, len, take)) keep[from + i] = 1;
      left -= take;
    }
    if (left > 0) {  // the budget spiky chunks left: the best remaining positions
      std::vector<int64_t> rest;
      std::vector<double> rest_s;
      for (int64_t i = 0; i < n; ++i)
        if (!keep[i]) rest.push_back(i), rest_s.push_back(s[i]);
      for (int64_t j : detail::top_k_indices(rest_s.data(), int64_t(rest.size()), left)) keep[rest[j]] = 1;
    }
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < n; ++i)
      if (keep[i]) rows.push_back(i);
    std::vector<std::vector<int64_t>> per_head(static_cast<size_t>(h_kv), rows);
    return gather_kept(kv, detail::pad_index_rows(per_head).to(kv.keys.device()));  // [Hkv, b]
  }

 private:
  int64_t chunk_ = 10, low_ = 4;
};

}  // namespace

std::unique_ptr<Compressor> make_entropy_chunkkv(const nlohmann::json& params) {
  return std::make_unique<EntropyChunkKV>(params);
}

// Preset "paper": kvpress EntropyGatedChunkKVPress's defaults (chunks of 10, spiky chunks keep 4)
// around SnapKV's LongBench setting, as chunkkv (kvlab's choice of scorer).
MethodPreset paper_preset_entropy_chunkkv() {
  return {{{"scorer", "snapkv"}, {"chunk_length", 10}, {"low_entropy_chunk_length", 4}, {"window", 32}, {"kernel", 7},
           {"pooling", "max"}},
          0,
          0,
          "kvpress EntropyGatedChunkKVPress defaults (chunks of 10, 4 kept of a spiky chunk) around SnapKV (window 32, "
          "kernel 7 max-pool; kvlab's choice of scorer)",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_entropy_chunkkv() {
  CompressorInfo m;
  m.name = "entropy_chunkkv";
  m.description =
      "chunkkv over chunks of 10 whose important but low-entropy (spiky) chunks keep only their best 4 tokens, the freed budget spent on further chunks (kvpress EntropyGatedChunkKVPress)";
  m.make = make_entropy_chunkkv;
  m.paper = paper_preset_entropy_chunkkv;
  m.cost = {1.0, "known: the scorer's cost + chunk means, entropies and a sort over n/10 chunks",
            "known cost: the wrapped scorer's, then one pass over its H·n scores, a sort of the chunks and top-ks inside them (kvpress EntropyGatedChunkKVPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
