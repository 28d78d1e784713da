// KVzip's context reconstruction (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression
// with Context Reconstruction", arXiv:2505.23416), as NVIDIA kvpress 0.5.5 `KVzipPress` runs it
// (kvpress/presses/kvzip_press.py, written with the paper's authors).
//
// After the exact prefill of a context, the model is asked to repeat it: per chunk of `chunk_size`
// context tokens, a second forward over
//     repeat prompt  +  end of the user turn / assistant header  +  the chunk's tokens (teacher-forced)
// at the positions after the context, attending over the whole exact cache. Each cached context
// entry is scored by the most attention any reconstruction query of its KV group puts on it, the
// softmax taken over (the first n_sink positions, the chunk, the reconstruction tokens so far):
//   score[l][h][i] = max over query heads of group h and reconstruction queries t of softmax(...)[i]
// An entry the model needs to rebuild its context scores high, whatever the question will be.
// The scores are query-agnostic and cost a second prefill (reported as reconstruction_seconds).
// The cache itself is never modified: compress/kvzip.cpp ranks these scores.
//
// KVCompose's variant (Akulov et al. 2025, arXiv:2509.05165, as kvpress 0.5.5 `KVComposePress` runs
// it; ReconstructionRequest::repeat_context): the context fed again, whole and without a prompt, at
// the positions after itself; the softmax is over every cached entry and the repeat so far, and
//   score[l][h][i] = mean over query heads of group h of (max over the repeat's queries of softmax(...)[i])
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/compress/compressor.h"
#include "kvlab/model/model.h"

namespace kvlab {

class Tokenizer;

// The token ids of KVzip's repeat prompts for one tokenizer and chat template.
struct ReconstructionPrompt {
  std::vector<int64_t> first;   // "\n\nRepeat the previous context exactly."
  std::vector<int64_t> next;    // "\n\nRepeat the part of the previous context exactly, starting with"
  std::vector<int64_t> turn;    // the template's end of the user turn + assistant header ("\n" with none)
  std::vector<int64_t> prefix;  // the template's ids before the user's content (not reconstructed)
  bool defined() const { return !first.empty(); }
};

// As KVzipPress.__call__ builds them: the template applied to one user message "dummy context" +
// "\n" + "#"*13 with the generation prompt, split at that separator; "none" gives prefix "" and turn "\n".
ReconstructionPrompt reconstruction_prompt(const Tokenizer& tok, const std::string& chat_template);

// A prompt built with a chat template starts with its prefix ids: then `templated`, else `plain`
// (a dataset that opts out of the template, e.g. LongBench's few-shot ones).
const ReconstructionPrompt& reconstruction_prompt_for(const std::vector<int64_t>& prompt,
                                                      const ReconstructionPrompt& templated,
                                                      const ReconstructionPrompt& plain);

// One reconstruction forward: the context positions [begin, end) it scores and the ids fed.
struct ReconstructionChunk {
  int64_t begin = 0, end = 0;
  std::vector<int64_t> ids;  // repeat prompt (+ the previous chunk's last 8 ids) + turn + prompt[begin, end)
};
// KVzipPress.prepare: the context after the template prefix in chunks of chunk_size.
std::vector<ReconstructionChunk> reconstruction_chunks(const std::vector<int64_t>& prompt,
                                                       const ReconstructionPrompt& rp, int64_t chunk_size);

// [n_layers, n_kv_heads, n] float32 scores of the n prompt positions (0 where nothing is
// reconstructed: the template prefix); NaN rows for a layer with windows[l] > 0 (a sliding layer
// held exactly, never compressed). k, v: the exact prefill's per-layer [Hkv, n, d] (not modified).
// rq.repeat_context: KVCompose's scores (rp unused); else KVzip's (chunks of rq.chunk_size, rq.n_sink).
at::Tensor reconstruction_scores(const Model& model, const std::vector<at::Tensor>& k,
                                 const std::vector<at::Tensor>& v, const std::vector<int64_t>& windows,
                                 const std::vector<int64_t>& prompt, const ReconstructionPrompt& rp,
                                 const ReconstructionRequest& rq);

}  // namespace kvlab
