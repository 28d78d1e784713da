// kvlab: KV-cache compression research harness. Each subcommand lives in its own cmd_*.cpp;
// this file only wires them up, applies global settings, and is the one place that catches.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <thread>

#include "commands.h"
#include "kvlab/attention/exact_cache.h"
#include "kvlab/core/blas.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"

// libgomp reads OMP_WAIT_POLICY once, in its constructor, before main(). Its default (spin ~0.3 s
// before sleeping) makes LibTorch's OpenMP threads and OpenBLAS's burn the cores they wait on, and
// with any other load on the machine prefill ran 4-10x slower (issue 13: 35 vs 367 tokens/s at 512
// tokens, 2 threads, a compile on the other core). Nothing set after that constructor has run
// changes the policy (a .preinit_array setenv is undone by libc's own initialiser), so kvlab
// re-executes itself once with the passive policy unless the user chose one. The re-exec costs one
// more dynamic load (~0.1-0.3 s); if /proc/self/exe cannot be executed kvlab runs on as it is.
namespace {
//
// The same exec carries OPENBLAS_CORETYPE where OpenBLAS fell back to kernels without AVX-512 on a
// CPU that has it (kvlab::blas_core_to_pin, core/blas.h: 3.3x slower prefill on Sapphire Rapids).
void ensure_passive_omp(char** argv) {
  const bool omp = std::getenv("OMP_WAIT_POLICY") == nullptr;
  const std::string core = kvlab::blas_core_to_pin();
  if (!omp && core.empty()) return;
  if (omp && setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  if (!core.empty() && setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  if (omp) unsetenv("OMP_WAIT_POLICY");  // the exec failed: this process runs on as it is
  if (!core.empty()) unsetenv("OPENBLAS_CORETYPE");
}

// The forward pass allocates and frees tensors of megabytes every layer. glibc serves blocks above
// its mmap threshold with fresh mappings and returns a freed heap top to the kernel, so each such
// allocation page-faults its memory in again (~9% of prefill at 2048 tokens). A fixed 32 MiB
// threshold (glibc's ceiling) and a 1 GiB trim threshold keep that memory in the process.
void keep_freed_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}
}  // namespace

namespace kvlab::cli {
namespace {
int g_threads = 0;
}  // namespace
int threads() { return g_threads; }
}  // namespace kvlab::cli

namespace {

// An error as one line of at most 300 characters (issue 50): a library's message may span lines
// (LibTorch's carry a trace) or run long.
std::string one_line(const std::string& msg) {
  std::string out;
  for (char ch : msg) {
    if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
    if (ch == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += ch;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  constexpr size_t kMax = 290;  // "error: " and the line end
  if (out.size() > kMax) out = out.substr(0, kMax - 3) + "...";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_omp(argv);
  keep_freed_memory();
  CLI::App app{"kvlab: KV-cache compression research harness (capture, replay, analyse, benchmark)"};
  app.require_subcommand(0, 1);
  bool version = false;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = cores;
  app.add_flag("--version", version, "print version, git SHA, LibTorch and BLAS, threads, CUDA availability");
  app.add_option("--threads", threads, "LibTorch (and BLAS) threads (default: the core count)")
      ->check(CLI::Range(1, 4 * cores).description(fmt::format("in [1, {}] (4x the {} cores)", 4 * cores, cores)));

  kvlab::cli::setup_inspect(app);
  kvlab::cli::setup_synth(app);
  kvlab::cli::setup_bench(app);
  kvlab::cli::setup_bench_compress(app);
  kvlab::cli::setup_replay(app);
  kvlab::cli::setup_merge(app);
  kvlab::cli::setup_generate(app);
  kvlab::cli::setup_dump(app);
  kvlab::cli::setup_bench_prefill(app);
  kvlab::cli::setup_bench_weights(app);
  kvlab::cli::setup_run(app);
  kvlab::cli::setup_calibrate(app);
  kvlab::cli::setup_ppl(app);
  kvlab::cli::setup_longeval(app);
  kvlab::cli::setup_niah(app);
  kvlab::cli::setup_ruler(app);
  kvlab::cli::setup_longbench(app);
  kvlab::cli::setup_summarize(app);
  kvlab::cli::setup_bench_generate(app);
  kvlab::cli::setup_tsne(app);
  kvlab::cli::setup_clusterability(app);
  kvlab::cli::setup_sweep(app);
  kvlab::cli::setup_buzz_steady(app);

  // Global settings take effect before any subcommand callback runs.
  app.parse_complete_callback([&] {
    at::set_num_threads(threads);
    kvlab::set_blas_threads(threads);
    kvlab::cli::g_threads = threads;
    const kvlab::BlasInfo blas = kvlab::blas_info();
    if (threads > 1 && blas.threading == "pthread" && !version)
      fmt::print(stderr, "warning: OpenBLAS uses its own pthread pool, which competes with LibTorch's "
                         "OpenMP threads (prefill runs ~4x slower); scripts/setup.sh selects the OpenMP "
                         "build (libopenblas0-openmp), or set OMP_WAIT_POLICY=PASSIVE\n");
  });

  try {
    app.parse(argc, argv);
    if (version) {
      const kvlab::BlasInfo blas = kvlab::blas_info();
      fmt::print("kvlab {}\ngit {}{}\nLibTorch {}\nCUDA {}{}\nbuild {}\nthreads {} (LibTorch), {} (BLAS)\n"
                 "BLAS {} ({}, {} kernels)\nOpenMP wait policy {}\nprefill attention {}\n",
                 kvlab::kvlab_version(), kvlab::git_sha(), kvlab::git_dirty() ? " (dirty)" : "",
                 kvlab::torch_version(), kvlab::cuda_available() ? "available" : "not available",
                 kvlab::cuda_version() == "none" ? "" : " (runtime " + kvlab::cuda_version() + ")",
                 kvlab::build_type(), at::get_num_threads(), blas.threads, blas.name, blas.threading,
                 blas.core.empty() ? "unknown" : blas.core,
                 std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "default",
                 kvlab::causal_attention_parallel() ? "parallel over (KV head, query block)"
                                                    : "block by block (no OpenMP shared with LibTorch)");
      if (const std::string w = kvlab::blas_core_warning(); !w.empty()) fmt::print("warning: {}\n", w);
      return 0;
    }
    if (app.get_subcommands().empty()) {
      std::cout << app.help();
      return 0;
    }
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // CLI11 prints two lines without "error:" and exits 104-114 by kind; kvlab's form is one line,
    // "error: ...", and exit 2 for every flag error (issue 26).
    std::string msg = e.what(), cmd = "kvlab";
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    while (!msg.empty() && msg.back() == ' ') msg.pop_back();
    for (const CLI::App* sub : app.get_subcommands()) cmd += " " + sub->get_name();
    fmt::print(stderr, "error: {} ({} --help lists the flags)\n", msg, cmd);
    return 2;
  } catch (const kvlab::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: LibTorch: {}\n", one_line(e.what_without_backtrace()));
    return 1;
  } catch (const nlohmann::json::exception& e) {
    fmt::print(stderr, "error: a JSON value of another type or form than kvlab expects (a --config, an input or a "
                       "results file): {}\n", one_line(e.what()));
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of memory (std::bad_alloc): the run needs more memory than this machine has "
                       "free; lower its sizes\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", one_line(e.what()));
    return 1;
  }
  return 0;
}
