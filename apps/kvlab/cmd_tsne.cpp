// kvlab tsne --capture F.h5 [--layers 0,14,29] [--heads 0] [--sample 0] [--max-points 2000]
//            [--perplexity 30] [--method barnes_hut|exact] ... --out DIR | --name N
// t-SNE of the keys and of the values of chosen (layer, KV head) pairs of one captured sample
// (SubGen Fig. 1 / ClusterGen Fig. 1), the greedy k-center centres (k = --kcenter-k, picked in the
// input space) marked. Writes result.json (one row per (layer, head, keys|values): trustworthiness,
// KL, iterations), embedding.csv and tsne.svg (keys row, values row, one column per layer).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "command.h"
#include "commands.h"
#include "kvlab/analysis/points.h"
#include "kvlab/analysis/trustworthiness.h"
#include "kvlab/analysis/tsne.h"
#include "kvlab/analysis/tsne_figure.h"
#include "kvlab/compress/kcenter.h"
#include "kvlab/core/check.h"
#include "kvlab/core/provenance.h"
#include "kvlab/core/report.h"
#include "kvlab/core/text.h"
#include "kvlab/io/capture.h"
#include "kvlab/replay/plan.h"
#include "run_folder.h"

namespace kvlab::cli {
namespace {

struct TsneCmdOptions : RunFolderOptions {
  TsneCmdOptions() : RunFolderOptions("tsne") {}
  std::string capture;
  std::string layers = "all";
  std::string heads = "0";
  int64_t sample = 0;
  int64_t max_points = 2000;
  int64_t skip_first = 0;
  int64_t last = 0;
  double perplexity = 30;
  int64_t max_iter = 1000;
  double learning_rate = 0;
  double early_exaggeration = 12;
  double angle = 0.5;
  std::string method = "barnes_hut";
  std::string init = "pca";
  uint64_t seed = 0;
  int64_t kcenter_k = 16;
  int64_t trust_k = 10;

  void fields(FieldList& f) {
    f.add("capture", capture, "capture file (.h5) from 'kvlab dump' or 'kvlab synth'").required();
    f.add("layers", layers, "layers: all (captured) | 0,14,29 | 0-3");
    f.add("heads", heads, "KV heads: all | 0,2");
    f.add("sample", sample, "sample index in the capture");
    f.add("max_points", max_points, "at most this many tokens per panel, every stride-th (0: all)");
    f.add("skip_first", skip_first, "leave out the first N tokens (e.g. the attention sink)");
    f.add("last", last, "only the last N tokens of each sample (e.g. the N a dump generated, dump --generate N); "
                      "0: all");
    f.add("perplexity", perplexity, "t-SNE perplexity (sklearn's default 30)");
    f.add("max_iter", max_iter, "t-SNE iterations (>= 250)");
    f.add("learning_rate", learning_rate, "t-SNE learning rate; 0: auto = max(n / early_exaggeration / 4, 50)");
    f.add("early_exaggeration", early_exaggeration, "t-SNE early exaggeration (first 250 iterations)");
    f.add("angle", angle, "Barnes-Hut opening angle θ");
    f.add("method", method, "t-SNE gradient: barnes_hut (O(n log n)) | exact (O(n²))").one_of({"barnes_hut", "exact"});
    f.add("init", init, "t-SNE initialisation: pca | random").one_of({"pca", "random"});
    f.add("seed", seed, "seed of --init random");
    f.add("kcenter_k", kcenter_k, "greedy k-center centres marked per panel");
    f.add("trust_k", trust_k, "neighbours of the trustworthiness score");
    run_folder_fields(f);
  }
  void check() const {
    KVLAB_CHECK(max_iter >= 250 && max_iter <= 1000000, "--max-iter must be in [250, 1000000], got {}", max_iter);
    KVLAB_CHECK(learning_rate >= 0, "--learning-rate must be > 0, or 0 for auto; got {}", learning_rate);
    parse_tsne_method(method, "--method");
    parse_tsne_init(init, "--init");
    KVLAB_CHECK(kcenter_k >= 1, "--kcenter-k must be >= 1, got {}", kcenter_k);
  }
};

void run_tsne(const TsneCmdOptions& o, const nlohmann::json& effective) {
  TsneOptions topt;
  topt.perplexity = o.perplexity;
  topt.max_iter = int(o.max_iter);
  topt.learning_rate = o.learning_rate;
  topt.early_exaggeration = o.early_exaggeration;
  topt.angle = o.angle;
  topt.method = parse_tsne_method(o.method, "--method");
  topt.init = parse_tsne_init(o.init, "--init");
  topt.seed = o.seed;

  CaptureReader cap(o.capture);
  const auto& meta = cap.meta();
  KVLAB_CHECK(o.sample >= 0 && o.sample < cap.n_samples(), "--sample must be in [0, {}) ({} holds {} samples), got {}",
              cap.n_samples(), o.capture, cap.n_samples(), o.sample);
  const auto layers = select_layers(meta, o.layers);
  const auto heads = parse_index_list(o.heads, meta.n_kv_heads, "--heads");
  const auto positions = strided_positions(cap.sample(o.sample).n_tokens, o.skip_first, o.max_points, o.last);  // [n]
  const int64_t n = positions.size(0);
  KVLAB_CHECK(o.kcenter_k <= n, "--kcenter-k {} exceeds the {} tokens taken (--max-points {})", o.kcenter_k, n,
              o.max_points);
  KVLAB_CHECK(o.trust_k >= 1 && 2 * o.trust_k < n, "--trust-k must be in [1, {}) for {} tokens, got {}", (n + 1) / 2, n,
              o.trust_k);

  RunDir run = o.open_run(effective);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<TsnePanel> panels;
  std::string csv = "layer,kv_head,kind,position,x,y,centre_rank\n";
  for (int layer : layers) {
    const LayerQKV qkv = cap.read_layer(o.sample, layer);
    check_finite(cap, o.sample, layer, qkv);
    for (int head : heads)
      for (const char* kind : {"keys", "values"}) {
        const at::Tensor& src = std::string(kind) == "keys" ? qkv.k : qkv.v;  // [n_kv_heads, n_tokens, head_dim]
        auto x = src[head].index_select(0, positions).contiguous();         // [n, head_dim]
        const auto t0 = std::chrono::steady_clock::now();
        auto res = tsne(x, topt);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tw = trustworthiness(x, res.embedding, o.trust_k);
        auto kc = greedy_kcenter(x, o.kcenter_k, 0);
        std::vector<int64_t> centres(kc.centres.data_ptr<int64_t>(), kc.centres.data_ptr<int64_t>() + o.kcenter_k);
        rows.push_back({{"sample", o.sample}, {"layer", layer}, {"kv_head", head}, {"kind", kind}, {"n_points", n},
                        {"dim", x.size(1)}, {"trustworthiness", tw}, {"trust_k", o.trust_k},
                        {"kl_divergence", res.kl_divergence}, {"n_iter", res.n_iter + 1},
                        {"learning_rate", res.learning_rate}, {"kcenter_radius", kc.radius}, {"seconds", secs}});
        fmt::print(stderr, "[tsne] layer {} head {} {}: {} points, trustworthiness({}) {:.4f}, KL {:.4f}, {:.1f} s\n",
                   layer, head, kind, n, o.trust_k, tw, res.kl_divergence, secs);
        std::vector<int64_t> rank(n, -1);
        for (size_t c = 0; c < centres.size(); ++c) rank[centres[c]] = int64_t(c);
        auto e = res.embedding.contiguous();
        const double* pe = e.data_ptr<double>();
        const int64_t* pp = positions.data_ptr<int64_t>();
        for (int64_t i = 0; i < n; ++i)
          csv += fmt::format("{},{},{},{},{:.6g},{:.6g},{}\n", layer, head, kind, pp[i], pe[2 * i], pe[2 * i + 1], rank[i]);
        panels.push_back({kind, layer, head, res.embedding, positions, centres, tw, int(o.trust_k)});
      }
  }
  write_text_atomic(run.file("embedding.csv"), csv);
  const std::string title = fmt::format("t-SNE of keys and values: {} ({} tokens of sample {}, {} shown), k = {} "
                                        "centres", meta.model_id, cap.sample(o.sample).n_tokens, o.sample, n, o.kcenter_k);
  write_text_atomic(run.file("tsne.svg"), tsne_figure_svg(panels, title));
  auto context = context_block("cpu", o.seed, effective);
  context["capture"] = {{"file", o.capture}, {"model_id", meta.model_id}, {"source_dataset", meta.source_dataset},
                        {"git_sha", meta.git_sha}, {"n_tokens", cap.sample(o.sample).n_tokens}};
  run.write_result(context, rows, {{"complete", true}, {"files", {"embedding.csv", "tsne.svg"}}});
  std::cout << render_table(rows, {"layer", "kv_head", "kind", "n_points", "trustworthiness", "kl_divergence", "n_iter",
                                   "seconds"});
  fmt::print(stderr, "[tsne] wrote {}\n", run.path());
}

}  // namespace

void setup_tsne(CLI::App& app) {
  add_command<TsneCmdOptions>(app, "tsne", "t-SNE of a capture's keys and values with k-center centres (SubGen Fig. 1)",
                              run_tsne);
}

}  // namespace kvlab::cli
