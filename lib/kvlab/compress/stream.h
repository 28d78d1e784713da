// Decode-time compression (issue 10): a method's cache of one layer that keeps compressing as
// tokens arrive. A streaming method makes one with Compressor::start_stream; it is the one
// implementation of the method's streaming rule, driven token by token by generation
// (cache/compressed_cache.h) and, where a method has a streaming replay mode, by replay too.
//
// The layer's attention sees an exact prefix the harness keeps (--keep-first; never the method's)
// followed by the entries held here. One step of T new tokens at positions pos0 .. pos0+T-1:
//   push(k, v, pos0)       the new tokens join the held entries exactly (bias 0);
//   the caller attends with the new queries over prefix + held(), logits times logit_scale();
//   settle(q, prefix)      the method scores with those queries and evicts or merges (its paper's
//                          rule: H2O evicts at every step, BUZZ when its region passes T, the
//                          window methods roll their window).
// How many entries a stream may hold follows its Budget on the region's tokens seen so far
// (n_seen): `--budget N` holds N; `--ratio r` holds r·n_seen, so a ratio keeps its meaning while
// the sequence grows and ratio 1 never evicts. Methods with a layout of their own (BUZZ) say in
// their file how the budget fixes it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/attention/attention.h"

namespace kvlab {

class LayerStream {
 public:
  virtual ~LayerStream() = default;
  // k, v [Hkv, T, d]: the new tokens, at positions pos0 .. pos0+T-1.
  virtual void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) = 0;
  // q [Hq, T', d]: the queries of the last push (T' = T, or 0 when a replay has no query there),
  // after they attended; prefix_keys [Hkv, p, d] (undefined = none): the exact keys before the
  // held ones, part of every query's softmax.
  virtual void settle(const at::Tensor& q, const at::Tensor& prefix_keys) = 0;
  // What attention sees now: keys, values [Hkv, m, d], bias [Hkv, m] (-inf = empty slot),
  // pos [Hkv, m] int64 absolute positions (-1 = merged, visible to every later query).
  virtual const KVSet& held() const = 0;
  // The separate denominator set where the method has one (SubGen): keys [Hkv, m', d], bias, pos;
  // nullptr = the numerator set.
  virtual const KVSet* den() const { return nullptr; }
  // Multiplies every logit of the layer (BUZZ log n); 1 = none.
  virtual double logit_scale() const { return 1.0; }
  // Tokens of the region seen so far: the prompt's region plus every pushed token.
  virtual int64_t n_seen() const = 0;
  // Entries held per KV head that are not padding (bias > -inf), averaged over the heads; by
  // default counted on held(). A stream whose entries are all exact says so without counting.
  virtual double live_entries() const;
  // Re-rotation (cache/rerotation.h): rotates each held key by delta [Hkv, m] int64 positions (in
  // held() order; attention/rope.h rotate_by with inv_freq [d/2]), so that later attention and the
  // method's own scores see the moved keys. Only a stream whose entries are tokens held one to one
  // (pos >= 0) can; false = this stream cannot (it merges or keeps copies of its keys).
  virtual bool rotate_held(const at::Tensor& delta, const at::Tensor& inv_freq) {
    (void)delta, (void)inv_freq;
    return false;
  }
};

// Post-softmax attention of the queries q [Hq, T, d] at positions query_pos [T] over the exact
// prefix (undefined = none) followed by `held` (causal on held.pos; bias applied), logits times
// `logit_scale`, restricted to the held entries and reduced over each KV group's query heads by
// `reduce` ("mean" | "max" | "sum"), in float64 -> [Hkv, T, m].
at::Tensor stream_attention_probs(const at::Tensor& q, const at::Tensor& query_pos, const at::Tensor& prefix_keys,
                                  const KVSet& held, double logit_scale, const std::string& reduce);

// One entry of a set a method builds from its own state: float64 key and value rows (d and dv
// values) and its log-weight.
struct EntryRow {
  const double* key;
  const double* value;
  double bias;
};
// Per-head entries -> one set padded with bias -inf to the longest head (at least one slot):
// keys [Hkv, m, d], values [Hkv, m, dv] (only when `with_values`), bias [Hkv, m], pos -1 (every
// entry visible to every later query), in `opts`.
KVSet padded_entry_set(const std::vector<std::vector<EntryRow>>& heads, int64_t d, int64_t dv, bool with_values,
                       const at::TensorOptions& opts);

// Keeps `keep` [Hkv, m'] int64 (indices into the held entries, per head) of a set.
KVSet gather_entries(const KVSet& s, const at::Tensor& keep);

// Appends T exact entries at positions pos0.. to a set whose pos is [Hkv, m] (bias 0). Values may
// be undefined (a denominator set).
void append_exact(KVSet& s, const at::Tensor& k, const at::Tensor& v, int64_t pos0);

}  // namespace kvlab
