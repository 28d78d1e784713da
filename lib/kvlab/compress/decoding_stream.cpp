#include "kvlab/compress/decoding_stream.h"

#include <algorithm>

#include "kvlab/attention/rope.h"
#include "kvlab/core/check.h"

namespace kvlab {

namespace {

// A compression's result as held tokens: indices into the held set [Hkv, m'] in position order, or
// an error naming the method when it did not keep tokens one to one with weight 1.
at::Tensor kept_tokens(const CompressedKV& cr, const std::string& name) {
  require_tokens(name, cr.kept_idx, cr.bias, cr.has_separate_den(), cr.logit_scale);
  return std::get<0>(cr.kept_idx.sort(1));  // [Hkv, m'] int64
}

class DecodingStream final : public LayerStream {
 public:
  DecodingStream(std::shared_ptr<const Compressor> method, KVSet held, int64_t n_seen, const CompressOptions& opt,
                 int64_t prefix_counted, const DecodingRule& rule, int layer, int n_layers, const Context& context)
      : method_(std::move(method)), held_(std::move(held)), n_seen_(n_seen), opt_(opt),
        prefix_counted_(prefix_counted), rule_(rule), layer_(layer), n_layers_(n_layers), context_(context) {
    KVLAB_CHECK(rule_.every >= 1, "--decode-rule compress:N: N must be >= 1, got {}", rule_.every);
    KVLAB_CHECK(rule_.buffer >= 0, "decoding rule: the query buffer must be >= 0, got {}", rule_.buffer);
    KVLAB_CHECK(held_.pos.defined() && held_.pos.dim() == 2, "start_decoding_stream: pos must be [Hkv, m]");
    require_tokens(method_->name(), held_.pos, held_.bias, false, 1.0);
    held_.bias = at::zeros({held_.keys.size(0), held_.keys.size(1)}, held_.keys.options());
    held_ = gather_entries(held_, std::get<1>(held_.pos.sort(1)));  // position order per head
  }

  void push(const at::Tensor& k, const at::Tensor& v, int64_t pos0) override {
    append_exact(held_, k, v, pos0);
    last_pos0_ = pos0;
    n_seen_ += k.size(1);
  }

  void settle(const at::Tensor& q, const at::Tensor& prefix_keys) override {
    const int64_t t = q.defined() ? q.size(1) : 0;
    if (t > 0) {
      const auto qpos = at::arange(last_pos0_, last_pos0_ + t, q.options().dtype(at::kLong));  // [T]
      queries_ = queries_.defined() ? at::cat({queries_, q}, 1) : q;                          // [Hq, t, d]
      query_pos_ = query_pos_.defined() ? at::cat({query_pos_, qpos}) : qpos;                 // [t]
      const int64_t keep = std::min<int64_t>(rule_.buffer, queries_.size(1));
      queries_ = queries_.narrow(1, queries_.size(1) - keep, keep);
      query_pos_ = query_pos_.narrow(0, query_pos_.size(0) - keep, keep);
    }
    steps_ += std::max<int64_t>(t, 1);
    if (steps_ < rule_.every) return;
    compress(prefix_keys);
    steps_ = 0;
    queries_ = at::Tensor();  // kvpress clears its buffer after every compression
    query_pos_ = at::Tensor();
  }

  const KVSet& held() const override { return held_; }
  int64_t n_seen() const override { return n_seen_; }
  double live_entries() const override { return double(held_.keys.size(1)); }  // no padding, ever

 private:
  void compress(const at::Tensor& prefix_keys) {
    const int64_t m = held_.keys.size(1);
    const int64_t target =
        std::max<int64_t>(1, opt_.budget.entries_for(n_seen_ + prefix_counted_) - prefix_counted_);
    if (m <= target) return;
    LayerKV kv;
    kv.keys = held_.keys;      // [Hkv, m, d]
    kv.values = held_.values;  // [Hkv, m, d]
    const int64_t newest = held_.pos.select(1, m - 1)[0].item<int64_t>();
    if (queries_.defined() && queries_.size(1) > 0) {
      kv.queries = queries_;      // [Hq, t, d]
      kv.query_pos = query_pos_;  // [t], the causal mask's
      if (rule_.queries_at_newest) {
        const at::Tensor delta = (newest - query_pos_).unsqueeze(0).expand({queries_.size(0), queries_.size(1)});
        kv.queries = rotate_by(queries_, delta.contiguous(), context_.get(inputs::rope_inv_freq));
      }
    }
    kv.pos0 = newest + 1 - m;  // contiguous positions ending at the newest token (see the header)
    if (prefix_keys.defined() && prefix_keys.size(1) > 0) kv.prefix_keys = prefix_keys;
    kv.layer = layer_;
    kv.n_layers = n_layers_;
    kv.context = context_;
    CompressOptions o = opt_;
    o.budget = Budget::of_entries(target);
    const CompressedKV cr = method_->compress(kv, o);
    held_ = gather_entries(held_, kept_tokens(cr, method_->name()));
  }

  std::shared_ptr<const Compressor> method_;
  KVSet held_;  // keys, values [Hkv, m, d], bias [Hkv, m] zeros, pos [Hkv, m] increasing per head
  int64_t n_seen_;
  CompressOptions opt_;
  int64_t prefix_counted_;
  DecodingRule rule_;
  int layer_, n_layers_;
  Context context_;
  at::Tensor queries_, query_pos_;  // [Hq, t, d], [t]: the buffered queries since the last compression
  int64_t last_pos0_ = 0;
  int64_t steps_ = 0;  // tokens settled since the last compression
};

}  // namespace

void require_tokens(const std::string& name, const at::Tensor& index, const at::Tensor& bias, bool separate_den,
                    double logit_scale) {
  const char* why = !index.defined() || (index < 0).any().item<bool>() ? "merges entries"
                    : separate_den                                      ? "keeps a separate denominator set"
                    : logit_scale != 1.0                                ? "scales the layer's logits"
                    : bias.defined() && !(bias == 0).all().item<bool>()
                        ? "weighs its entries or keeps different counts per KV head"
                        : nullptr;
  KVLAB_CHECK(!why, "--decode-rule compress: {} {}, so what it holds is not tokens the next compression can score; "
              "give --decode-rule prefill or stream", name, why ? why : "");
}

void check_decoding_compressible(const std::string& name, const Compressor& method, int64_t every) {
  const int64_t seen = std::min<int64_t>(every, DecodingRule{}.buffer), wants = method.observation_queries();
  KVLAB_CHECK(wants <= seen, "--decode-rule compress:{}: {} scores with its last {} queries, and a compression sees "
              "the {} decoded since the last one; give N >= {} or a smaller window", every, name, wants, seen, wants);
  const CompressorInfo& info = compressor_info(name);
  KVLAB_CHECK(!info.own_memory, "--decode-rule compress: {} keeps what its own threshold decides, not a budget to "
              "compress to again; give --decode-rule prefill", name);
  KVLAB_CHECK(!info.reads(inputs::rope_inv_freq), "--decode-rule compress: {} un-rotates its keys by their "
              "positions, and the entries held after a compression no longer sit at contiguous positions; give "
              "--decode-rule prefill or stream", name);
  KVLAB_CHECK(!info.reads(inputs::reconstruction_scores), "--decode-rule compress: {} scores by reconstructing the "
              "prompt, which decoded tokens are not part of; give --decode-rule prefill or stream", name);
}

std::unique_ptr<LayerStream> start_decoding_stream(std::shared_ptr<const Compressor> method, KVSet held,
                                                   int64_t n_seen, const CompressOptions& opt, int64_t prefix_counted,
                                                   const DecodingRule& rule, int layer, int n_layers,
                                                   const Context& context) {
  KVLAB_CHECK(method, "start_decoding_stream: no method");
  return std::make_unique<DecodingStream>(std::move(method), std::move(held), n_seen, opt, prefix_counted, rule,
                                          layer, n_layers, context);
}

}  // namespace kvlab
