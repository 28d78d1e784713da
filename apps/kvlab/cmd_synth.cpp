// kvlab synth --out F.h5 [--kind random|clustered|heavy] ...: a synthetic capture, so replay,
// analyses and benchmarks run without a model.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/report.h"
#include "kvlab/io/synthetic.h"

namespace kvlab::cli {
namespace {

struct SynthOptions {
  std::string out;
  bool overwrite = false;
  std::string kind = "random";
  int64_t tokens = 1024;
  int64_t queries = 64;
  int layers = 2;
  int q_heads = 4;
  int kv_heads = 2;
  int head_dim = 64;
  int samples = 1;
  int clusters = 16;
  int heavy = 8;
  uint64_t seed = 0;
  std::string dtype = "float32";
  void fields(FieldList& f) {
    f.add("out", out, "output capture file (.h5)").required();
    f.add("overwrite", overwrite, "replace an existing --out file");
    f.add("kind", kind, "random | clustered | heavy").one_of({"random", "clustered", "heavy"});
    f.add("tokens", tokens, "tokens per sample (n_tokens)");
    f.add("queries", queries, "captured trailing queries per sample (n_q)");
    f.add("layers", layers, "layers");
    f.add("q_heads", q_heads, "query heads");
    f.add("kv_heads", kv_heads, "KV heads");
    f.add("head_dim", head_dim, "head dimension");
    f.add("samples", samples, "samples");
    f.add("clusters", clusters, "clusters (kind=clustered)");
    f.add("heavy", heavy, "heavy tokens (kind=heavy)");
    f.add("seed", seed, "random seed");
    f.add("dtype", dtype, "storage dtype").one_of({"float32", "float16", "bfloat16"});
  }
  void check() const {
    KVLAB_CHECK(tokens >= 1, "--tokens must be >= 1, got {}", tokens);
    KVLAB_CHECK(queries >= 1 && queries <= tokens, "--queries must be in [1, --tokens={}], got {}", tokens, queries);
    KVLAB_CHECK(layers >= 1 && samples >= 1 && head_dim >= 1, "--layers, --samples, --head-dim must be >= 1");
    KVLAB_CHECK(kv_heads >= 1 && q_heads % kv_heads == 0, "--q-heads ({}) must be a multiple of --kv-heads ({})",
                q_heads, kv_heads);
  }
};

void run_synth(const SynthOptions& o, const nlohmann::json& /*effective*/) {
  check_output_file(o.out, "--out", {}, o.overwrite);
  SyntheticSpec s;
  s.kind = o.kind;
  s.n_layers = o.layers;
  s.n_q_heads = o.q_heads;
  s.n_kv_heads = o.kv_heads;
  s.head_dim = o.head_dim;
  s.n_tokens = o.tokens;
  s.n_q = o.queries;
  s.n_samples = o.samples;
  s.n_clusters = o.clusters;
  s.n_heavy = o.heavy;
  s.seed = o.seed;
  if (remove_stale_partial(o.out))
    fmt::print(stderr, "[synth] removed {}.partial, left by an interrupted run; writing it again from the start\n",
               o.out);
  write_synthetic_capture(o.out, s, o.dtype);
  fmt::print(stderr, "wrote {} ({} samples x {} layers, {} tokens)\n", o.out, o.samples, o.layers, o.tokens);
}

}  // namespace

void setup_synth(CLI::App& app) { add_command<SynthOptions>(app, "synth", "Write a synthetic capture (no model needed)", run_synth); }

}  // namespace kvlab::cli
