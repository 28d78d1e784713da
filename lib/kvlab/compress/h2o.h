// H2O's per-KV-head cache state, shared by replay (h2o.cpp drives it over a region in one shot)
// and token-by-token generation (append a token, add its query's attention, evict).
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab {

// Which tokens one KV head holds and the attention they have accumulated. Tokens are held in
// arrival order; the last `recent` held tokens are never evicted; otherwise the token with the
// lowest accumulated score goes first (ties: the oldest). Evicted tokens never return.
class H2OCache {
 public:
  // budget >= 1 entries; 0 <= recent <= budget; normalize: rank by score / (queries that saw it).
  H2OCache(int64_t budget, int64_t recent, bool normalize);

  // A new token with the score it arrives with (prefill: its total over the prompt queries) and
  // the number of queries behind that score.
  void append(int64_t token, double score = 0.0, double n_queries = 0.0);
  // One query's attention over the held tokens, in held order (probs has size() entries).
  void accumulate(const double* probs);
  // Evicts until size() <= budget.
  void evict();
  // A new budget (and recent window) for the next evictions; same bounds as the constructor.
  void set_budget(int64_t budget, int64_t recent);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int64_t>& tokens() const { return tokens_; }  // held, arrival order
  const std::vector<double>& scores() const { return scores_; }

 private:
  double rank_key(size_t i) const;
  int64_t budget_, recent_;
  bool normalize_;
  std::vector<int64_t> tokens_;
  std::vector<double> scores_, counts_;
};

}  // namespace kvlab
