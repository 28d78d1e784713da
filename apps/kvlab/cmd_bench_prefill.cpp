// kvlab bench prefill --model M --tokens N [--reps R] [--decode S] [--dtype fp32] [--device cpu] [--json]
// Prefill throughput (tokens/s) of the forward pass with exact attention, logits of the last
// position only; with --decode S, then S greedy one-token steps through the exact cache and their
// median time per output token (TPOT). The prompt is the fixed id sequence id_i = 100 + (i * 7919) % (vocab - 100),
// which bench/prefill_transformers.py uses too, so both sides see the same tokens.
// Compare with transformers: bench/prefill_compare.sh.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/blas.h"
#include "kvlab/core/check.h"
#include "kvlab/model/model.h"

namespace kvlab::cli {
namespace {

struct PrefillBenchOptions {
  std::string model = "smollm2-135m";
  int64_t tokens = 512;
  int reps = 3;
  int64_t decode = 0;
  std::string dtype = "fp32";
  std::string weights = "fp32";
  std::string device = "cpu";
  bool json = false;
  void fields(FieldList& f) {
    f.add("model", model, "HF directory, .gguf file, or a name (smollm2-135m, stories260k)");
    f.add("tokens", tokens, "prompt length");
    f.add("reps", reps, "timed repetitions after one warm-up (median reported)");
    f.add("decode", decode, "after the last prefill, time this many greedy decode steps (median TPOT)");
    f.add("dtype", dtype, "compute dtype: fp32 | bf16 | fp16");
    f.add("weights", weights, "a GGUF's matrices: stored = used as the file stores them (CPU, fp32; issue 51), fp32 = dequantized at load").one_of({"fp32", "stored"});
    f.add("device", device, "cpu | cuda | cuda:N");
    f.add("json", json, "print JSON instead of text");
  }
};

void run_prefill_bench(const PrefillBenchOptions& o, const nlohmann::json& /*effective*/) {
  KVLAB_CHECK(o.tokens >= 1, "--tokens must be >= 1, got {}", o.tokens);
  KVLAB_CHECK(o.reps >= 1, "--reps must be >= 1, got {}", o.reps);
  KVLAB_CHECK(o.decode >= 0, "--decode must be >= 0, got {}", o.decode);
  ModelLoadOptions lo;
  lo.dtype = parse_compute_dtype(o.dtype, "--dtype");
  lo.stored_weights = parse_weights_flag(o.weights, "--weights");
  lo.device = parse_device(o.device, "--device");
  Model model = load_model(o.model, lo);
  const int64_t vocab = model.config.vocab_size;
  KVLAB_CHECK(vocab > 100, "bench prefill needs a vocabulary > 100, model has {}", vocab);
  // Once the flags are known to be good, so that a bad one still gives a single error line.
  if (const std::string w = blas_core_warning(); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  std::vector<int64_t> ids(o.tokens);
  for (int64_t i = 0; i < o.tokens; ++i) ids[i] = 100 + (i * 7919) % (vocab - 100);
  at::Tensor tokens = at::tensor(ids, at::kLong);  // [N]
  c10::InferenceMode guard;
  ExactAttention attn(model.config.n_layers);
  at::Tensor logits;  // [1, vocab] of the last forward
  auto once = [&] {
    attn.reset();
    logits = forward(model, tokens, 0, attn);  // [1, vocab]
    (void)logits.sum().item<double>();         // waits for the device
  };
  once();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < o.reps; ++r) {
    auto a = std::chrono::steady_clock::now();
    once();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  const double med = t[t.size() / 2];
  const double tps = o.tokens / med;
  // Decode steps continue the last prefill (its cache holds o.tokens positions).
  std::vector<double> steps;
  for (int64_t s = 0; s < o.decode; ++s) {
    auto a = std::chrono::steady_clock::now();
    at::Tensor next = logits.select(0, 0).argmax().view({1});  // [1]
    logits = forward(model, next, o.tokens + s, attn);          // [1, vocab]
    (void)logits.sum().item<double>();
    steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(steps.begin(), steps.end());
  const double tpot = steps.empty() ? 0.0 : steps[steps.size() / 2];
  if (o.json) {
    nlohmann::json j = {{"impl", "kvlab"}, {"model", model.id}, {"tokens", o.tokens},
                        {"threads", at::get_num_threads()}, {"dtype", o.dtype},
                        {"device", model.device.str()}, {"seconds", med}, {"tokens_per_s", tps},
                        {"decode_steps", o.decode}, {"tpot_s", tpot}};
    std::cout << j.dump() << "\n";
    return;
  }
  fmt::print("kvlab prefill: model={} tokens={} threads={} dtype={} device={}  {:.3f} s  {:.1f} tokens/s\n",
             model.id, o.tokens, at::get_num_threads(), o.dtype, model.device.str(), med, tps);
  if (o.decode > 0)
    fmt::print("kvlab decode: {} steps after {} tokens  TPOT {:.2f} ms (median)\n", o.decode, o.tokens, tpot * 1e3);
}

}  // namespace

void setup_bench_prefill(CLI::App& app) {
  add_command<PrefillBenchOptions>(bench_group(app), "prefill",
                     "Model prefill throughput in tokens/s",
                     run_prefill_bench);
}

}  // namespace kvlab::cli
