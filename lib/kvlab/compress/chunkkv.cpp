// chunkkv — a scorer's tokens kept in whole chunks, the same chunks for every KV head.
//
// Paper: Xiang Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
//   Long-Context LLM Inference", arXiv:2502.00299. Followed as NVIDIA kvpress 0.5.5 defines it
//   (`ChunkKVPress`, kvpress/presses/chunkkv_press.py, which wraps any ScorerPress) and checked
//   against it (tests/generate/test_kvpress_golden.cpp).
//
// Summary. A per-head top-k scorer (`scorer`: the methods with Compressor::keep_scores) scores every
// region position of every KV head; the scores are summed over the heads, the region is cut into
// chunks of `chunk_length` positions (the last one shorter when the length is not a multiple), and
// each chunk scores the mean of its positions. The best chunks are kept whole, on every head, while
// they fit in the budget b; the rest of b comes from the next chunk's best positions (by the summed
// score), so every head holds exactly b (`fill`, default). With fill=false, kvpress's rule: the
// max(1, ⌊C·f⌋) best of the C chunks whole, f the kept fraction (`--ratio`, or b / n for
// `--budget`), up to a chunk more or less than b. A region shorter than one chunk goes to the
// scorer's own top-k.
//
//   scores  [Hkv, n] float64 from the scorer -> [n] summed -> [C] chunk means
//   kept    the positions of the C' best chunks, ascending, the same for every head
//
// Parameters: scorer [snapkv], chunk_length [20], fill [true]; every other parameter is the scorer's.
//
// Deviations and notes:
//   - Memory: kvpress's rule (fill=false) keeps whole chunks, C'·chunk_length positions (fewer when
//     the short last chunk is among them), not the budget b = ⌊f·n⌋. kvlab's default fills b
//     exactly, for equal memory with every other method; the golden test runs fill=false.
//   - Ties go to the lower chunk (torch.topk leaves them unspecified). Prefill-only, as kvpress.
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

class ChunkKV final : public detail::ScorerWrapper {
 public:
  explicit ChunkKV(const nlohmann::json& given) : ScorerWrapper("chunkkv") {
    Params p = own_params(given, {"scorer", "chunk_length", "fill"});
    const std::string scorer = p.get_string("scorer", "snapkv", detail::top_score_methods());
    chunk_ = p.get_int("chunk_length", 20);
    fill_ = p.get_bool("fill", true);
    KVLAB_CHECK(chunk_ >= 1, "chunkkv: parameter 'chunk_length' must be >= 1, got {}", chunk_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const int64_t full = n / chunk_, rest = n % chunk_, chunks = full + (rest > 0);
    if (full == 0) return scorer_->compress(kv, opt);  // kvpress: the scorer's own compress
    const at::Tensor scores = scorer_scores(kv, opt);  // [Hkv, n]
    const at::Tensor summed = scores.sum(0);                  // [n] float64
    const double* s = summed.data_ptr<double>();
    const std::vector<double> mean = detail::chunk_means(s, n, chunk_);  // [C]
    std::vector<int64_t> rows;
    auto take_chunk = [&](int64_t c) {
      for (int64_t i = c * chunk_; i < std::min(n, (c + 1) * chunk_); ++i) rows.push_back(i);
    };
    if (!fill_) {  // kvpress: max(1, ⌊C·f⌋) whole chunks
      const int64_t keep = std::max<int64_t>(1, static_cast<int64_t>(double(chunks) * resolve_kept_fraction(opt, n)));
      for (int64_t c : detail::top_k_indices(mean.data(), chunks, keep)) take_chunk(c);
    } else {  // the best chunks whole while they fit in b, then the rest of b from the next one's best positions
      for (int64_t c : detail::best_first(mean)) {
        const int64_t len = std::min(chunk_, n - c * chunk_), room = b - int64_t(rows.size());
        if (room <= 0) break;
        if (len <= room) {
          take_chunk(c);
          continue;
        }
        for (int64_t i : detail::top_k_indices(s + c * chunk_, len, room)) rows.push_back(c * chunk_ + i);
        break;
      }
    }
    std::sort(rows.begin(), rows.end());
    std::vector<std::vector<int64_t>> per_head(static_cast<size_t>(h_kv), rows);
    return gather_kept(kv, detail::pad_index_rows(per_head).to(kv.keys.device()));  // [Hkv, C'·chunk]
  }

 private:
  int64_t chunk_ = 20;
  bool fill_ = true;
};

}  // namespace

std::unique_ptr<Compressor> make_chunkkv(const nlohmann::json& params) { return std::make_unique<ChunkKV>(params); }

// Preset "paper": kvpress ChunkKVPress's chunk of 20; the scorer is kvlab's choice, SnapKV as its
// LongBench configuration (window 32, kernel 7 max-pool), not checked against ChunkKV's own code.
MethodPreset paper_preset_chunkkv() {
  return {{{"scorer", "snapkv"}, {"chunk_length", 20}, {"fill", true}, {"window", 32}, {"kernel", 7}, {"pooling", "max"}},
          0,
          0,
          "kvpress ChunkKVPress's chunks of 20 (Liu et al., ChunkKV) around SnapKV (window 32, kernel 7 max-pool; kvlab's choice of scorer)",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_chunkkv() {
  CompressorInfo m;
  m.name = "chunkkv";
  m.description =
      "a scorer's scores summed over heads and averaged per chunk of 20 tokens, the best chunks kept whole on every head (ChunkKV; kvpress ChunkKVPress)";
  m.make = make_chunkkv;
  m.paper = paper_preset_chunkkv;
  m.cost = {1.0, "known: the scorer's cost + chunk means and a top-k over n/20 chunks",
            "known cost: the wrapped scorer's, then one pass over its H·n scores and a top-k over the chunks (ChunkKV, kvpress ChunkKVPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
