// kvlab inspect FILE [--json]: summary of a capture (model, samples, lengths, layers, heads, sizes).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/io/capture.h"

namespace kvlab::cli {
namespace {

struct InspectOptions {
  std::string file;
  bool json = false;
  void fields(FieldList& f) {
    f.add("file", file, "capture file (.h5) written by 'kvlab dump' or 'kvlab synth'").positional().required();
    f.add("json", json, "print a machine-readable JSON summary");
  }
};

nlohmann::json summarise(const CaptureReader& r) {
  const auto& m = r.meta();
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t i = 0; i < r.n_samples(); ++i) {
    const auto& s = r.sample(i);
    samples.push_back({{"index", i}, {"sample_id", s.sample_id}, {"n_tokens", s.n_tokens},
                       {"n_q", s.n_q}, {"q_start", s.q_start}});
  }
  return {{"file", r.path()},
          {"kvlab_capture_version", kCaptureVersion},
          {"model_id", m.model_id},
          {"architecture", m.architecture},
          {"n_layers", m.n_layers},
          {"n_q_heads", m.n_q_heads},
          {"n_kv_heads", m.n_kv_heads},
          {"head_dim", m.head_dim},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", m.rope_scaling},
          {"dtype", m.dtype},
          {"layers", m.layers},
          {"queries", m.queries},
          {"source_dataset", m.source_dataset},
          {"kvlab_version", m.kvlab_version},
          {"git_sha", m.git_sha},
          {"n_samples", r.n_samples()},
          {"samples", samples},
          {"shapes", {{"q", {m.n_q_heads, "n_q", m.head_dim}},
                      {"k", {m.n_kv_heads, "n_tokens", m.head_dim}},
                      {"v", {m.n_kv_heads, "n_tokens", m.head_dim}}}},
          {"file_bytes", r.file_bytes()},
          {"raw_bytes", r.raw_bytes()}};
}

void print_text(const nlohmann::json& j) {
  fmt::print("capture    {}\n", j["file"].get<std::string>());
  fmt::print("model      {} ({})\n", j["model_id"].get<std::string>(), j["architecture"].get<std::string>());
  fmt::print("heads      n_q_heads={} n_kv_heads={} head_dim={}  rope_theta={}\n", j["n_q_heads"].get<int>(),
             j["n_kv_heads"].get<int>(), j["head_dim"].get<int>(), j["rope_theta"].get<double>());
  auto layers = j["layers"].get<std::vector<int>>();
  fmt::print("layers     {} of {} captured: {}\n", layers.size(), j["n_layers"].get<int>(), fmt::join(layers, ","));
  fmt::print("dtype      {}   queries {}\n", j["dtype"].get<std::string>(), j["queries"].get<std::string>());
  fmt::print("source     {}\n", j["source_dataset"].get<std::string>());
  fmt::print("written by kvlab {} ({})\n", j["kvlab_version"].get<std::string>(),
             j["git_sha"].get<std::string>().substr(0, 12));
  fmt::print("samples    {}\n", j["n_samples"].get<int64_t>());
  for (const auto& s : j["samples"]) {
    int64_t n = s["n_tokens"], nq = s["n_q"];
    fmt::print("  [{}] {}  n_tokens={}  n_q={}  q: [{}, {}, {}]  k,v: [{}, {}, {}]\n", s["index"].get<int64_t>(),
               s["sample_id"].get<std::string>(), n, nq, j["n_q_heads"].get<int>(), nq, j["head_dim"].get<int>(),
               j["n_kv_heads"].get<int>(), n, j["head_dim"].get<int>());
  }
  double file_mb = j["file_bytes"].get<int64_t>() / 1048576.0, raw_mb = j["raw_bytes"].get<int64_t>() / 1048576.0;
  fmt::print("size       {:.2f} MiB on disk, {:.2f} MiB of q/k/v uncompressed\n", file_mb, raw_mb);
}

void run_inspect(const InspectOptions& o, const nlohmann::json& /*effective*/) {
  CaptureReader reader(o.file);
  auto j = summarise(reader);
  if (o.json) std::cout << j.dump(2) << "\n";
  else print_text(j);
}

}  // namespace

void setup_inspect(CLI::App& app) { add_command<InspectOptions>(app, "inspect", "Summarise a capture file", run_inspect); }

}  // namespace kvlab::cli
