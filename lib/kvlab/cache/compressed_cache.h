// A compressed KV cache in the forward pass (issue 10, first step: compression after prefill).
//
// Per layer it stores densely only what a method kept or merged, per KV head, between the exact
// parts (compress/layout.h): keys/values [Hkv, m, d], a log-weight bias [Hkv, m] (-inf = empty
// slot, so heads may hold different counts), positions [Hkv, m] (-1 = a compressed entry, visible
// to every later query), and the separate denominator set where the method has one (SubGen,
// balancekv-mr). Decoded tokens are appended exactly (bias 0). Attention runs through
// kvlab::attention, the bias/denominator path replay uses; K/V are never repeated per query head.
//
// Every method is compressed once, after prefill, from the exact cache and the prompt's last
// n_obs queries (the observation window; SnapKV's window is its last `window` of them, H2O's scores
// are their accumulated attention). Streaming methods (CompressorInfo::streaming) then keep
// compressing while decoding through their LayerStream (compress/stream.h, the same object their
// compress() drives): the layer is [exact prefix][the stream's entries], every decoded token is
// pushed into the stream, attends, and the stream settles (evicts). Prefill-only methods append
// decoded tokens exactly.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/attention/attention.h"
#include "kvlab/attention/backend.h"
#include "kvlab/cache/rerotation.h"
#include "kvlab/quant/quantized_part.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/decoding_stream.h"
#include "kvlab/compress/stream.h"

namespace kvlab {

struct CompressedLayer {
  // Prefill-only: everything held. Streaming: the exact prefix [0, keep_first) only.
  KVSet num;                 // keys/values [Hkv, m, d], bias [Hkv, m], pos [Hkv, m]
  // [Hkv, m] int64: the prompt or decoded position each entry of `num` holds (pos says only what
  // a query may see: a compressed entry is -1 there); -1 = merged or padding.
  at::Tensor origin;
  KVSet den;                 // keys [Hkv, m', d], bias, pos; undefined keys = the numerator set
  double logit_scale = 1.0;  // BUZZ log n
  // ThinK's narrower prefill keys (CompressedKV::key_bytes_saved), which bytes() leaves out; the
  // prefill's entries stay held (a prefill-only layer: decoded tokens are appended whole).
  int64_t key_bytes_saved = 0;
  int64_t n_positions = 0;   // positions seen so far (the next token's position)
  int64_t prefix = 0;        // the exact entries of `num` before the compressed region (--keep-first)
  std::shared_ptr<LayerStream> stream;  // streaming methods: the entries after the prefix
  // --rerotate (cache/rerotation.h): after each step the stream's keys move to contiguous positions
  // ending at the newest token. Only with a stream and no exact prefix.
  std::shared_ptr<Rerotation> rerotation;
  // Heads holding different counts (adakv; prefill-only, one set): each KV head's live entries in
  // a set of its own, no padding, so the bytes held are those of the entries (split_heads makes
  // them from `num`, which is then left empty). Decoded tokens are appended to every head.
  std::vector<KVSet> heads;             // per KV head: keys/values [1, m_h, d], bias [1, m_h], pos [1, m_h]
  std::vector<at::Tensor> head_origin;  // per KV head [1, m_h] int64, as `origin`
  // > 0: an exact sliding-window layer (window_layer below): `num` holds only the positions a
  // later query can still see, pos > n_positions - window, and drops the older ones each step.
  int64_t window = 0;
  // Room to grow (issue 25): after the first decoded token `num` (keys, values, bias, pos) and
  // `origin` are views of the first entries of these buffers, so a decoded token is written in
  // place rather than the whole set copied (at::cat) every step; a buffer doubles when full. A
  // `num` replaced by anything else is simply moved into new buffers at the next append. bytes()
  // counts the entries held, not the spare room (at most as many again).
  struct Room {
    at::Tensor keys, values, bias, pos, origin;
  } room;
  // live_entries() of `num` (a streaming layer: its exact prefix; the stream counts its own),
  // counted once and then kept up to date by attend (a decoded token adds one live entry per head;
  // a window's trim resets it): it was recounted with a handful of ATen calls per layer twice a
  // step. < 0 = not counted yet.
  mutable double live_count = -1;
  // Stored quantized (issue 52; set before CompressedAttention takes the layer): the oldest entries
  // of `num` (per head: of `heads`) hold the dequantized values of what `quant` stores, the newest
  // stay full precision as its window says; decoded tokens join full precision and leave it after
  // the step that attended them. Not for streaming layers or a separate denominator yet.
  std::shared_ptr<const KvQuantizer> quant;
  QuantizedPart quantized;                   // of `num`
  std::vector<QuantizedPart> head_quantized;  // of each of `heads`

  bool has_den() const { return den.keys.defined(); }
  bool ragged() const { return !heads.empty(); }
  int64_t n_kv_heads() const { return ragged() ? int64_t(heads.size()) : num.keys.defined() ? num.keys.size(0) : 0; }
  // num -> heads when num holds padding (bias -inf) and the layer has no stream and no separate
  // denominator; otherwise nothing changes. CompressedAttention does it for every layer it holds.
  void split_heads();
  int64_t bytes() const;     // K, V, bias, pos (and the denominator's) held, the stream's included
  int64_t entries() const;   // numerator entries held per KV head (padding included; ragged: the
                             // longest head), prefix included
  // Entries held per KV head that are not padding (bias > -inf), averaged over the KV heads; the
  // numerator set (the stream's included), the separate denominator set not counted.
  double live_entries() const;
  // What the layer holds for KV head h: {"positions": [...], "weights": [...]} over the live
  // numerator entries in cache order; a merged entry's position is -1, its weight e^bias (the
  // tokens it stands for); exact entries weigh 1.
  nlohmann::json kept(int64_t h) const;
};

// Compresses one layer of an exact prefill with `c`, through compress/layout (the same calls
// replay makes). k, v [Hkv, n, d] at positions 0..n-1; q_obs [Hq, n_obs, d] the queries of the
// last n_obs prompt positions (may be undefined). [0, keep_first) and [n - keep_last, n) stay exact.
// `stream`: a streaming method keeps compressing while decoding (keep_last must then be 0: its own
// window plays that role); false = compress once, as replay does, and append decoded tokens exactly.
// `count_whole` (issue 21, equal memory counted whole): a ratio or entry budget is of the whole
// layer, the exact parts inside it — the region gets the budget less keep_first and keep_last (the
// exact parts shrink when they would take it all). Halvings (--T) stay a budget of the region. A
// streaming method (stream = true) keeps its ratio of the tokens it has seen, unconverted.
// `context`: what the method may read beyond the region (compress/context.h), its inputs over the
// layer's positions 0..n-1; the region sees them narrowed as the keys are.
CompressedLayer compress_layer(const Compressor& c, const CompressOptions& opt, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& q_obs, int64_t keep_first, int64_t keep_last,
                               int layer, int n_layers, double* compress_ms = nullptr, bool stream = false,
                               bool count_whole = false, const Context& context = Context());

// --decode-rule compress (compress/decoding_stream.h): a layer compressed once by compress_layer
// (stream = false) keeps compressing while decoding: its entries after the exact prefix move into a
// stream that compresses them again with `method` every rule.every decoded tokens, to opt's budget
// on the tokens seen (count_whole: of the whole layer, the prefix inside it, as compress_layer
// counted it). `context`: inputs that do not run over positions (out_proj). Refuses a layer that
// already streams, a window layer, and a method whose kept entries are not tokens (naming it).
void compress_while_decoding(CompressedLayer& l, std::shared_ptr<const Compressor> method, const CompressOptions& opt,
                             bool count_whole, const DecodingRule& rule, int layer, int n_layers,
                             const Context& context);

// A sliding layer of a model whose sliding layers interleave with global ones (gemma3: five local
// layers of 512 tokens, then a global one) is never compressed: its cache is already bounded by
// the window, as transformers' is, and every method holds the same window there (kvpress skips
// gemma3's sliding layers too). k, v [Hkv, n, d] at positions 0..n-1 -> the last min(n, window - 1)
// positions, the ones the next query (position n) still sees. Mistral-style models, whose every
// layer slides, are compressed instead (within the window; see CompressedAttention::attend).
CompressedLayer window_layer(const at::Tensor& k, const at::Tensor& v, int64_t window);
// The positions an exact window layer holds after n of them: min(n, window - 1); all n when
// window is 0 (what window_layer keeps, and what exact-cache byte counts charge such a layer).
int64_t window_held(int64_t n, int64_t window);

class CompressedAttention : public AttentionBackend {
 public:
  explicit CompressedAttention(std::vector<CompressedLayer> layers);
  // Appends k_new/v_new exactly at pos0 (= the layer's n_positions), then attends causally over
  // everything held. q [Hq, T, d] -> [Hq, T, d]. A sliding window (window > 0) is refused once a
  // position lies past it: compressed entries have no single position to slide past (issue 24);
  // a window_layer slides instead.
  at::Tensor attend(int layer, const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                    int64_t pos0, int64_t window) override;
  // A compressed cache is made from a prefill; it cannot start a new sequence.
  void reset() override;
  const CompressedLayer& layer(int l) const { return layers_.at(l); }
  int64_t bytes() const;       // over all layers, now
  int64_t window_bytes() const;  // the part of bytes() held by window layers (never compressed)
  bool streams() const;          // whether some layer compresses while decoding
  // Σ over layers of the most each held since construction (a step's new token included before
  // the stream evicts): the peak of the whole cache within one entry per layer.
  int64_t peak_bytes() const;
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  // live_entries averaged over the layers: entries per (layer, KV head), now.
  double live_entries() const;
  // The most live entries per (layer, KV head) held since construction (a step's new token
  // included before the stream evicts), averaged over layers as live_entries is.
  double peak_entries() const;

 private:
  std::vector<CompressedLayer> layers_;
  std::vector<int64_t> peak_;         // per layer, bytes
  std::vector<double> peak_entries_;  // per layer
};

}  // namespace kvlab
