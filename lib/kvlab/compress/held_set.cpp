#include "kvlab/compress/held_set.h"

#include <algorithm>
#include <cstring>

#include "kvlab/attention/rope.h"
#include "kvlab/compress/stream.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {
// A new [Hkv, capacity, ...] buffer holding t's [Hkv, m, ...] in its first m entries.
at::Tensor with_room(const at::Tensor& t, int64_t capacity) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = capacity;
  at::Tensor buf = at::empty(shape, t.options());
  buf.narrow(1, 0, t.size(1)).copy_(t);
  return buf;
}

// Moves, in each head's row of the contiguous buffer `buf` [Hkv, capacity, r...], the entries at
// `keep` (m' per head, or one row for every head; strictly ascending) to the front, run by run.
void compact_cpu(at::Tensor& buf, const std::vector<int64_t>& keep, int64_t m_new, bool shared) {
  const int64_t h = buf.size(0), cap = buf.size(1);
  const int64_t row = buf.numel() / std::max<int64_t>(1, h * cap) * static_cast<int64_t>(buf.element_size());
  char* base = static_cast<char*>(buf.data_ptr());
  for (int64_t i = 0; i < h; ++i) {
    const int64_t* idx = keep.data() + (shared ? 0 : i * m_new);
    char* head = base + i * cap * row;
    for (int64_t a = 0; a < m_new;) {
      int64_t b = a + 1;
      while (b < m_new && idx[b] == idx[b - 1] + 1) ++b;  // a run of consecutive entries
      if (idx[a] != a) std::memmove(head + a * row, head + idx[a] * row, static_cast<size_t>((b - a) * row));
      a = b;
    }
  }
}
}  // namespace

KVSet region_entries(const LayerKV& kv) {
  const int64_t h = kv.n_kv_heads(), n = kv.n_tokens();
  KVSet s;
  s.keys = kv.keys;
  s.values = kv.values;
  s.bias = at::zeros({h, n}, kv.keys.options());
  s.pos = at::arange(kv.pos0, kv.pos0 + n, kv.keys.options().dtype(at::kLong)).view({1, n}).expand({h, n});
  return s;
}

void append_in_room(at::Tensor& buf, at::Tensor& live, const at::Tensor& x_new) {
  const int64_t m = live.size(1), t = x_new.size(1);
  const bool in_place = buf.defined() && buf.data_ptr() == live.data_ptr() && buf.size(1) >= m + t &&
                        buf.stride(1) == live.stride(1) && buf.stride(0) == live.stride(0);
  if (!in_place) buf = with_room(live, std::max<int64_t>(2 * (m + t), 64));
  buf.narrow(1, m, t).copy_(x_new);
  live = buf.narrow(1, 0, m + t);
}

HeldSet::HeldSet(const KVSet& s) {
  KVLAB_CHECK(s.keys.dim() == 3 && s.values.defined() && s.bias.defined() && s.pos.defined() && s.pos.dim() == 2,
              "HeldSet: needs keys, values [Hkv, m, d], bias and pos [Hkv, m]");
  m_ = s.keys.size(1);
  const int64_t capacity = m_ + 64;
  buf_.keys = with_room(s.keys, capacity);
  buf_.values = with_room(s.values, capacity);
  buf_.bias = with_room(s.bias, capacity);
  buf_.pos = with_room(s.pos, capacity);
  refresh_view();
}

void HeldSet::refresh_view() {
  view_.keys = buf_.keys.narrow(1, 0, m_);      // [Hkv, m, d]
  view_.values = buf_.values.narrow(1, 0, m_);  // [Hkv, m, d]
  view_.bias = buf_.bias.narrow(1, 0, m_);      // [Hkv, m]
  view_.pos = buf_.pos.narrow(1, 0, m_);        // [Hkv, m]
}

void HeldSet::rotate_keys(const at::Tensor& delta, const at::Tensor& inv_freq) {
  KVLAB_CHECK(delta.dim() == 2 && delta.size(0) == view_.keys.size(0) && delta.size(1) == m_,
              "HeldSet: rotating {} held entries by a delta of {} entries", m_, delta.size(-1));
  view_.keys.copy_(rotate_by(view_.keys, delta, inv_freq));  // view_ is the buffers' first m_ entries
}

void HeldSet::append(const at::Tensor& k, const at::Tensor& v, int64_t pos0) {
  const int64_t h = k.size(0), t = k.size(1);
  KVLAB_CHECK(h == buf_.keys.size(0) && v.size(1) == t, "HeldSet: appending [{}, {}] keys to {} heads", h, t,
              buf_.keys.size(0));
  append_in_room(buf_.keys, view_.keys, k);
  append_in_room(buf_.values, view_.values, v);
  append_in_room(buf_.bias, view_.bias, at::zeros({h, t}, buf_.bias.options()));
  append_in_room(buf_.pos, view_.pos, at::arange(pos0, pos0 + t, buf_.pos.options()).unsqueeze(0).expand({h, t}));
  m_ += t;  // view_ is already buf_'s first m_ entries: append_in_room set it
}

void HeldSet::compact(const std::vector<int64_t>& keep, bool per_head) {
  const int64_t h = buf_.keys.size(0), n = static_cast<int64_t>(keep.size());
  KVLAB_CHECK(!per_head || n % h == 0, "HeldSet: {} kept indices do not make {} equal rows", n, h);
  const bool shared = !per_head;
  const int64_t m_new = shared ? n : n / h;
  for (int64_t i = 0; i < (shared ? 1 : h); ++i)
    for (int64_t a = 0; a < m_new; ++a) {
      const int64_t x = keep[i * m_new + a];
      KVLAB_CHECK(x >= 0 && x < m_ && (a == 0 || x > keep[i * m_new + a - 1]),
                  "HeldSet: keep row {} must be strictly ascending indices below {}, got {} at {}", i, m_, x, a);
    }
  if (buf_.keys.is_cpu()) {
    for (at::Tensor* t : {&buf_.keys, &buf_.values, &buf_.bias, &buf_.pos}) compact_cpu(*t, keep, m_new, shared);
  } else {
    auto idx = at::tensor(keep, at::kLong).view({shared ? 1 : h, m_new}).expand({h, m_new}).contiguous();
    const KVSet kept = gather_entries(view_, idx.to(buf_.pos.device()));
    buf_.keys.narrow(1, 0, m_new).copy_(kept.keys);
    buf_.values.narrow(1, 0, m_new).copy_(kept.values);
    buf_.bias.narrow(1, 0, m_new).copy_(kept.bias);
    buf_.pos.narrow(1, 0, m_new).copy_(kept.pos);
  }
  m_ = m_new;
  refresh_view();
}

}  // namespace kvlab
