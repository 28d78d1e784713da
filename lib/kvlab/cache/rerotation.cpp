#include "kvlab/cache/rerotation.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "kvlab/attention/rope.h"
#include "kvlab/cache/compressed_cache.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// One KV head's live entries (bias > −inf) in the order of their positions, each with the slot it
// moves to: contiguous positions ending at `last` (the newest). pos [m] >= 0 for every live entry,
// else an error naming `method` (`flag`: how the user asked for re-rotation).
struct Slot {
  int64_t entry, target;
};
std::vector<Slot> contiguous_slots(const int64_t* pos, const double* bias, int64_t m, int64_t last,
                                   const std::string& method, const char* flag) {
  std::vector<int64_t> live;
  for (int64_t j = 0; j < m; ++j)
    if (bias[j] > -std::numeric_limits<double>::infinity()) {
      KVLAB_CHECK(pos[j] >= 0, "{}: {} holds merged entries, which have no single position to move; re-rotation "
                  "applies to methods that keep tokens one to one", flag, method);
      live.push_back(j);
    }
  std::sort(live.begin(), live.end(), [&](int64_t a, int64_t c) { return pos[a] < pos[c]; });
  std::vector<Slot> out;
  const int64_t n_live = int64_t(live.size());
  for (int64_t r = 0; r < n_live; ++r) out.push_back({live[size_t(r)], last - (n_live - 1 - r)});
  return out;
}

std::string cannot_move(const std::string& method) {
  return "--rerotate: " + method + " keeps copies of its keys that re-rotation cannot move (--decode-rule rerotate "
         "in the task commands); it applies to streaming_llm, local, h2o and buzz";
}

}  // namespace

void rerotate_kept(CompressedLayer& l, const at::Tensor& inv_freq, const std::string& method) {
  KVLAB_CHECK(!l.stream && !l.ragged() && !l.has_den() && l.window == 0,
              "re-rotation after compression: {}: a layer that streams, is split by head, has a separate "
              "denominator or slides is not moved here", method);
  if (!l.num.keys.defined() || l.num.keys.size(1) == 0) return;
  const auto origin = l.origin.to(at::kCPU, at::kLong).contiguous();   // [Hkv, m]
  const auto bias = l.num.bias.to(at::kCPU, at::kDouble).contiguous();  // [Hkv, m]
  const int64_t h_kv = origin.size(0), m = origin.size(1), last = l.n_positions - 1;
  auto delta = at::zeros({h_kv, m}, at::kLong);  // [Hkv, m]
  auto da = delta.accessor<int64_t, 2>();
  bool moved = false;
  for (int64_t h = 0; h < h_kv; ++h) {
    const int64_t* o = origin.data_ptr<int64_t>() + h * m;
    for (const Slot& s : contiguous_slots(o, bias.data_ptr<double>() + h * m, m, last, method, "re-rotation")) {
      da[h][s.entry] = s.target - o[s.entry];
      moved = moved || da[h][s.entry] != 0;
    }
  }
  if (moved) l.num.keys = rotate_by(l.num.keys, delta.to(l.num.keys.device()), inv_freq);
  l.live_count = -1;
}

int64_t Rerotation::at(size_t h, int64_t pos) const {
  return h < at_.size() && pos < int64_t(at_[h].size()) ? at_[h][size_t(pos)] : pos;
}

Rerotation::Rerotation(at::Tensor inv_freq, std::string method)
    : inv_freq_(std::move(inv_freq)), method_(std::move(method)) {
  KVLAB_CHECK(inv_freq_.defined() && inv_freq_.dim() == 1, "--rerotate: {}: the model has no RoPE frequencies", method_);
}

std::vector<std::vector<int64_t>> Rerotation::positions(const LayerStream& s) const {
  const KVSet& held = s.held();
  const auto pos = held.pos.to(at::kCPU, at::kLong).contiguous();    // [Hkv, m]
  const auto bias = held.bias.to(at::kCPU, at::kDouble).contiguous();  // [Hkv, m]
  const int64_t h_kv = pos.size(0), m = pos.size(1);
  std::vector<std::vector<int64_t>> out(size_t(h_kv), std::vector<int64_t>(size_t(m), -1));
  for (int64_t h = 0; h < h_kv; ++h)
    for (int64_t j = 0; j < m; ++j)
      if (bias.data_ptr<double>()[h * m + j] > -std::numeric_limits<double>::infinity())
        out[size_t(h)][size_t(j)] = at(size_t(h), pos.data_ptr<int64_t>()[h * m + j]);
  return out;
}

void Rerotation::apply(LayerStream& s) {
  const KVSet& held = s.held();
  const auto pos = held.pos.to(at::kCPU, at::kLong).contiguous();    // [Hkv, m]
  const auto bias = held.bias.to(at::kCPU, at::kDouble).contiguous();  // [Hkv, m]
  const int64_t h_kv = pos.size(0), m = pos.size(1);
  if (at_.size() < size_t(h_kv)) at_.resize(size_t(h_kv));
  auto delta = at::zeros({h_kv, m}, at::kLong);  // [Hkv, m]
  auto da = delta.accessor<int64_t, 2>();
  bool moved = false;
  for (int64_t h = 0; h < h_kv; ++h) {
    const int64_t* p = pos.data_ptr<int64_t>() + h * m;
    const double* b = bias.data_ptr<double>() + h * m;
    int64_t newest = -1;  // the newest live position: the held set ends there
    for (int64_t j = 0; j < m; ++j)
      if (b[j] > -std::numeric_limits<double>::infinity()) newest = std::max(newest, p[j]);
    if (newest < 0) continue;
    auto& row = at_[size_t(h)];
    if (int64_t(row.size()) <= newest) {  // positions not seen before sit where they were cached
      const size_t old = row.size();
      row.resize(size_t(newest) + 1);
      std::iota(row.begin() + long(old), row.end(), int64_t(old));
    }
    for (const Slot& s : contiguous_slots(p, b, m, newest, method_, "--rerotate")) {
      const int64_t d = s.target - row[size_t(p[s.entry])];
      if (d != 0) moved = true;
      da[h][s.entry] = d;
      row[size_t(p[s.entry])] = s.target;
    }
  }
  if (!moved) return;
  KVLAB_CHECK(s.rotate_held(delta.to(held.keys.device()), inv_freq_), "{}", cannot_move(method_));
}

void Rerotation::require_movable(LayerStream& s) const {
  const at::Tensor& keys = s.held().keys;  // [Hkv, m, d]
  const auto none = at::zeros({keys.size(0), keys.size(1)}, keys.options().dtype(at::kLong));  // [Hkv, m]
  KVLAB_CHECK(s.rotate_held(none, inv_freq_), "{}", cannot_move(method_));
}

}  // namespace kvlab
