#include "kvlab/compress/wrapper.h"

#include <algorithm>
#include <numeric>

#include "kvlab/compress/query_scores.h"
#include "kvlab/core/check.h"

namespace kvlab::detail {

Params ScorerWrapper::own_params(const nlohmann::json& given, const std::vector<std::string>& own_keys) {
  auto [own, inner] = split_wrapper_params(given, own_keys);
  inner_ = std::move(inner);
  return Params(own, name_);
}

void ScorerWrapper::make_scorer(const Params& own, const std::string& scorer) {
  own.finish();
  scorer_name_ = scorer;
  scorer_ = make_compressor(scorer, inner_);
  params_ = wrapper_params(own.effective(), *scorer_);
}

at::Tensor ScorerWrapper::scorer_scores(const LayerKV& kv, const CompressOptions& opt) const {
  at::Tensor scores = scorer_->keep_scores(kv, opt);  // [Hkv, n]
  KVLAB_CHECK(scores.defined(), "{}: scorer '{}' gives no per-position scores", name_, scorer_name_);
  return scores;
}

std::vector<double> chunk_means(const double* s, int64_t n, int64_t chunk) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<double> mean(static_cast<size_t>(chunks), 0.0);  // [C]
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t from = c * chunk, len = std::min(chunk, n - from);
    for (int64_t i = from; i < from + len; ++i) mean[c] += s[i];
    mean[c] /= double(len);
  }
  return mean;
}

std::vector<int64_t> best_first(const std::vector<double>& mean) {
  std::vector<int64_t> order(mean.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return mean[a] > mean[c]; });
  return order;
}

}  // namespace kvlab::detail
