#include "kvlab/replay/replay.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <tuple>
#include <limits>

#include "kvlab/attention/attention.h"
#include "kvlab/attention/rope.h"
#include "kvlab/quant/quantized_part.h"
#include "kvlab/compress/layout.h"
#include "kvlab/core/check.h"
#include "kvlab/core/text.h"

namespace kvlab {

const std::vector<std::string>& replay_metric_names() {
  static const std::vector<std::string> names = {"rel_err", "bound_ratio_F", "bound_ratio_op", "cosine",
                                                 "rel_err_clamped", "mass_recall", "kept_fraction",
                                                 "compress_ms", "kv_bytes", "bytes_fraction"};
  return names;
}

QueryWindows split_queries(int64_t n_captured, const ReplayProtocol& p, const std::string& where) {
  check_queries_spec(p.eval_queries, "--eval-queries");
  KVLAB_CHECK(p.obs_queries >= 0, "--obs-queries must be >= 0, got {}", p.obs_queries);
  QueryWindows w;
  w.n_eval = p.eval_queries == "all" ? n_captured - p.obs_queries : std::stoll(p.eval_queries.substr(5));
  w.n_obs = p.obs_queries;
  KVLAB_CHECK(w.n_eval >= 1 && w.n_eval + w.n_obs <= n_captured,
              "{}: {} queries were captured, but --eval-queries {} and --obs-queries {} need {}; capture more "
              "(kvlab dump --queries last:{}) or lower --obs-queries (0 = no method may score with queries)",
              where, n_captured, p.eval_queries, p.obs_queries,
              p.eval_queries == "all" ? fmt::format("more than {}", p.obs_queries) : fmt::format("{}", w.n_eval + w.n_obs),
              std::max<int64_t>(w.n_eval, 1) + w.n_obs);
  return w;
}

ReplayUnit make_unit(const at::Tensor& q_all, const at::Tensor& k, const at::Tensor& v, const ReplayProtocol& p,
                     const std::string& where) {
  const auto w = split_queries(q_all.size(1), p, where);
  const int64_t n_all = q_all.size(1);
  at::Device dev(p.device);
  ReplayUnit u;
  u.q = q_all.narrow(1, n_all - w.n_eval, w.n_eval).to(dev).contiguous();                  // [Hq, n_eval, d]
  u.q_obs = q_all.narrow(1, n_all - w.n_eval - w.n_obs, w.n_obs).to(dev).contiguous();     // [Hq, n_obs, d]
  u.k = k.to(dev).contiguous();                                                              // [Hkv, n, d]
  u.v = v.to(dev).contiguous();
  for (int h = 0; h < k.size(0); ++h) u.kv_heads.push_back(h);
  u.ref = exact_reference(u.q, u.k, u.v);
  u.probs = exact_attention_probs(u.q, u.k, /*causal=*/true);
  return u;
}

at::Tensor capture_inv_freq(const CaptureReader& cap) {
  const auto& meta = cap.meta();
  return rope_inv_freq(meta.rope_theta, meta.head_dim,
                       rope_scaling_from_json(meta.rope_scaling, cap.path() + ": rope_scaling"));
}

ReplayUnit load_unit(const CaptureReader& cap, int64_t sample, int layer, const ReplayProtocol& p) {
  return load_unit(cap, sample, layer, p, cap.read_layer(sample, layer));
}

ReplayUnit load_unit(const CaptureReader& cap, int64_t sample, int layer, const ReplayProtocol& p,
                     const LayerQKV& qkv) {
  at::Tensor q = qkv.q, k = qkv.k, v = qkv.v;  // [Hq, n_captured, d], [Hkv, n, d]
  const int h_kv = cap.meta().n_kv_heads, g = cap.meta().n_q_heads / h_kv;
  std::vector<int> heads = p.kv_heads;
  if (!heads.empty() && static_cast<int>(heads.size()) != h_kv) {
    std::vector<int64_t> kv(heads.begin(), heads.end()), qh;
    for (int h : heads)
      for (int j = 0; j < g; ++j) qh.push_back(int64_t(h) * g + j);
    k = k.index_select(0, at::tensor(kv));
    v = v.index_select(0, at::tensor(kv));
    q = q.index_select(0, at::tensor(qh));
  }
  ReplayUnit u = make_unit(q, k, v, p, fmt::format("{}: sample {}", cap.path(), sample));
  u.inv_freq = capture_inv_freq(cap);
  if (!heads.empty()) u.kv_heads = heads;
  u.sample = sample;
  u.layer = layer;
  u.n_layers = cap.meta().n_layers;
  return u;
}

namespace {

at::Tensor positions(int64_t begin, int64_t end, const at::Tensor& like) {
  return at::arange(begin, end, like.options().dtype(at::kLong));
}

// --rerotate. RoPE logits depend only on position differences, so moving the evaluation query
// by the same shift as the tail (the region tokens head h dropped) leaves the query and the tail
// as they are; only keys rotate: the sinks by +shift, a kept region key from its position p to its
// in-cache slot c by c − p + shift. Returns the sink-rotated keys [Hkv, n, d] and the rotated region
// keys [Hkv, m, d].
std::pair<at::Tensor, at::Tensor> rerotate(const ReplayUnit& u, const CompressedKV& cr, int64_t region_begin,
                                           int64_t region_end, const std::string& method) {
  KVLAB_CHECK(cr.kept_idx.defined() && !cr.has_separate_den(),
              "--rerotate: {} merges or samples entries that have no single position; re-rotation applies to "
              "methods that keep keys one to one (streaming_llm, local, h2o, snapkv, pyramidkv, buzz, ...)",
              method);
  KVLAB_CHECK(u.inv_freq.defined(), "--rerotate: the unit has no RoPE frequencies");
  const int64_t h_kv = cr.keys.size(0), m = cr.keys.size(1), r = region_end - region_begin;
  auto idx = cr.kept_idx.to(at::kCPU, at::kLong).contiguous();                // [Hkv, m]
  auto delta = at::zeros({h_kv, m}, at::kLong), shift = at::zeros({h_kv, 1}, at::kLong);
  auto ia = idx.accessor<int64_t, 2>();
  auto da = delta.accessor<int64_t, 2>();
  for (int64_t h = 0; h < h_kv; ++h) {
    std::vector<std::pair<int64_t, int64_t>> kept;                            // (region index, entry)
    for (int64_t j = 0; j < m; ++j)
      if (ia[h][j] >= 0) kept.emplace_back(ia[h][j], j);
    std::sort(kept.begin(), kept.end());
    const int64_t dropped = r - static_cast<int64_t>(kept.size());
    shift[h][0] = dropped;
    for (size_t slot = 0; slot < kept.size(); ++slot)
      da[h][kept[slot].second] = static_cast<int64_t>(slot) - kept[slot].first + dropped;
  }
  at::Tensor k = u.k;
  if (region_begin > 0) {
    k = u.k.clone();
    k.narrow(1, 0, region_begin).copy_(rotate_by(u.k.narrow(1, 0, region_begin),
                                                 shift.expand({h_kv, region_begin}), u.inv_freq));
  }
  return {k, rotate_by(cr.keys, delta, u.inv_freq)};
}

}  // namespace

ReplayOutput replay_attend(const ReplayUnit& u, const Compressor& c, const Budget& b, uint64_t seed,
                           const ReplayProtocol& p, const KvQuantizer* quant) {
  const int64_t n = u.k.size(1), n_q = u.q.size(1), n_obs = u.q_obs.defined() ? u.q_obs.size(1) : 0;
  const int64_t tail = std::min(n, std::max<int64_t>(p.keep_last, n_q));
  const int64_t region_begin = std::min(p.keep_first, n - tail);
  const int64_t region_end = n - tail;

  // Only the observation window: no method sees a query it is judged on.
  LayerKV region = region_of(u.k, u.v, region_begin, region_end, u.q_obs,
                             n_obs ? positions(n - n_q - n_obs, n - n_q, u.k) : at::Tensor(), u.layer, u.n_layers);
  region.context.provide(inputs::rope_inv_freq, u.inv_freq);

  CompressOptions opt;
  opt.budget = b;
  opt.seed = seed;
  const int64_t r = region_end - region_begin;
  if (b.kind == Budget::Kind::bytes && r > 0) {
    // Equal bytes, counted whole (issue 52): the most entries of the layer (exact parts included)
    // whose K and V, stored by `quant` or in full precision, fit the fraction; the region gets the
    // rest (at least one entry).
    const int64_t m = entries_for_bytes(quant, n, u.k.size(0), u.k.size(2), int64_t(u.k.element_size()), b.bytes);
    opt.budget = Budget::of_entries(std::max<int64_t>(1, m - (n - r)));
  }

  ReplayOutput out;
  out.region_begin = region_begin;
  out.region_end = region_end;
  auto t0 = std::chrono::steady_clock::now();
  if (r > 0) {
    out.region = c.compress(region, opt);
  } else {
    out.region = keep_all(region);
  }
  out.compress_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto& cr = out.region;
  KVLAB_CHECK(!cr.pruned_channels.defined() || (!quant && b.kind != Budget::Kind::bytes && !p.rerotate),
              "--method {}: its keys lose channels (ThinK), which kvlab counts only in a full-precision cache; not yet "
              "with a quantizer, --bytes or --rerotate (issue 53): give --ratio or --budget", c.name());

  at::Tensor k = u.k, region_keys = cr.keys;  // [Hkv, n, d], [Hkv, m, d]
  if (p.rerotate) std::tie(k, region_keys) = rerotate(u, cr, region_begin, region_end, c.name());
  KVSet num = assemble(k, u.v, region_begin, region_end, region_keys, cr.values, cr.bias);
  // Heads holding different counts (adakv) are padded here (bias -inf); a cache holds only the live
  // entries (generation splits the heads), so bytes count those.
  auto live = [](const at::Tensor& bias, int64_t m, int64_t h) {
    return bias.defined() ? at::isfinite(bias).sum().item<int64_t>() : m * h;
  };
  const int64_t live_entries = live(num.bias, num.keys.size(1), num.keys.size(0));  // over the KV heads
  QuantizedPart quantized;
  if (quant) {
    KVLAB_CHECK(!cr.has_separate_den(), "{}: a method with a separate denominator set ({}) is not quantized yet "
                "(issue 52)", quant->name(), c.name());
    KVLAB_CHECK(live_entries == num.keys.size(0) * num.keys.size(1), "{}: {} keeps different counts per KV head, "
                "which replay pads; quantizing it is not supported in replay yet (issue 52): use generate", quant->name(),
                c.name());
    settle_quantized(num.keys, num.values, quantized, *quant, 0);
    out.kv_bytes = quantized_kv_bytes(num.keys, num.values, quantized);
  } else {
    out.kv_bytes = live_entries * num.keys.size(2) * int64_t(num.keys.element_size() + num.values.element_size()) -
                   cr.key_bytes_saved();  // ThinK's narrower keys
  }
  AttentionOptions ao;
  ao.query_pos = positions(n - n_q, n, u.k);                                // the evaluation queries
  ao.logit_scale = cr.logit_scale;
  if (cr.has_separate_den()) {
    KVSet den = assemble(u.k, u.v, region_begin, region_end, cr.den_keys, at::Tensor(), cr.den_bias);
    out.z = attention(u.q, num, &den, ao);
    out.kv_bytes += live(cr.den_bias, cr.den_keys.size(1), cr.den_keys.size(0)) * cr.den_keys.size(2) *
                    int64_t(cr.den_keys.element_size());  // the region's own keys (no values)
  } else {
    out.z = attention(u.q, num, nullptr, ao);
  }
  return out;
}

nlohmann::json replay_kept(const ReplayOutput& out, int64_t n) {
  const auto& cr = out.region;
  const int64_t h_kv = cr.keys.size(0), m = cr.keys.size(1);
  auto bias = cr.bias.defined() ? cr.bias.to(at::kCPU, at::kDouble).contiguous() : at::zeros({h_kv, m}, at::kDouble);
  auto idx = cr.kept_idx.defined() ? cr.kept_idx.to(at::kCPU, at::kLong).contiguous()
                                   : at::full({h_kv, m}, -1, at::kLong);
  nlohmann::json heads = nlohmann::json::array();
  for (int64_t h = 0; h < h_kv; ++h) {
    std::vector<int64_t> pos;
    std::vector<double> w;
    for (int64_t p = 0; p < out.region_begin; ++p) pos.push_back(p), w.push_back(1.0);
    for (int64_t j = 0; j < m; ++j) {
      const double b = bias[h][j].item<double>();
      if (!std::isfinite(b)) continue;  // padding
      const int64_t i = idx[h][j].item<int64_t>();
      pos.push_back(i >= 0 ? out.region_begin + i : -1);
      w.push_back(std::exp(b));
    }
    for (int64_t p = out.region_end; p < n; ++p) pos.push_back(p), w.push_back(1.0);
    heads.push_back({{"positions", pos}, {"weights", w}});
  }
  return heads;
}

nlohmann::json replay_rows(const ReplayUnit& u, const std::string& sample_id, const MethodSpec& m,
                           const Budget& b, uint64_t seed, const ReplayProtocol& p, nlohmann::json* kept) {
  auto out = replay_attend(u, *m.compressor, b, seed, p, m.quant.get());
  if (kept) *kept = replay_kept(out, u.k.size(1));
  const int64_t n = u.k.size(1), h_kv = u.k.size(0), g = u.q.size(0) / h_kv;
  const int64_t n_obs = u.q_obs.defined() ? u.q_obs.size(1) : 0;
  const int64_t region = out.region_end - out.region_begin;
  const int64_t exact_entries = n - region;
  const auto& cr = out.region;

  // Per-head kept entries (numerator plus any separate denominator set).
  const double inf = std::numeric_limits<double>::infinity();
  auto real = [&](const at::Tensor& bias, int64_t m_entries) {
    return bias.defined() ? (bias != -inf).sum(1).to(at::kDouble) : at::full({h_kv}, double(m_entries), at::kDouble);
  };
  auto kept_per_head = real(cr.bias, cr.keys.size(1)).cpu();                  // [Hkv]
  if (cr.has_separate_den()) kept_per_head = kept_per_head + real(cr.den_bias, cr.den_keys.size(1)).cpu();

  at::Tensor kept_mask;  // [Hkv, n] bool, selection methods only
  if (cr.kept_idx.defined()) {
    kept_mask = at::zeros({h_kv, n}, u.k.options().dtype(at::kBool));
    kept_mask.narrow(1, 0, out.region_begin).fill_(true);
    kept_mask.narrow(1, out.region_end, n - out.region_end).fill_(true);
    // Count hits per position so padding (-1, clamped to 0) can never clear a real entry.
    auto idx = cr.kept_idx.to(at::kLong);                                     // [Hkv, m]
    auto hits = at::zeros({h_kv, n}, idx.options());
    hits.scatter_add_(1, idx.clamp_min(0) + out.region_begin, (idx >= 0).to(at::kLong));
    kept_mask = kept_mask | (hits > 0);
  }

  nlohmann::json rows = nlohmann::json::array();
  for (int64_t h = 0; h < h_kv; ++h) {
    ExactReference ref;
    ref.out = u.ref.out.narrow(0, h * g, g);
    ref.prob_l2 = u.ref.prob_l2.narrow(0, h * g, g);
    ref.v_frob = u.ref.v_frob.narrow(0, h, 1);
    ref.v_op = u.ref.v_op.narrow(0, h, 1);
    auto metrics = compare_to_exact(out.z.narrow(0, h * g, g), ref);
    double kept = kept_per_head[h].item<double>();
    nlohmann::json row = {{"sample", u.sample},
                          {"sample_id", sample_id},
                          {"layer", u.layer},
                          {"head", u.kv_heads[static_cast<size_t>(h)]},
                          {"method", m.label()},
                          {"params", m.compressor->params()},
                          {"seed", seed},
                          {"n_tokens", n},
                          {"n_q", u.q.size(1)},
                          {"n_obs", n_obs},
                          {"eval_queries", {n - u.q.size(1), n}},
                          {"obs_queries", {n - u.q.size(1) - n_obs, n - u.q.size(1)}},
                          {"region_tokens", region},
                          {"kept_entries", kept},
                          {"kept_fraction", (kept + double(exact_entries)) / double(n)},
                          {"rel_err", metrics.rel_err},
                          {"bound_ratio_F", metrics.bound_ratio_F},
                          {"bound_ratio_op", metrics.bound_ratio_op},
                          {"cosine", metrics.cosine},
                          {"rel_err_clamped", metrics.rel_err_clamped},
                          {"compress_ms", out.compress_ms / double(h_kv)},
                          {"kv_bytes", out.kv_bytes / h_kv},
                          // of the full-precision layer's K and V: what --bytes budgets
                          {"bytes_fraction", double(out.kv_bytes) / double(u.k.numel() + u.v.numel()) /
                                                 double(u.k.element_size())}};
    if (m.quant) row["kv_quant"] = m.quant->name();
    if (p.rerotate) row["rerotate"] = true;
    const nlohmann::json setting = b.to_json();
    for (auto it = setting.begin(); it != setting.end(); ++it) row[it.key()] = it.value();
    if (kept_mask.defined())
      row["mass_recall"] = mass_recall(u.probs.narrow(0, h * g, g), kept_mask.narrow(0, h, 1));
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvlab
