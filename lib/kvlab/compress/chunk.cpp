// chunk — a query-agnostic scorer applied to each chunk of the region on its own (FINCH's chunking).
//
// Paper: Giulio Corallo, Paolo Papotti, "FINCH: Prompt-guided Key-Value Cache Compression for Large
//   Language Models", TACL 2024 (its chunked processing). Followed as NVIDIA kvpress 0.5.5 defines
//   it (`ChunkPress`, kvpress/presses/chunk_press.py, a wrapper around any ScorerPress) and checked
//   against it (tests/generate/test_kvpress_golden.cpp).
//
// Summary. The region is cut into chunks of `chunk_length` positions (the last one shorter); the
// scorer scores each chunk from that chunk's keys and values alone, and each chunk keeps its best
// positions per KV head, its share of the budget b: ⌊len·b/n⌋, the few left over going to the
// chunks of largest remainder, so every head holds exactly b (`fill`, default); with fill=false,
// kvpress's max(1, ⌊len·f⌋), f the kept fraction (`--ratio`, or b / n for `--budget`). Every part
// of the context keeps the same share, where a global top-k may spend the budget on one region.
//
//   scores  per chunk [Hkv, len] float64 from the scorer on the chunk
//   kept    per head the union of each chunk's best, ascending
//
// Parameters: scorer [knorm] (knorm, keydiff, cur or lagkv: the scorers that read only the keys and
// values they are given; kvpress also passes a chunk's hidden states to query-based scorers, which
// kvlab's observation queries, the prompt's last ones, cannot stand for), chunk_length [1024], fill
// [true]; every other parameter is the scorer's own.
//
// Deviations and notes:
//   - Memory: kvpress's rule (fill=false) keeps Σ max(1, ⌊len·f⌋), up to one entry per chunk off the
//     budget b = ⌊f·n⌋; kvlab's default fills b exactly. The golden test runs fill=false.
//   - Ties go to the lower position (torch.topk leaves them unspecified). Prefill-only, as kvpress.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Chunk final : public detail::ScorerWrapper {
 public:
  explicit Chunk(const nlohmann::json& given) : ScorerWrapper("chunk") {
    Params p = own_params(given, {"scorer", "chunk_length", "fill"});
    const std::string scorer = p.get_string("scorer", "knorm", {"knorm", "keydiff", "cur", "lagkv"});
    chunk_ = p.get_int("chunk_length", 1024);
    fill_ = p.get_bool("fill", true);
    KVLAB_CHECK(chunk_ >= 1, "chunk: parameter 'chunk_length' must be >= 1, got {}", chunk_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const double kept = resolve_kept_fraction(opt, n);  // fill=false only
    // Each chunk's share: kvpress's max(1, ⌊len·f⌋) (fill=false), or ⌊len·b/n⌋ with the b − Σ left
    // over given one each to the chunks of largest remainder (earlier first): exactly b (fill).
    const int64_t n_chunks = (n + chunk_ - 1) / chunk_;
    std::vector<int64_t> quota(static_cast<size_t>(n_chunks));
    std::vector<double> remainder(static_cast<size_t>(n_chunks));
    int64_t given = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t len = std::min(chunk_, n - c * chunk_);
      const double share = fill_ ? double(len) * double(b) / double(n) : double(len) * kept;
      quota[c] = fill_ ? static_cast<int64_t>(share) : std::max<int64_t>(1, static_cast<int64_t>(share));
      remainder[c] = share - std::floor(share);
      given += quota[c];
    }
    if (fill_)
      for (int64_t c : detail::top_k_indices(remainder.data(), n_chunks, std::max<int64_t>(0, b - given))) ++quota[c];
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(h_kv));
    for (int64_t from = 0; from < n; from += chunk_) {
      const int64_t len = std::min(chunk_, n - from);
      const int64_t keep = quota[from / chunk_];
      if (keep == 0) continue;
      LayerKV part;  // the chunk's keys and values alone
      part.keys = kv.keys.narrow(1, from, len);      // [Hkv, len, d]
      part.values = kv.values.narrow(1, from, len);  // [Hkv, len, d]
      part.pos0 = kv.pos0 + from;
      part.layer = kv.layer;
      part.n_layers = kv.n_layers;
      const at::Tensor sc = scorer_scores(part, opt).contiguous();  // [Hkv, len] float64
      for (int64_t h = 0; h < h_kv; ++h)
        for (int64_t i : detail::top_k_indices(sc.data_ptr<double>() + h * len, len, keep)) rows[h].push_back(from + i);
    }
    for (auto& r : rows) std::sort(r.begin(), r.end());
    return gather_kept(kv, detail::pad_index_rows(rows).to(kv.keys.device()));  // [Hkv, Σ chunks' keep]
  }

 private:
  int64_t chunk_ = 1024;
  bool fill_ = true;
};

}  // namespace

std::unique_ptr<Compressor> make_chunk(const nlohmann::json& params) { return std::make_unique<Chunk>(params); }

// Preset "paper": kvpress ChunkPress's chunks of 1024 around Knorm (kvlab's choice of scorer: FINCH
// scores with the question's attention, which a query-agnostic chunking cannot).
MethodPreset paper_preset_chunk() {
  return {{{"scorer", "knorm"}, {"chunk_length", 1024}, {"fill", true}},
          0,
          0,
          "kvpress ChunkPress (FINCH's chunking): chunks of 1024 around knorm (kvlab's choice of scorer)",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_chunk() {
  CompressorInfo m;
  m.name = "chunk";
  m.description =
      "a query-agnostic scorer (knorm, keydiff, cur, lagkv) applied to each chunk of 1024 tokens on its own, each chunk keeping the same share (FINCH's chunking; kvpress ChunkPress)";
  m.make = make_chunk;
  m.paper = paper_preset_chunk;
  m.cost = {1.0, "known: the scorer's cost per chunk + a top-k per chunk",
            "known cost: the wrapped scorer's on each chunk, then a top-k per chunk (kvpress ChunkPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
