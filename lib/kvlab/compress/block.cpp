// block — a query-agnostic scorer run block by block: what it kept so far and the next block are
// scored together and cut back to the budget (KeyDiff's block-wise prompt processing).
//
// Paper: Junyoung Park, Dalton Jones, Matthew J. Morse, Raghavv Goel, Mingu Lee, Chris Lott,
//   "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
//   Resource-Constrained Environments", arXiv:2504.15364 (2025), its block prompt processing.
//   Followed as NVIDIA kvpress 0.5.5 defines it (`BlockPress`, kvpress/presses/block_press.py, a
//   wrapper around any ScorerPress) and checked against it (tests/generate/test_kvpress_golden.cpp).
//
// Summary. With budget b per KV head on a region of n: each head starts holding positions 0..b-1;
// for each block of `block_size` positions after them, the scorer scores the held entries followed
// by the block (its scores depend on the set: keydiff's anchor is the mean of the keys it is given)
// and the head keeps the b best, in descending score order, as kvpress's topk. Memory never
// exceeds b + block_size per head while the prompt is processed, as in a device that prefills in
// blocks; the kept set is that of the last step, in position order.
//
//   candidates  per head [b + len] region indices (held, in the previous cut's order, then the block)
//   scores      [Hkv, b + len] float64 from the scorer on the candidates' keys and values
//   kept        per head the b best candidates, ascending at the end
//
// Parameters: scorer [keydiff] (knorm, keydiff, cur or lagkv: the scorers that read only the keys
// and values they are given, as for chunk), block_size [128]; every other parameter is the scorer's.
//
// Deviations and notes:
//   - kvpress computes every key in one forward pass and then processes the blocks, as here: the
//     keys are not those of a true block-wise prefill (kvpress says the same).
//   - Ties go to the earlier candidate (torch.topk leaves them unspecified). Prefill-only, as kvpress.
//   - With knorm (a score per key, independent of the set) the result is knorm's own top-b.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/compress/query_scores.h"
#include "kvlab/compress/wrapper.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

class Block final : public detail::ScorerWrapper {
 public:
  explicit Block(const nlohmann::json& given) : ScorerWrapper("block") {
    Params p = own_params(given, {"scorer", "block_size"});
    const std::string scorer = p.get_string("scorer", "keydiff", {"knorm", "keydiff", "cur", "lagkv"});
    block_ = p.get_int("block_size", 128);
    KVLAB_CHECK(block_ >= 1, "block: parameter 'block_size' must be >= 1, got {}", block_);
    make_scorer(p, scorer);
  }

  CompressedKV compress(const LayerKV& kv, const CompressOptions& opt) const override {
    const int64_t n = kv.n_tokens(), h_kv = kv.n_kv_heads();
    const int64_t b = resolve_budget(opt, n);
    if (b >= n) return keep_all(kv);
    const int64_t bs = std::min(block_, n);
    std::vector<std::vector<int64_t>> held(static_cast<size_t>(h_kv), std::vector<int64_t>(static_cast<size_t>(b)));
    for (auto& h : held) std::iota(h.begin(), h.end(), int64_t{0});
    for (int64_t from = b; from < n; from += bs) {
      const int64_t len = std::min(bs, n - from), m = b + len;
      auto cand = at::empty({h_kv, m}, at::kLong);  // [Hkv, m] region indices
      auto ca = cand.accessor<int64_t, 2>();
      for (int64_t h = 0; h < h_kv; ++h) {
        for (int64_t j = 0; j < b; ++j) ca[h][j] = held[h][j];
        for (int64_t j = 0; j < len; ++j) ca[h][b + j] = from + j;
      }
      const auto dev = cand.to(kv.keys.device());
      LayerKV part;  // the candidates' keys and values alone, in candidate order
      part.keys = kv.keys.gather(1, dev.unsqueeze(-1).expand({h_kv, m, kv.keys.size(2)}));        // [Hkv, m, d]
      part.values = kv.values.gather(1, dev.unsqueeze(-1).expand({h_kv, m, kv.values.size(2)}));  // [Hkv, m, d]
      part.pos0 = kv.pos0;
      part.layer = kv.layer;
      part.n_layers = kv.n_layers;
      const at::Tensor sc = scorer_scores(part, opt).contiguous();  // [Hkv, m] float64
      for (int64_t h = 0; h < h_kv; ++h) {
        const double* s = sc.data_ptr<double>() + h * m;
        std::vector<int64_t> order(static_cast<size_t>(m));
        std::iota(order.begin(), order.end(), int64_t{0});
        // The b best, best first (kvpress keeps topk's order for the next block); ties to the earlier.
        std::partial_sort(order.begin(), order.begin() + b, order.end(),
                          [s](int64_t x, int64_t y) { return s[x] > s[y] || (s[x] == s[y] && x < y); });
        for (int64_t j = 0; j < b; ++j) held[h][j] = ca[h][order[j]];
      }
    }
    for (auto& h : held) std::sort(h.begin(), h.end());
    return gather_kept(kv, detail::pad_index_rows(held).to(kv.keys.device()));  // [Hkv, b]
  }

 private:
  int64_t block_ = 128;
};

}  // namespace

std::unique_ptr<Compressor> make_block(const nlohmann::json& params) { return std::make_unique<Block>(params); }

// Preset "paper": KeyDiff's block processing around KeyDiff, kvpress BlockPress's block of 128.
MethodPreset paper_preset_block() {
  return {{{"scorer", "keydiff"}, {"block_size", 128}},
          0,
          0,
          "KeyDiff (arXiv:2504.15364) block prompt processing as kvpress BlockPress: blocks of 128 around keydiff",
          "",
          ""};
}

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_block() {
  CompressorInfo m;
  m.name = "block";
  m.description =
      "a query-agnostic scorer (keydiff, knorm, cur, lagkv) run block by block: held entries + the next block of 128 scored together, cut back to the budget (KeyDiff's block processing; kvpress BlockPress)";
  m.make = make_block;
  m.paper = paper_preset_block;
  m.cost = {2.0, "known: (n − b)/block_size scorer calls on b + block_size entries",
            "known cost: one scorer call and a partial sort per block, each on the budget plus a block (kvpress BlockPress)"};
  m.wrapper = true;
  return m;
}
}  // namespace kvlab
