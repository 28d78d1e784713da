// The half every wrapper around a scorer shares (adakv, chunkkv, entropy_chunkkv, chunk, block,
// per_layer, merging): its name, its own parameters read apart from the scorer's, the scorer made
// from the rest, the effective parameters (its own, then the scorer's), and the scorer's observation
// window and reconstruction passed on. A wrapper reads its own parameters between own_params() and
// make_scorer():
//
//   explicit Block(const nlohmann::json& given) : ScorerWrapper("block") {
//     Params p = own_params(given, {"scorer", "block_size"});
//     const std::string scorer = p.get_string("scorer", "keydiff", {"knorm", "keydiff", "cur", "lagkv"});
//     block_ = p.get_int("block_size", 128);
//     make_scorer(p, scorer);
//   }
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvlab/compress/compressor.h"

namespace kvlab::detail {

class ScorerWrapper : public Compressor {
 public:
  std::string name() const override { return name_; }
  nlohmann::json params() const override { return params_; }
  int64_t observation_queries() const override { return scorer_->observation_queries(); }
  ReconstructionRequest reconstruction() const override { return scorer_->reconstruction(); }

 protected:
  explicit ScorerWrapper(std::string name) : name_(std::move(name)) {}
  // The given parameters named in `own_keys`, to read; the rest are kept for the scorer.
  Params own_params(const nlohmann::json& given, const std::vector<std::string>& own_keys);
  // Checks that every own parameter was read, makes the scorer `scorer` from the rest and records
  // the effective parameters.
  void make_scorer(const Params& own, const std::string& scorer);
  // The scorer's per-position scores [Hkv, n] float64; an error naming the wrapper when it has none.
  at::Tensor scorer_scores(const LayerKV& kv, const CompressOptions& opt) const;

  std::string name_, scorer_name_;
  std::unique_ptr<Compressor> scorer_;

 private:
  nlohmann::json inner_, params_;
};

// The chunked wrappers' (chunkkv, entropy_chunkkv) view of summed scores s [n]: the mean of each
// chunk of `chunk` positions (the last one shorter), [ceil(n / chunk)]; and chunks ordered by their
// mean, best first, ties to the lower chunk.
std::vector<double> chunk_means(const double* s, int64_t n, int64_t chunk);
std::vector<int64_t> best_first(const std::vector<double>& mean);

}  // namespace kvlab::detail
