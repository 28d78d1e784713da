// The window rule of streaming_llm (n_sink first tokens + the most recent ones) and local
// (n_sink = 0) as a decode-time stream (stream.h); implemented in streaming_llm.cpp.
#pragma once

#include <memory>

#include "kvlab/compress/compressor.h"

namespace kvlab {

// Holds the region's first n_sink tokens and the most recent ones that fill the budget on the
// tokens seen; the window rolls by one entry per decoded token once the budget is reached.
std::unique_ptr<LayerStream> start_window_stream(const LayerKV& kv, const Budget& budget, int64_t n_sink);

}  // namespace kvlab
