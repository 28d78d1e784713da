// What a method may read beyond its region's keys, values and queries: named inputs, each made on
// first use and then kept.
//
// The command that compresses (replay, generation, the task commands) says how each input it can
// give is made (`provide`); a method says in its registry entry what it reads and asks for it
// (`get`) from its LayerKV's context. Nothing is made that no method asks for, and every method
// compressing the same layer of the same prompt shares what was made (copies of a Context share
// their entries). A new kind of input is a name, the code that makes it where a command provides
// it, and the method that asks: no field, parameter or signature elsewhere changes.
//
// An input over the layer's positions is provided over all of them with `position_dim`, the
// dimension that runs over the positions; the region's context (`narrowed`) hands out its slice.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvlab {

// The inputs kvlab's methods read (shapes as `get` returns them, on the region).
namespace inputs {
// [n_q_heads, n] float64: for each query head, the sum over every prompt query of its post-softmax
// attention on each region key (causal, softmax over all it sees). Generation's exact prefill makes
// it once per prompt; h2o/cam with every query and buzz read it (query_scores.h
// accumulated_attention), else compute it from the queries. Given only with every prompt query.
inline constexpr const char* attention_sums = "attention_sums";
// [head_dim / 2] float32: the RoPE frequencies the keys and queries were rotated with
// (attention/rope.h). expected_attention and compactor un-rotate with them.
inline constexpr const char* rope_inv_freq = "rope_inv_freq";
// [hidden, n_q_heads * head_dim]: the layer's output projection W_o (where the model is loaded;
// captures hold no weights). criticalkv weighs values by ‖W_o v‖₁.
inline constexpr const char* out_proj = "out_proj";
// [n_layers, n_kv_heads, n] float32: every layer's scores from a second forward of the context
// (generate/reconstruction.h, as the method's ReconstructionRequest asks: KVzip's repeat or
// KVCompose's) on the region, NaN rows for layers that are not compressed. kvzip and kvcompose rank
// them across layers.
inline constexpr const char* reconstruction_scores = "reconstruction_scores";
// 0-dim int64: the prompt position where the question (and the assistant prefix after it) begins,
// when the question was prefilled with its context (the task commands under --protocol whole).
// finch scores with the queries from there on.
inline constexpr const char* question_start = "question_start";
}  // namespace inputs

class Context {
 public:
  using Make = std::function<at::Tensor()>;
  // How to make input `name` (replacing any earlier way). position_dim >= 0: the input runs over
  // the layer's positions along that dimension (narrowed to a region by `narrowed`).
  void provide(const std::string& name, Make make, int64_t position_dim = -1);
  // A value already made.
  void provide(const std::string& name, const at::Tensor& value, int64_t position_dim = -1);
  // Forgets `name` (e.g. attention sums once the queries are narrowed: they were over every query).
  void drop(const std::string& name);
  bool has(const std::string& name) const;
  // The input, made on first use; an error naming it when nothing provides it.
  const at::Tensor& get(const std::string& name) const;
  // The context of positions [begin, begin + length): inputs over positions narrowed to them (made
  // from the whole input, which is made once), the others as they are.
  Context narrowed(int64_t begin, int64_t length) const;
  std::vector<std::string> names() const;

 private:
  struct Entry {
    Make make;
    int64_t position_dim = -1;
    bool made = false;
    at::Tensor value;
  };
  static const at::Tensor& made(Entry& e);  // e's value, made on first call
  std::map<std::string, std::shared_ptr<Entry>> entries_;
};

}  // namespace kvlab
