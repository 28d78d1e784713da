// kvlab bench attention: exact-attention replay throughput in GFLOP/s (the blocked path replay
// uses, and the simple reference beside it), against the machine's matmul GFLOP/s measured in the
// same run (a ratio, not an absolute target).
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/attention/attention.h"
#include "kvlab/core/blas.h"
#include "kvlab/core/check.h"

namespace kvlab::cli {
namespace {

struct AttentionBenchOptions {
  int64_t tokens = 4096;
  int64_t queries = 256;
  int q_heads = 9;
  int kv_heads = 3;
  int head_dim = 64;
  int reps = 5;
  int64_t matmul_size = 1024;
  bool json = false;
  void fields(FieldList& f) {
    f.add("tokens", tokens, "cached tokens n");
    f.add("queries", queries, "queries n_q (the last positions)");
    f.add("q_heads", q_heads, "query heads");
    f.add("kv_heads", kv_heads, "KV heads");
    f.add("head_dim", head_dim, "head dimension");
    f.add("reps", reps, "timed repetitions (median reported)");
    f.add("matmul_size", matmul_size, "side of the square float32 matmul used as the reference");
    f.add("json", json, "print JSON instead of text");
  }
};

template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_attention_bench(const AttentionBenchOptions& o, const nlohmann::json& /*effective*/) {
  // Bounds first: a zero head count divides by zero, a zero width reaches LibTorch raw.
  KVLAB_CHECK(o.tokens >= 1 && o.tokens <= (int64_t{1} << 20), "--tokens must be in [1, 1048576], got {}", o.tokens);
  KVLAB_CHECK(o.q_heads >= 1 && o.q_heads <= 1024, "--q-heads must be in [1, 1024], got {}", o.q_heads);
  KVLAB_CHECK(o.kv_heads >= 1 && o.kv_heads <= 1024, "--kv-heads must be in [1, 1024], got {}", o.kv_heads);
  KVLAB_CHECK(o.head_dim >= 1 && o.head_dim <= 4096, "--head-dim must be in [1, 4096], got {}", o.head_dim);
  KVLAB_CHECK(o.reps <= 10000, "--reps must be <= 10000, got {}", o.reps);
  KVLAB_CHECK(o.queries >= 1 && o.queries <= o.tokens, "--queries must be in [1, --tokens], got {}", o.queries);
  KVLAB_CHECK(o.reps >= 1, "--reps must be >= 1, got {}", o.reps);
  KVLAB_CHECK(o.matmul_size >= 1 && o.matmul_size <= 16384, "--matmul-size must be in [1, 16384], got {}",
              o.matmul_size);
  KVLAB_CHECK(o.q_heads % o.kv_heads == 0, "--q-heads must be a multiple of --kv-heads");
  // Once the flags are known to be good, so that a bad one still gives a single error line.
  if (const std::string w = blas_core_warning(); !w.empty()) fmt::print(stderr, "warning: {}\n", w);
  auto opt = at::TensorOptions().dtype(at::kFloat);
  const int64_t m = o.matmul_size;
  auto a = at::randn({m, m}, opt), b = at::randn({m, m}, opt);
  double t_mm = median_seconds(o.reps, [&] { (void)at::matmul(a, b); });
  double gflops_mm = 2.0 * m * m * m / t_mm / 1e9;

  auto q = at::randn({o.q_heads, o.queries, o.head_dim}, opt);
  auto k = at::randn({o.kv_heads, o.tokens, o.head_dim}, opt);
  auto v = at::randn({o.kv_heads, o.tokens, o.head_dim}, opt);
  double t_att = median_seconds(o.reps, [&] { (void)exact_attention(q, k, v, true); });
  // The simple reference (whole score matrix) on the same inputs, timed and compared.
  KVSet set{k, v, {}, at::arange(o.tokens, at::kLong)};
  AttentionOptions ao;
  ao.query_pos = tail_positions(o.tokens, o.queries, k);
  double t_ref = median_seconds(o.reps, [&] { (void)attention_reference(q, set, nullptr, ao); });
  const double max_diff =
      (exact_attention(q, k, v, true) - attention_reference(q, set, nullptr, ao)).abs().max().item<double>();
  // Useful FLOPs: q·kᵀ and p·v over every (query head, query, key) pair: 4·Hq·n_q·n·d.
  double flops = 4.0 * o.q_heads * o.queries * o.tokens * o.head_dim;
  double gflops_att = flops / t_att / 1e9, gflops_ref = flops / t_ref / 1e9;
  nlohmann::json j = {{"threads", at::get_num_threads()},
                      {"matmul", {{"size", m}, {"seconds", t_mm}, {"gflops", gflops_mm}}},
                      {"exact_attention", {{"n_q_heads", o.q_heads}, {"n_kv_heads", o.kv_heads},
                                           {"n_tokens", o.tokens}, {"n_q", o.queries},
                                           {"head_dim", o.head_dim}, {"seconds", t_att},
                                           {"gflops", gflops_att}, {"ms_per_call", t_att * 1e3}}},
                      {"reference_attention", {{"seconds", t_ref}, {"gflops", gflops_ref},
                                               {"max_abs_diff_to_blocked", max_diff}}},
                      {"ratio_attention_to_matmul", gflops_att / gflops_mm},
                      {"ratio_reference_to_matmul", gflops_ref / gflops_mm}};
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("threads                 {}\n", at::get_num_threads());
  fmt::print("matmul {}x{}x{} fp32   {:8.2f} GFLOP/s  ({:.2f} ms)\n", m, m, m, gflops_mm, t_mm * 1e3);
  fmt::print("exact attention fp32    {:8.2f} GFLOP/s  ({:.2f} ms; n_q_heads={} n_kv_heads={} n={} n_q={} d={})\n",
             gflops_att, t_att * 1e3, o.q_heads, o.kv_heads, o.tokens, o.queries, o.head_dim);
  fmt::print("reference attention     {:8.2f} GFLOP/s  ({:.2f} ms; whole score matrix; max |blocked - reference| {:.2g})\n",
             gflops_ref, t_ref * 1e3, max_diff);
  fmt::print("ratio attention/matmul  {:8.3f}  (reference {:.3f})\n", gflops_att / gflops_mm, gflops_ref / gflops_mm);
}

}  // namespace

CLI::App& bench_group(CLI::App& app) {
  auto found = app.get_subcommands([](CLI::App* a) { return a->get_name() == "bench"; });
  if (!found.empty()) return *found.front();
  auto* bench = app.add_subcommand("bench", "Micro-benchmarks that print figures (ratios against a reference "
                                   "measured in the same run)");
  bench->require_subcommand(1);
  return *bench;
}

void setup_bench(CLI::App& app) {
  add_command<AttentionBenchOptions>(bench_group(app), "attention",
                     "Exact-attention replay throughput vs matmul GFLOP/s",
                     run_attention_bench);
}

}  // namespace kvlab::cli
