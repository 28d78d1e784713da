// Every subcommand's setup function; main.cpp calls each once. One cmd_<name>.cpp per command.
#pragma once

namespace CLI {
class App;
}

namespace kvlab::cli {

void setup_inspect(CLI::App& app);   // cmd_inspect.cpp: summarise a capture file
void setup_synth(CLI::App& app);     // cmd_synth.cpp: write a synthetic capture
void setup_bench(CLI::App& app);     // cmd_bench.cpp: micro-benchmarks (attention, ...)
void setup_replay(CLI::App& app);    // cmd_replay.cpp: replay a capture through compressors
void setup_merge(CLI::App& app);     // cmd_merge.cpp: merge replay shards
void setup_generate(CLI::App& app);  // cmd_generate.cpp: greedy decoding with a model
void setup_dump(CLI::App& app);      // cmd_dump.cpp: capture q/k/v of a model prefill
void setup_bench_prefill(CLI::App& app);  // cmd_bench_prefill.cpp: kvlab bench prefill
void setup_bench_weights(CLI::App& app);  // cmd_bench_weights.cpp: kvlab bench weights
void setup_run(CLI::App& app);       // cmd_run.cpp: run an experiment file (ordered steps)
void setup_bench_compress(CLI::App& app);  // cmd_bench_compress.cpp: kvlab bench compress
void setup_calibrate(CLI::App& app);  // cmd_calibrate.cpp: kvlab calibrate chelsea
void setup_bench_generate(CLI::App& app);  // cmd_bench_generate.cpp: kvlab bench generate
void setup_longeval(CLI::App& app);  // cmd_longeval.cpp: LongEval line retrieval
void setup_niah(CLI::App& app);      // cmd_niah.cpp: needle in a haystack
void setup_ruler(CLI::App& app);     // cmd_ruler.cpp: RULER's synthetic tasks
void setup_longbench(CLI::App& app);  // cmd_longbench.cpp: LongBench and `longbench eval`
void setup_summarize(CLI::App& app);  // cmd_summarize.cpp: XSUM summarization (ROUGE)
void setup_ppl(CLI::App& app);       // cmd_ppl.cpp: perplexity and fidelity through streamed caches
void setup_tsne(CLI::App& app);      // cmd_tsne.cpp: t-SNE of keys and values (SubGen Fig. 1)
void setup_clusterability(CLI::App& app);  // cmd_clusterability.cpp: k-center radii, δ-clusters, query norms
void setup_sweep(CLI::App& app);     // cmd_sweep.cpp: a command over a grid of parameters (SLURM jobs)
void setup_buzz_steady(CLI::App& app);  // cmd_buzz_steady.cpp: BUZZ's steady-state sampled region per T/w

// The `kvlab bench` group; benchmark subcommands in other files attach to it.
CLI::App& bench_group(CLI::App& app);

// Runtime settings shared by every command (set in main.cpp from --threads).
int threads();

}  // namespace kvlab::cli
