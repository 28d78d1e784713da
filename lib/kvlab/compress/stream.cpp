#include "kvlab/compress/stream.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlab/core/check.h"

namespace kvlab {

at::Tensor stream_attention_probs(const at::Tensor& q, const at::Tensor& query_pos, const at::Tensor& prefix_keys,
                                  const KVSet& held, double logit_scale, const std::string& reduce) {
  const int64_t h_kv = held.keys.size(0), m = held.keys.size(1), d = held.keys.size(2);
  const int64_t h_q = q.size(0), t = q.size(1), g = h_q / h_kv;
  KVLAB_CHECK(h_q == g * h_kv, "stream: {} query heads do not split into groups of {} KV heads", h_q, h_kv);
  const int64_t p = prefix_keys.defined() ? prefix_keys.size(1) : 0;
  auto keys = held.keys.to(at::kDouble);                                                  // [Hkv, m, d]
  if (p > 0) keys = at::cat({prefix_keys.to(keys.device(), at::kDouble), keys}, 1);       // [Hkv, p+m, d]
  auto qg = q.to(keys.device(), at::kDouble).reshape({h_kv, g * t, d});                   // [Hkv, g·T, d]
  auto logits = at::matmul(qg, keys.transpose(1, 2)).mul_(logit_scale / std::sqrt(double(d)));
  logits = logits.view({h_kv, g, t, p + m});                                              // [Hkv, g, T, p+m]
  auto tail = logits.narrow(3, p, m);                                                     // [Hkv, g, T, m]
  if (held.bias.defined()) tail.add_(held.bias.to(at::kDouble).view({h_kv, 1, 1, m}));
  if (held.pos.defined() && query_pos.defined()) {
    auto kp = held.pos.dim() == 1 ? held.pos.view({1, m}).expand({h_kv, m}) : held.pos;  // [Hkv, m]
    auto masked = kp.view({h_kv, 1, 1, m}) > query_pos.to(kp.device()).view({1, 1, t, 1});  // [Hkv, 1, T, m]
    tail.masked_fill_(masked, -std::numeric_limits<double>::infinity());
  }
  auto probs = at::softmax(logits, -1).narrow(3, p, m);                                   // [Hkv, g, T, m]
  if (reduce == "max") return std::get<0>(probs.max(1));
  if (reduce == "sum") return probs.sum(1);
  KVLAB_CHECK(reduce == "mean", "stream: gqa_reduce must be mean, max or sum, got '{}'", reduce);
  return probs.mean(1);                                                                   // [Hkv, T, m]
}

double LayerStream::live_entries() const {
  const KVSet& s = held();
  if (!s.keys.defined() || s.keys.size(0) == 0) return 0.0;
  if (!s.bias.defined()) return double(s.keys.size(1));
  return at::isfinite(s.bias).to(at::kDouble).sum(1).mean().item<double>();
}

KVSet padded_entry_set(const std::vector<std::vector<EntryRow>>& heads, int64_t d, int64_t dv, bool with_values,
                       const at::TensorOptions& opts) {
  const int64_t h = static_cast<int64_t>(heads.size());
  int64_t m = 1;
  for (const auto& rows : heads) m = std::max<int64_t>(m, rows.size());
  auto k = at::zeros({h, m, d}, at::kDouble), v = at::zeros({h, m, dv}, at::kDouble);
  auto b = at::full({h, m}, -std::numeric_limits<double>::infinity(), at::kDouble);
  for (int64_t i = 0; i < h; ++i)
    for (size_t a = 0; a < heads[i].size(); ++a) {
      const EntryRow& e = heads[i][a];
      std::copy(e.key, e.key + d, k[i][a].data_ptr<double>());
      if (with_values) std::copy(e.value, e.value + dv, v[i][a].data_ptr<double>());
      b[i][a] = e.bias;
    }
  KVSet out;
  out.keys = k.to(opts);
  if (with_values) out.values = v.to(opts);
  out.bias = b.to(opts);
  out.pos = at::full({h, m}, -1, opts.dtype(at::kLong));
  return out;
}

KVSet gather_entries(const KVSet& s, const at::Tensor& keep) {
  const int64_t h = keep.size(0), m = keep.size(1);
  KVSet out;
  out.keys = s.keys.gather(1, keep.unsqueeze(-1).expand({h, m, s.keys.size(2)}));
  if (s.values.defined()) out.values = s.values.gather(1, keep.unsqueeze(-1).expand({h, m, s.values.size(2)}));
  if (s.bias.defined()) out.bias = s.bias.gather(1, keep);
  if (s.pos.defined()) out.pos = s.pos.gather(1, keep);
  return out;
}

void append_exact(KVSet& s, const at::Tensor& k, const at::Tensor& v, int64_t pos0) {
  const int64_t h = k.size(0), t = k.size(1);
  auto pos = at::arange(pos0, pos0 + t, s.pos.options()).unsqueeze(0).expand({h, t});  // [Hkv, T]
  s.keys = at::cat({s.keys, k.to(s.keys.scalar_type())}, 1);
  if (s.values.defined()) s.values = at::cat({s.values, v.to(s.values.scalar_type())}, 1);
  s.bias = at::cat({s.bias, at::zeros({h, t}, s.bias.options())}, 1);
  s.pos = at::cat({s.pos, pos}, 1);
}

}  // namespace kvlab
