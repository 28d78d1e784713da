#include "kvlab/quant/quantized_part.h"

#include <algorithm>

#include "kvlab/core/check.h"

namespace kvlab {
namespace {

// Entries [from, to) of t [Hkv, m, d] replaced in place by their round trip.
void quantize_range(at::Tensor& t, int64_t from, int64_t to, bool keys, const KvQuantizer& q, int64_t* bytes) {
  if (to <= from) return;
  at::Tensor part = t.narrow(1, from, to - from);  // [Hkv, to - from, d], a view
  part.copy_(q.round_trip(part.contiguous(), keys, bytes));
}

}  // namespace

void settle_quantized(at::Tensor& keys, at::Tensor& values, QuantizedPart& part, const KvQuantizer& q,
                      int64_t t_before) {
  if (!keys.defined()) return;
  KVLAB_CHECK(values.defined(), "{}: a set without values (a separate denominator) is not quantized", q.name());
  const int64_t m = keys.size(1);
  if (t_before == 0) {
    q.check_head_dim(keys.size(2));
    keys = keys.clone();
    values = values.clone();
    part = QuantizedPart{};
  }
  const int64_t qk = q.quantized_after(part.keys, t_before, m, /*keys=*/true);
  const int64_t qv = q.quantized_after(part.values, t_before, m, /*keys=*/false);
  KVLAB_CHECK(qk >= part.keys && qv >= part.values && qk <= m && qv <= m,
              "{}: quantized entries must only grow within the set ({} -> {} keys, {} -> {} values of {})",
              q.name(), part.keys, qk, part.values, qv, m);
  quantize_range(keys, part.keys, qk, true, q, &part.key_bytes);
  quantize_range(values, part.values, qv, false, q, &part.value_bytes);
  part.keys = qk, part.values = qv;
}

int64_t held_kv_bytes(const KvQuantizer* q, int64_t m, int64_t H, int64_t D, int64_t elt) {
  const int64_t full = H * D * elt;  // one entry's keys (or values), every head
  if (!q) return 2 * m * full;
  const int64_t qk = q->quantized_after(0, 0, m, true), qv = q->quantized_after(0, 0, m, false);
  return q->stored_bytes(qk, H, D, true) + q->stored_bytes(qv, H, D, false) + (2 * m - qk - qv) * full;
}

int64_t entries_for_bytes(const KvQuantizer* q, int64_t n, int64_t H, int64_t D, int64_t elt, double fraction) {
  const double target = fraction * double(2 * n * H * D * elt) * (1 + 1e-12);  // 0.3 * 10 is 2.999...
  for (int64_t m = n; m > 1; --m)
    if (double(held_kv_bytes(q, m, H, D, elt)) <= target) return m;
  return std::min<int64_t>(n, 1);
}

int64_t quantized_kv_bytes(const at::Tensor& keys, const at::Tensor& values, const QuantizedPart& part) {
  if (!keys.defined()) return 0;
  const int64_t per_key = keys.size(0) * keys.size(2) * int64_t(keys.element_size());  // one entry, every head
  const int64_t per_value = values.defined() ? values.size(0) * values.size(2) * int64_t(values.element_size()) : 0;
  const int64_t m = keys.size(1);
  return (m - part.keys) * per_key + part.key_bytes + (values.defined() ? (m - part.values) * per_value + part.value_bytes : 0);
}

}  // namespace kvlab
