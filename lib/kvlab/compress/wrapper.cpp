#include "kvlab/compress/wrapper.h"

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

}  // namespace kvlab::detail
