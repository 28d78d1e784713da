// Compression while decoding for any method that keeps tokens (issue 53; docs/methods.md §5.2
// `--decode-rule compress`): kvpress's DecodingPress and CompressionRatioDecodingPress, with the
// method's own compress() as the scorer.
//
// After the prefill the method compresses once, as under every rule; the stream then holds what it
// kept (and the exact tail) and appends each decoded token exactly. Every `every` decoded tokens it
// compresses everything it holds again, with the same method, to the branch's budget on the tokens
// seen so far: `--budget M` holds M (DecodingPress's target_size), `--ratio r` holds r × the tokens
// seen (CompressionRatioDecodingPress), so every method of a run holds the same entries at every
// step. Between two compressions the held set grows by at most `every` entries.
//
// What the method sees at a compression (a LayerKV over the held entries, in position order):
//   keys, values [Hkv, m, d]  every held entry; the exact prefix (--keep-first) stays outside, as
//                             the prefix of every query's softmax;
//   queries [Hq, t, d]        the queries of the tokens decoded since the last compression (at
//                             most `buffer` of them, kvpress's hidden_states_buffer_size), at
//                             their true positions (or all at the newest: queries_at_newest);
//   pos0                      the held keys sit at contiguous positions ending at the newest token
//                             (the tokens decoded since the last compression are contiguous there,
//                             so causality between them and the buffered queries is exact; every
//                             older entry precedes every buffered query either way).
// So a method that reads its keys' true positions (expected_attention, compactor un-rotate RoPE) or
// inputs made over the prompt (kvzip's reconstruction scores) cannot run under this rule, nor can a
// method that merges entries, weighs them, keeps different counts per head or a separate
// denominator: its held set would not be tokens the next compression can score. Those are refused
// by name (check_decoding_compressible, and again at the first compression that would make one).
#pragma once

#include <memory>
#include <string>

#include "kvlab/compress/compressor.h"

namespace kvlab {

struct DecodingRule {
  int64_t every = 512;   // decoded tokens between compressions (kvpress: compression_interval 512)
  int64_t buffer = 256;  // the most recent queries a compression may score with (kvpress: 256)
  // kvpress's convention: its scorers rebuild the buffered queries from hidden states with the RoPE
  // of the step that compresses (position_embeddings hold only that position), so every buffered
  // query is rotated as if it sat at the newest position; the causal mask stays by index. true =
  // the same (needs inputs::rope_inv_freq in the context); false (kvlab's default) = each query at
  // its own position.
  bool queries_at_newest = false;
};

// held: keys, values [Hkv, m, d], pos [Hkv, m] int64 true positions in increasing order per head,
// bias zeros (one count per head). n_seen: the region's tokens so far (prompt region and tail).
// prefix_counted: the exact prefix's entries when the budget counts the whole layer (the target
// is then entries_for(prefix + n_seen) - prefix), else 0. context: inputs that do not run over
// positions (out_proj), shared with the prefill's compression.
std::unique_ptr<LayerStream> start_decoding_stream(std::shared_ptr<const Compressor> method, KVSet held,
                                                   int64_t n_seen, const CompressOptions& opt, int64_t prefix_counted,
                                                   const DecodingRule& rule, int layer, int n_layers,
                                                   const Context& context);

// Refuses, naming the method, a compressed set that is not tokens held one to one with weight 1:
// index [Hkv, m] (kept indices or positions; < 0 or undefined = merged), bias [Hkv, m] (nonzero =
// weighted or padding), a separate denominator, a logit scale. The one test of "is it tokens" that
// the prefill's result and every compression while decoding go through.
void require_tokens(const std::string& name, const at::Tensor& index, const at::Tensor& bias, bool separate_den,
                    double logit_scale);

// Refuses, naming the method and --decode-rule, a method the rule cannot drive (see above) from
// what its registry entry says (`name`: its registry name), and one that scores with more queries
// than a compression every `every` tokens sees (its observation window above min(every, 256)): as
// at the prefill, a method never silently gets fewer queries than it asks for.
void check_decoding_compressible(const std::string& name, const Compressor& method, int64_t every);

}  // namespace kvlab
