// kvlab inspect FILE [--json]: summary of a capture (model, samples, lengths, layers, heads, sizes) and a
// read of every q/k/v value: non-finite ones are counted, the first located, and the exit status is 1.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
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

// The non-finite scan as JSON: {"count", "units", "first": {sample, layer, tensor, head, position, dim,
// value}}; the value is a string ("nan", "inf", "-inf") since JSON has no NaN.
nlohmann::json nonfinite_json(const CaptureNonFinite& nf) {
  nlohmann::json j = {{"count", nf.count}, {"units", nf.units}};
  if (nf.count > 0)
    j["first"] = {{"sample", nf.sample}, {"layer", nf.layer}, {"tensor", nf.first.tensor},
                  {"head", nf.first.head}, {"position", nf.first.position}, {"dim", nf.first.dim},
                  {"value", fmt::format("{}", nf.first.value)}};
  return j;
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
  const auto& nf = j["nonfinite"];
  const int64_t units = j["n_samples"].get<int64_t>() * int64_t(layers.size());
  if (nf["count"] == 0) {
    fmt::print("values     all finite ({} (sample, layer) units read)\n", units);
  } else {
    const auto& f = nf["first"];
    fmt::print("values     {} non-finite in {} of {} (sample, layer) units; the first: sample {}, layer {}, {} = {} "
               "at {} head {}, position {}\n", nf["count"].get<int64_t>(), nf["units"].get<int64_t>(), units,
               f["sample"].get<int64_t>(), f["layer"].get<int>(), f["tensor"].get<std::string>(),
               f["value"].get<std::string>(), f["tensor"] == "q" ? "query" : "KV", f["head"].get<int>(),
               f["position"].get<int64_t>());
  }
}

// Prints the summary, then reads every (sample, layer): non-finite q/k/v are reported and make the
// command fail (exit 1) after the summary.
void run_inspect(const InspectOptions& o, const nlohmann::json& /*effective*/) {
  CaptureReader reader(o.file);
  auto j = capture_summary(reader);
  const CaptureNonFinite nf = scan_nonfinite(reader);
  j["nonfinite"] = nonfinite_json(nf);
  if (o.json) std::cout << j.dump(2) << "\n";
  else print_text(j);
  std::cout.flush();
  KVLAB_CHECK(nf.count == 0, "capture '{}': {} non-finite value{} in q/k/v (in {} of {} (sample, layer) units); the "
              "first: sample {} ('{}'), layer {}: {}", reader.path(), nf.count, nf.count == 1 ? "" : "s", nf.units,
              reader.n_samples() * int64_t(reader.meta().layers.size()), nf.sample,
              reader.sample(nf.sample).sample_id, nf.layer, describe_nonfinite(nf.first));
}

}  // namespace

void setup_inspect(CLI::App& app) { add_command<InspectOptions>(app, "inspect", "Summarise a capture file", run_inspect); }

}  // namespace kvlab::cli
