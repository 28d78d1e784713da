// kvlab: KV-cache compression research harness. Each subcommand lives in its own cmd_*.cpp;
// this file only wires them up, applies global settings, and is the one place that catches.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <dlfcn.h>

#include <iostream>
#include <thread>

#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"

namespace kvlab::cli {
namespace {
int g_threads = 0;

// LibTorch's CPU matmul goes to OpenBLAS when libopenblas0-pthread is installed; its own thread
// pool ignores at::set_num_threads. Set it too when it is there (no link-time dependency).
void set_blas_threads(int n) {
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}
}  // namespace
int threads() { return g_threads; }
}  // namespace kvlab::cli

int main(int argc, char** argv) {
  CLI::App app{"kvlab: KV-cache compression research harness (capture, replay, analyse, benchmark)"};
  app.require_subcommand(0, 1);
  bool version = false;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_flag("--version", version, "print version, git SHA, LibTorch version and CUDA availability");
  app.add_option("--threads", threads, "LibTorch intra-op threads (default: the core count)")
      ->check(CLI::PositiveNumber);

  kvlab::cli::setup_inspect(app);
  kvlab::cli::setup_synth(app);
  kvlab::cli::setup_bench(app);
  kvlab::cli::setup_bench_compress(app);
  kvlab::cli::setup_replay(app);
  kvlab::cli::setup_merge(app);
  kvlab::cli::setup_generate(app);
  kvlab::cli::setup_dump(app);
  kvlab::cli::setup_bench_prefill(app);
  kvlab::cli::setup_run(app);

  // Global settings take effect before any subcommand callback runs.
  app.parse_complete_callback([&] {
    at::set_num_threads(threads);
    kvlab::cli::set_blas_threads(threads);
    kvlab::cli::g_threads = threads;
  });

  try {
    app.parse(argc, argv);
    if (version) {
      fmt::print("kvlab {}\ngit {}{}\nLibTorch {}\nCUDA {}{}\nbuild {}\n", kvlab::kvlab_version(),
                 kvlab::git_sha(), kvlab::git_dirty() ? " (dirty)" : "", kvlab::torch_version(),
                 kvlab::cuda_available() ? "available" : "not available",
                 kvlab::cuda_version() == "none" ? "" : " (runtime " + kvlab::cuda_version() + ")",
                 kvlab::build_type());
      return 0;
    }
    if (app.get_subcommands().empty()) {
      std::cout << app.help();
      return 0;
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvlab::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
