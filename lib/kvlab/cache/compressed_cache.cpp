#include "kvlab/cache/compressed_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kvlab/compress/held_set.h"
#include "kvlab/compress/layout.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {
int64_t nbytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t set_bytes(const KVSet& s) { return nbytes(s.keys) + nbytes(s.values) + nbytes(s.bias) + nbytes(s.pos); }

// [a; b] along the entries (b's pos is [Hkv, m]).
KVSet concat(const KVSet& a, const KVSet& b) {
  if (a.keys.size(1) == 0) return b;
  KVSet out;
  out.keys = at::cat({a.keys, b.keys.to(a.keys.scalar_type())}, 1);
  if (b.values.defined()) out.values = at::cat({a.values, b.values.to(a.values.scalar_type())}, 1);
  out.bias = at::cat({a.bias, b.bias.to(a.bias.scalar_type())}, 1);
  out.pos = at::cat({a.pos, b.pos}, 1);
  return out;
}
}  // namespace

namespace {
// The decoded tokens k_new, v_new [Hkv, T, d] at pos0.. appended exactly (bias 0) to the layer's
// numerator set and origins, written into its room (no copy of the set); each adds one live entry
// per head.
void append_decoded(CompressedLayer& l, const at::Tensor& k_new, const at::Tensor& v_new, int64_t pos0) {
  if (!l.origin.defined()) l.origin = l.num.pos.clone();  // a layer built by hand: every entry exact
  const int64_t h = k_new.size(0), t = k_new.size(1);
  const at::Tensor new_pos = at::arange(pos0, pos0 + t, l.num.pos.options()).unsqueeze(0).expand({h, t});  // [Hkv, T]
  append_in_room(l.room.keys, l.num.keys, k_new);
  append_in_room(l.room.values, l.num.values, v_new);
  append_in_room(l.room.bias, l.num.bias, at::zeros({h, t}, l.num.bias.options()));
  append_in_room(l.room.pos, l.num.pos, new_pos);
  append_in_room(l.room.origin, l.origin, new_pos.to(l.origin.scalar_type()));
  if (l.live_count >= 0) l.live_count += double(t);
}
}  // namespace

int64_t CompressedLayer::bytes() const {
  // K and V as stored (quantized entries as their quantizer counts them), bias and positions.
  auto held = [](const KVSet& s, const QuantizedPart& q) {
    return quantized_kv_bytes(s.keys, s.values, q) + nbytes(s.bias) + nbytes(s.pos);
  };
  int64_t ragged_bytes = 0;
  for (size_t h = 0; h < heads.size(); ++h)
    ragged_bytes += held(heads[h], h < head_quantized.size() ? head_quantized[h] : QuantizedPart{});
  return held(num, quantized) + set_bytes(den) + ragged_bytes + (stream ? set_bytes(stream->held()) : 0) +
         (stream && stream->den() ? set_bytes(*stream->den()) : 0) - key_bytes_saved;
}

void CompressedLayer::split_heads() {
  if (ragged() || stream || has_den() || !num.keys.defined() || !num.bias.defined() || num.keys.size(0) < 2) return;
  auto live = at::isfinite(num.bias);  // [Hkv, m]
  if (live.all().item<bool>()) return;
  const at::Tensor org = origin.defined() ? origin : num.pos;
  const at::Tensor pos = num.pos.dim() == 2 ? num.pos : num.pos.unsqueeze(0).expand({num.keys.size(0), num.pos.size(0)});
  for (int64_t h = 0; h < num.keys.size(0); ++h) {
    auto idx = live[h].nonzero().squeeze(1);  // [m_h]
    KVSet s;
    s.keys = num.keys.narrow(0, h, 1).index_select(1, idx).contiguous();      // [1, m_h, d]
    s.values = num.values.narrow(0, h, 1).index_select(1, idx).contiguous();  // [1, m_h, d]
    s.bias = num.bias.narrow(0, h, 1).index_select(1, idx).contiguous();      // [1, m_h]
    s.pos = pos.narrow(0, h, 1).index_select(1, idx).contiguous();            // [1, m_h]
    heads.push_back(std::move(s));
    head_origin.push_back(org.narrow(0, h, 1).index_select(1, idx).contiguous());
  }
  num = KVSet{};
  origin = at::Tensor();
}

namespace {
// Per KV head: the number of entries with a finite bias. bias [Hkv, m] (undefined = all live).
at::Tensor live_per_head(const KVSet& s) {
  if (!s.keys.defined()) return at::Tensor();
  if (!s.bias.defined()) return at::full({s.keys.size(0)}, s.keys.size(1), at::kDouble);
  return at::isfinite(s.bias).to(at::kDouble).sum(1).to(at::kCPU);  // [Hkv]
}
}  // namespace

double CompressedLayer::live_entries() const {
  if (ragged()) {
    double e = 0;
    for (const auto& s : heads) e += double(s.keys.size(1));
    return e / double(heads.size());
  }
  if (live_count < 0) {
    const at::Tensor n = live_per_head(num);
    live_count = n.defined() && n.numel() ? n.mean().item<double>() : 0.0;
  }
  // A streaming layer's `num` is its exact prefix, which never changes: its count plus the stream's.
  return live_count + (stream ? stream->live_entries() : 0.0);
}

nlohmann::json CompressedLayer::kept(int64_t h) const {
  std::vector<int64_t> positions;
  std::vector<double> weights;
  auto add = [&](const KVSet& s, const at::Tensor& org, int64_t row) {
    if (!s.keys.defined() || s.keys.size(1) == 0) return;
    auto b = s.bias.defined() ? s.bias[row].to(at::kCPU, at::kDouble).contiguous()
                              : at::zeros({s.keys.size(1)}, at::kDouble);
    auto o = org[row].to(at::kCPU, at::kLong).contiguous();
    for (int64_t i = 0; i < b.size(0); ++i) {
      const double bi = b[i].item<double>();
      if (!std::isfinite(bi)) continue;
      positions.push_back(o[i].item<int64_t>());
      weights.push_back(std::exp(bi));
    }
  };
  if (ragged()) {
    add(heads.at(h), head_origin.at(h), 0);
    return {{"positions", positions}, {"weights", weights}};
  }
  add(num, origin.defined() ? origin : num.pos, h);
  if (stream) {
    const KVSet& held = stream->held();
    add(held, held.pos.dim() == 2 ? held.pos : held.pos.unsqueeze(0).expand({held.keys.size(0), held.pos.size(0)}), h);
  }
  return {{"positions", positions}, {"weights", weights}};
}

int64_t CompressedLayer::entries() const {
  if (ragged()) {
    int64_t m = 0;
    for (const auto& s : heads) m = std::max(m, s.keys.size(1));
    return m;
  }
  return num.keys.size(1) + (stream ? stream->held().keys.size(1) : 0);
}

CompressedLayer compress_layer(const Compressor& c, const CompressOptions& opt, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& q_obs, int64_t keep_first, int64_t keep_last,
                               int layer, int n_layers, double* compress_ms, bool stream, bool count_whole,
                               const Context& context) {
  const int64_t n = k.size(1), n_obs = q_obs.defined() ? q_obs.size(1) : 0;
  CompressOptions region_opt = opt;
  const bool whole = count_whole && opt.budget.is_set() && !opt.budget.is_halvings() && n > 0;
  if (whole) {
    // Equal memory counted whole: the budget is of the whole layer, exact parts included; when they
    // would take all of it they shrink (sinks to ⌊(B−1)/2⌋, then the tail) so one region entry remains.
    const int64_t b = opt.budget.entries_for(n);
    if (keep_first + keep_last >= b) {
      keep_first = std::min(keep_first, (b - 1) / 2);
      keep_last = std::min(keep_last, b - 1 - keep_first);
    }
  }
  const int64_t end = n - std::min(n, keep_last), begin = std::min(keep_first, end);
  // With exact parts the region's budget is what they leave, in entries; without, the budget stays as
  // given, so a ratio reaches the method as a ratio (ChunkPress and ChunkKV count their chunks' shares
  // from the fraction itself, kvpress's rule: 254 / 1,017 in place of 0.25 kept 31 of a 128-chunk, not 32).
  if (whole && end > begin && (begin > 0 || end < n))
    region_opt.budget = Budget::of_entries(std::max<int64_t>(1, opt.budget.entries_for(n) - begin - (n - end)));
  LayerKV region = region_of(k, v, begin, end, q_obs,
                             n_obs ? at::arange(n - n_obs, n, k.options().dtype(at::kLong)) : at::Tensor(), layer,
                             n_layers);
  KVLAB_CHECK(!context.has(inputs::attention_sums) || n_obs == n,
              "compress_layer: attention sums need every prompt query ({} of {})", n_obs, n);
  region.context = context.narrowed(begin, end - begin);
  CompressedLayer out;
  out.n_positions = n;
  out.prefix = begin;
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<LayerStream> s = stream ? c.start_stream(region, opt) : nullptr;  // r x tokens seen
  if (s) {
    KVLAB_CHECK(keep_last == 0, "--keep-last {}: {} streams while decoding and keeps its own recent window; "
                "--keep-last applies to prefill-only methods (or give --prefill-only)", keep_last, c.name());
    out.num = assemble(k, v, begin, n, k.narrow(1, 0, 0), v.narrow(1, 0, 0),
                       at::zeros({k.size(0), 0}, k.options()));  // the prefix [0, begin) only
    out.origin = out.num.pos.clone();
    out.stream = std::move(s);
  } else {
    CompressedKV cr = end > begin ? c.compress(region, region_opt) : keep_all(region);
    out.num = assemble(k, v, begin, end, cr.keys, cr.values, cr.bias);
    // Origins: the exact parts' positions; a compressed entry's region index + begin (-1 merged).
    at::Tensor kept = cr.kept_idx.defined()
                          ? at::where(cr.kept_idx >= 0, cr.kept_idx + begin, cr.kept_idx).to(at::kLong)
                          : at::full({k.size(0), cr.keys.size(1)}, -1, k.options().dtype(at::kLong));
    const auto lopt = k.options().dtype(at::kLong);
    out.origin = at::cat({at::arange(0, begin, lopt).unsqueeze(0).expand({k.size(0), begin}), kept.to(k.device()),
                          at::arange(end, n, lopt).unsqueeze(0).expand({k.size(0), n - end})}, 1);
    if (cr.has_separate_den()) out.den = assemble(k, v, begin, end, cr.den_keys, at::Tensor(), cr.den_bias);
    out.logit_scale = cr.logit_scale;
    out.key_bytes_saved = cr.key_bytes_saved();
  }
  if (compress_ms) *compress_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void compress_while_decoding(CompressedLayer& l, std::shared_ptr<const Compressor> method, const CompressOptions& opt,
                             bool count_whole, const DecodingRule& rule, int layer, int n_layers,
                             const Context& context) {
  KVLAB_CHECK(method, "compress_while_decoding: no method");
  KVLAB_CHECK(!l.stream && l.window == 0 && !l.ragged(), "--decode-rule compress: layer {} already streams, slides "
              "or holds heads apart", layer);
  const int64_t m = l.num.keys.size(1), p = std::min(l.prefix, m);
  KVSet held;  // the entries after the prefix: keys, values [Hkv, m - p, d], bias, true positions
  held.keys = l.num.keys.narrow(1, p, m - p);
  held.values = l.num.values.narrow(1, p, m - p);
  held.bias = l.num.bias.defined() ? l.num.bias.narrow(1, p, m - p) : at::Tensor();
  held.pos = (l.origin.defined() ? l.origin : l.num.pos).narrow(1, p, m - p).contiguous();
  require_tokens(method->name(), held.pos, held.bias, l.has_den(), l.logit_scale);
  l.stream = start_decoding_stream(std::move(method), std::move(held), l.n_positions - p, opt, count_whole ? p : 0,
                                   rule, layer, n_layers, context);
  l.num = KVSet{l.num.keys.narrow(1, 0, p), l.num.values.narrow(1, 0, p),
                l.num.bias.defined() ? l.num.bias.narrow(1, 0, p) : at::Tensor(), l.num.pos.narrow(1, 0, p)};
  if (l.origin.defined()) l.origin = l.origin.narrow(1, 0, p);
  l.live_count = -1;
}

int64_t window_held(int64_t n, int64_t window) { return window > 0 ? std::min(n, window - 1) : n; }

CompressedLayer window_layer(const at::Tensor& k, const at::Tensor& v, int64_t window) {
  KVLAB_CHECK(window > 0, "window_layer: window must be > 0, got {}", window);
  const int64_t n = k.size(1), first = n - window_held(n, window);
  CompressedLayer out;
  out.window = window;
  out.n_positions = n;
  out.num.keys = k.narrow(1, first, n - first).contiguous();    // [Hkv, m, d]
  out.num.values = v.narrow(1, first, n - first).contiguous();  // [Hkv, m, d]
  out.num.bias = at::zeros({k.size(0), n - first}, k.options());
  out.num.pos = at::arange(first, n, k.options().dtype(at::kLong)).unsqueeze(0).expand({k.size(0), n - first}).contiguous();
  out.origin = out.num.pos.clone();
  return out;
}

CompressedAttention::CompressedAttention(std::vector<CompressedLayer> layers) : layers_(std::move(layers)) {
  for (auto& l : layers_) {
    l.split_heads();  // heads of different counts hold no padding
    KVLAB_CHECK(!l.rerotation || l.stream, "--rerotate: re-rotation moves a streaming method's entries while it "
                "decodes; this layer's method compresses once (see 'kvlab replay --list-methods')");
    if (l.quant) {
      KVLAB_CHECK(!l.stream, "{}: a method that compresses while decoding is not quantized yet (issue 52); "
                  "give --prefill-only", l.quant->name());
      KVLAB_CHECK(!l.has_den(), "{}: a method with a separate denominator set (subgen, balancekv_mr) is not "
                  "quantized yet (issue 52)", l.quant->name());
      settle_quantized(l.num.keys, l.num.values, l.quantized, *l.quant, 0);
      l.head_quantized.assign(l.heads.size(), QuantizedPart{});
      for (size_t h = 0; h < l.heads.size(); ++h) settle_quantized(l.heads[h].keys, l.heads[h].values, l.head_quantized[h], *l.quant, 0);
    }
    peak_.push_back(l.bytes());
    peak_entries_.push_back(l.live_entries());
  }
}

at::Tensor CompressedAttention::attend(int layer, const at::Tensor& q, const at::Tensor& k_new,
                                       const at::Tensor& v_new, int64_t pos0, int64_t window) {
  CompressedLayer& l = layers_.at(layer);
  KVLAB_CHECK(pos0 == l.n_positions, "compressed cache: layer {} is at position {} but the forward starts at {}",
              layer, l.n_positions, pos0);
  KVLAB_CHECK(window <= 0 || l.window > 0 || pos0 + k_new.size(1) <= window,
              "compressed cache: layer {} attends through a sliding window of {} tokens and position "
              "{} lies past it; compressing a sliding-window layer is not supported yet (issue 24): "
              "use a prompt and --max-new-tokens within the window, or a full-attention model",
              layer, window, pos0 + k_new.size(1) - 1);
  l.n_positions += k_new.size(1);
  AttentionOptions ao;
  ao.query_pos = at::arange(pos0, pos0 + q.size(1), q.options().dtype(at::kLong));  // [T]
  at::Tensor out;
  if (l.window > 0) {
    // Exact, through the window; then only what the next query still sees stays.
    append_decoded(l, k_new, v_new, pos0);
    ao.window = l.window;
    out = attention(q, l.num, nullptr, ao);
    peak_[layer] = std::max(peak_[layer], l.bytes());
    peak_entries_[layer] = std::max(peak_entries_[layer], l.live_entries());
    const int64_t m = l.num.keys.size(1);
    const int64_t drop = m - window_held(m, l.window);  // entries are in position order
    if (drop > 0) {
      l.num.keys = l.num.keys.narrow(1, drop, m - drop).contiguous();
      l.num.values = l.num.values.narrow(1, drop, m - drop).contiguous();
      l.num.bias = l.num.bias.narrow(1, drop, m - drop).contiguous();
      l.num.pos = l.num.pos.narrow(1, drop, m - drop).contiguous();
      l.origin = l.num.pos.clone();
      l.live_count = -1;
    }
  } else if (l.stream) {
    l.stream->push(k_new, v_new, pos0);
    ao.logit_scale = l.stream->logit_scale();
    if (const KVSet* d = l.stream->den()) {
      const KVSet den = concat(l.num, *d);  // the exact prefix is in both sets
      out = attention(q, concat(l.num, l.stream->held()), &den, ao);
    } else {
      out = attention(q, concat(l.num, l.stream->held()), nullptr, ao);
    }
    peak_[layer] = std::max(peak_[layer], l.bytes());
    peak_entries_[layer] = std::max(peak_entries_[layer], l.live_entries());
    l.stream->settle(q, l.num.keys.size(1) ? l.num.keys : at::Tensor());
    if (l.rerotation) {
      KVLAB_CHECK(l.num.keys.size(1) == 0, "--rerotate: layer {} has an exact prefix of {} entries (--keep-first); "
                  "re-rotation moves only a stream's own entries, so use --keep-first 0", layer, l.num.keys.size(1));
      l.rerotation->apply(*l.stream);
    }
  } else if (l.ragged()) {
    // Each KV head over its own entries, with its group of query heads. q [Hq, T, d].
    const int64_t h_kv = static_cast<int64_t>(l.heads.size()), g = q.size(0) / h_kv;
    const auto lopt = k_new.options().dtype(at::kLong);
    ao.logit_scale = l.logit_scale;
    std::vector<at::Tensor> outs;
    std::vector<int64_t> before(h_kv);
    for (int64_t h = 0; h < h_kv; ++h) {
      before[h] = l.heads[h].keys.size(1);
      append_exact(l.heads[h], k_new.narrow(0, h, 1), v_new.narrow(0, h, 1), pos0);
      l.head_origin[h] = at::cat({l.head_origin[h], at::arange(pos0, pos0 + k_new.size(1), lopt).unsqueeze(0)}, 1);
      outs.push_back(attention(q.narrow(0, h * g, g), l.heads[h], nullptr, ao));  // [g, T, d]
    }
    out = at::cat(outs, 0);  // [Hq, T, d]
    peak_[layer] = std::max(peak_[layer], l.bytes());
    peak_entries_[layer] = std::max(peak_entries_[layer], l.live_entries());
    if (l.quant)
      for (int64_t h = 0; h < h_kv; ++h) settle_quantized(l.heads[h].keys, l.heads[h].values, l.head_quantized[h], *l.quant, before[h]);
  } else {
    const int64_t before = l.num.keys.size(1);
    append_decoded(l, k_new, v_new, pos0);
    if (l.has_den()) append_exact(l.den, k_new, at::Tensor(), pos0);
    ao.logit_scale = l.logit_scale;
    out = attention(q, l.num, l.has_den() ? &l.den : nullptr, ao);
    peak_[layer] = std::max(peak_[layer], l.bytes());
    peak_entries_[layer] = std::max(peak_entries_[layer], l.live_entries());
    // Entries leave full precision after the step that attended them (transformers' and KIVI's order).
    if (l.quant) settle_quantized(l.num.keys, l.num.values, l.quantized, *l.quant, before);
  }
  return out;
}

void CompressedAttention::reset() {
  KVLAB_FAIL("a compressed cache is built from a prefill and cannot start a new sequence");
}

int64_t CompressedAttention::bytes() const {
  int64_t b = 0;
  for (const auto& l : layers_) b += l.bytes();
  return b;
}

int64_t CompressedAttention::window_bytes() const {
  int64_t b = 0;
  for (const auto& l : layers_)
    if (l.window > 0) b += l.bytes();
  return b;
}

bool CompressedAttention::streams() const {
  for (const auto& l : layers_)
    if (l.stream) return true;
  return false;
}

double CompressedAttention::live_entries() const {
  double e = 0;
  for (const auto& l : layers_) e += l.live_entries();
  return layers_.empty() ? 0.0 : e / double(layers_.size());
}

double CompressedAttention::peak_entries() const {
  double e = 0;
  for (double p : peak_entries_) e += p;
  return peak_entries_.empty() ? 0.0 : e / double(peak_entries_.size());
}

int64_t CompressedAttention::peak_bytes() const {
  int64_t b = 0;
  for (int64_t p : peak_) b += p;
  return b;
}

}  // namespace kvlab
