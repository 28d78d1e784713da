// kvlab bench weights --model M [--rows 1,10] [--reps R] [--json]
// Weights as stored (issue 51) against fp32, both measured in this run on the same x:
//   - a pass: y = x Wᵀ for every matrix of the GGUF file once, in file order, as one decode step
//     reads them (memory-bound: the matrices do not stay in the caches between passes), with W used
//     as the file stores it (stored_linear: one block decoded at a time) and W dequantized to fp32
//     (the path kvlab takes today: at::mv for one row, few_rows_linear for 2..32, at::mm beyond);
//   - per distinct (ggml type, shape), the same product repeated on one matrix (cache-hot: the
//     kernels' arithmetic, not the memory).
// A ratio below 1 means the stored form is faster. The embedding is in the pass only when tied (the
// lm_head multiplies it); an untied one is looked up, not multiplied.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <tuple>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/io/gguf.h"
#include "kvlab/model/few_rows.h"
#include "kvlab/model/model.h"
#include "kvlab/model/stored_matrix.h"

namespace kvlab::cli {
namespace {

struct WeightsBenchOptions {
  std::string model = "smollm2-135m";
  std::vector<int64_t> rows = {1, 10};
  int reps = 20;
  bool json = false;
  void fields(FieldList& f) {
    f.add("model", model, "a .gguf file or a name resolving to one (smollm2-135m, qwen2.5-coder-0.5b)");
    f.add("rows", rows, "rows of x per product (1 = one decoded token; 10 = ten batched branches)");
    f.add("reps", reps, "timed repetitions per product after one warm-up (median reported)");
    f.add("json", json, "print one JSON line per (matrix, rows) instead of text");
  }
};

// The fp32 path of model.cpp's project(): at::mv for one row, few_rows_linear for 2..32, at::mm beyond.
at::Tensor fp32_linear(const at::Tensor& x, const at::Tensor& w) {
  if (x.size(0) == 1) return at::mv(w, x.select(0, 0)).unsqueeze(0);
  if (few_rows_applies(x, w, at::Tensor())) return few_rows_linear(x, w);
  return at::mm(x, w.t());
}

template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_weights_bench(const WeightsBenchOptions& o, const nlohmann::json& /*effective*/) {
  KVLAB_CHECK(o.reps >= 1, "--reps must be >= 1, got {}", o.reps);
  for (int64_t r : o.rows) KVLAB_CHECK(r >= 1, "--rows must be >= 1, got {}", r);
  const ModelSource src = resolve_model(o.model, "--model");
  KVLAB_CHECK(src.kind == ModelSource::Kind::gguf, "--model: weights as stored need a .gguf file, {} is a {}", src.path,
              "Hugging Face directory");
  const GgufFile file(src.path);
  c10::InferenceMode guard;
  // Each distinct (type, rows, cols) once, with how many matrices of the file share it.
  std::map<std::tuple<uint32_t, int64_t, int64_t>, std::pair<const GgufTensorInfo*, int>> kinds;
  for (const auto& info : file.tensors()) {
    if (info.shape.size() != 2 || !stored_applies(info.type, info.shape[1])) continue;
    auto& k = kinds[{static_cast<uint32_t>(info.type), info.shape[0], info.shape[1]}];
    if (!k.first) k.first = &info;
    ++k.second;
  }
  KVLAB_CHECK(!kinds.empty(), "--model {}: no matrix of a type kvlab can use as stored", src.path);
  if (!o.json)
    fmt::print("kvlab bench weights: {} threads={} (median of {}; ratio = stored / fp32 time)\n", src.path,
               at::get_num_threads(), o.reps);
  // The pass: every matrix of the file, stored and in fp32.
  std::vector<StoredMatrix> stored;
  std::vector<at::Tensor> fp32;
  int64_t stored_bytes = 0, fp32_bytes = 0;
  // The embedding is multiplied only as a tied lm_head (with an output.weight, it is looked up).
  const bool untied = file.has_tensor("output.weight");
  for (const auto& info : file.tensors())
    if (info.shape.size() == 2 && stored_applies(info.type, info.shape[1]) &&
        !(untied && info.name == "token_embd.weight")) {
      stored.push_back(stored_matrix(info));
      fp32.push_back(stored.back().dequantize());  // [rows, cols] float32
      stored_bytes += stored.back().nbytes();
      fp32_bytes += fp32.back().nbytes();
    }
  for (int64_t b : o.rows) {
    std::map<int64_t, at::Tensor> xs;  // x [b, cols] per width
    for (const auto& w : stored)
      if (!xs.count(w.cols)) xs[w.cols] = at::randn({b, w.cols});
    const int reps = std::max(3, o.reps / 4);
    const double ts = median_seconds(reps, [&] {
      for (const auto& w : stored) (void)stored_linear(xs.at(w.cols), w);
    });
    const double tf = median_seconds(reps, [&] {
      for (const auto& w : fp32) (void)fp32_linear(xs.at(w.size(1)), w);
    });
    if (o.json) {
      std::cout << nlohmann::json{{"pass", true}, {"matrices", stored.size()}, {"x_rows", b},
                                  {"threads", at::get_num_threads()}, {"stored_bytes", stored_bytes},
                                  {"fp32_bytes", fp32_bytes}, {"stored_ms", ts * 1e3}, {"fp32_ms", tf * 1e3},
                                  {"ratio", ts / tf}}
                       .dump()
                << "\n";
    } else {
      fmt::print("  pass over {} matrices, rows={:<3} stored {:8.2f} ms ({:6.1f} MB)  fp32 {:8.2f} ms ({:6.1f} MB)  "
                 "ratio {:.2f}\n",
                 stored.size(), b, ts * 1e3, stored_bytes / 1e6, tf * 1e3, fp32_bytes / 1e6, ts / tf);
    }
  }
  if (!o.json) fmt::print("  per matrix kind, cache-hot (one matrix repeated):\n");
  for (const auto& [key, v] : kinds) {
    const GgufTensorInfo& info = *v.first;
    const StoredMatrix w = stored_matrix(info);
    const at::Tensor wf = w.dequantize();  // [rows, cols] float32
    for (int64_t b : o.rows) {
      const at::Tensor x = at::randn({b, w.cols});  // [b, cols]
      const double ts = median_seconds(o.reps, [&] { (void)stored_linear(x, w); });
      const double tf = median_seconds(o.reps, [&] { (void)fp32_linear(x, wf); });
      if (o.json) {
        std::cout << nlohmann::json{{"pass", false}, {"tensor", info.name}, {"type", ggml_type_name(info.type)}, {"rows", w.rows},
                                    {"cols", w.cols}, {"count", v.second}, {"x_rows", b},
                                    {"threads", at::get_num_threads()}, {"stored_bytes", w.nbytes()},
                                    {"fp32_bytes", wf.nbytes()}, {"stored_ms", ts * 1e3}, {"fp32_ms", tf * 1e3},
                                    {"ratio", ts / tf}}
                         .dump()
                  << "\n";
      } else {
        fmt::print("  {:<28} {:>5} {:>6}x{:<5} x{:<3} rows={:<3} stored {:7.3f} ms ({:5.1f} MB)  fp32 {:7.3f} ms "
                   "({:5.1f} MB)  ratio {:.2f}\n",
                   info.name, ggml_type_name(info.type), w.rows, w.cols, v.second, b, ts * 1e3, w.nbytes() / 1e6,
                   tf * 1e3, double(wf.nbytes()) / 1e6, ts / tf);
      }
    }
  }
}

}  // namespace

void setup_bench_weights(CLI::App& app) {
  add_command<WeightsBenchOptions>(bench_group(app), "weights",
                                   "Weights as stored against fp32: y = x W^T per matrix type of a GGUF file",
                                   run_weights_bench);
}

}  // namespace kvlab::cli
