#!/usr/bin/env python3
"""Issue 13's speed table in one run: kvlab against transformers on the same GGUF, prompt, CPU and
thread count, each measurement alternating between the two so both see the same machine.

  prefill tokens/s at each --tokens length        (kvlab bench prefill / bench/prefill_transformers.py)
  decode time per output token after --decode-at   (both: --decode S greedy steps, median)
  exact attention GFLOP/s against a matmul          (kvlab bench attention, n = each --attention-n)

Both sides run with OMP_WAIT_POLICY=PASSIVE (kvlab sets it for itself; transformers gets it from
this script, so neither spins on the other's cores). Prints a Markdown table and, with --out,
writes every raw measurement as JSON.

Usage: /opt/kvlab-py/bin/python bench/speed_compare.py [--tokens 512,2048,8192] [--threads N]
         [--reps 3] [--decode-at 2048] [--decode 32] [--attention-n 4096,16384] [--out F.json]
Env:   KVLAB_BIN (default build/apps/kvlab), KVLAB_MODELS (where smollm2-135m/ lives)
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:  # a line of log before the JSON line
        return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3, help="timed prefills per side and length (median)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per measurement (median of rounds)")
    ap.add_argument("--decode-at", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--attention-n", default="4096,16384")
    ap.add_argument("--out", default=None)
    ap.add_argument("--unset-openblas-coretype", action="store_true",
                    help="run both sides without OPENBLAS_CORETYPE (a value such as Haswell pins OpenBLAS to AVX2 "
                         "kernels; transformers' MKL ignores it)")
    args = ap.parse_args()
    if args.out and os.path.exists(args.out):
        sys.exit(f"--out {args.out} exists; choose a new path")

    kvlab = os.environ.get("KVLAB_BIN", os.path.join(REPO, "build", "apps", "kvlab"))
    if not os.access(kvlab, os.X_OK):
        sys.exit(f"kvlab binary not found at {kvlab}; build it or set KVLAB_BIN")
    gguf = subprocess.run([os.path.join(REPO, "data_scripts", "get_smollm2.sh")], stdout=subprocess.PIPE,
                          text=True, check=True).stdout.strip()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    if args.unset_openblas_coretype:
        env.pop("OPENBLAS_CORETYPE", None)
    py = sys.executable
    t = args.threads

    def kv_prefill(n, decode):
        return run_json([kvlab, "--threads", str(t), "bench", "prefill", "--model", gguf, "--tokens", str(n),
                         "--reps", str(args.reps), "--decode", str(decode), "--json"], env)

    def tf_prefill(n, decode):
        return run_json([py, os.path.join(REPO, "bench", "prefill_transformers.py"), "--gguf", gguf,
                         "--tokens", str(n), "--threads", str(t), "--reps", str(args.reps),
                         "--decode", str(decode), "--json"], env)

    rows, raw = [], {"prefill": [], "decode": [], "attention": []}
    for n in [int(x) for x in args.tokens.split(",")]:
        decode = args.decode if n == args.decode_at else 0
        k_runs, t_runs = [], []
        for _ in range(args.rounds):  # alternate, so both sides see the same load
            k_runs.append(kv_prefill(n, decode))
            t_runs.append(tf_prefill(n, decode))
        k_tps = statistics.median(r["tokens_per_s"] for r in k_runs)
        t_tps = statistics.median(r["tokens_per_s"] for r in t_runs)
        raw["prefill"].append({"tokens": n, "kvlab": k_runs, "transformers": t_runs})
        rows.append((f"prefill {n} tokens (tokens/s)", k_tps, t_tps, k_tps / t_tps, "≥ 1.5"))  # issue 25
        print(f"prefill {n}: kvlab {k_tps:.1f} tokens/s, transformers {t_tps:.1f}, ratio {k_tps / t_tps:.2f}",
              file=sys.stderr)
        if decode:
            k_tpot = statistics.median(r["tpot_s"] for r in k_runs) * 1e3
            t_tpot = statistics.median(r["tpot_s"] for r in t_runs) * 1e3
            raw["decode"].append({"context": n, "steps": decode})
            rows.append((f"decode after {n} tokens (ms per token)", k_tpot, t_tpot, k_tpot / t_tpot, "≤ 0.5"))  # issue 25
            print(f"decode at {n}: kvlab {k_tpot:.2f} ms, transformers {t_tpot:.2f} ms, ratio {k_tpot / t_tpot:.2f}",
                  file=sys.stderr)
    for n in [int(x) for x in args.attention_n.split(",")]:
        a = run_json([kvlab, "--threads", str(t), "bench", "attention", "--tokens", str(n), "--queries", "256",
                      "--json"], env)
        raw["attention"].append(a)
        rows.append((f"exact attention n={n}, n_q=256 (GFLOP/s; reference: matmul)", a["exact_attention"]["gflops"],
                     a["matmul"]["gflops"], a["ratio_attention_to_matmul"], "≥ 0.5"))
        print(f"attention n={n}: {a['exact_attention']['gflops']:.1f} GFLOP/s, matmul {a['matmul']['gflops']:.1f}, "
              f"ratio {a['ratio_attention_to_matmul']:.3f} (reference path {a['ratio_reference_to_matmul']:.3f})",
              file=sys.stderr)

    version = subprocess.run([kvlab, "--version"], env=env, stdout=subprocess.PIPE, text=True).stdout
    tf = raw["prefill"][0]["transformers"][0]
    print(f"kvlab {version.splitlines()[1]}; transformers {tf['transformers_version']}, torch {tf['torch_version']} "
          f"({tf['attn_implementation']}); {t} threads; OMP_WAIT_POLICY=PASSIVE for both; "
          f"OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset)')}\n")
    print("| measurement | kvlab | transformers (or matmul) | ratio | goal |")
    print("|---|---|---|---|---|")
    for name, k, ref, ratio, goal in rows:
        print(f"| {name} | {k:.1f} | {ref:.1f} | {ratio:.2f} | {goal} |")
    if args.out:
        doc = {"date": datetime.datetime.utcnow().isoformat() + "Z", "threads": t, "kvlab_version": version,
               "openblas_coretype": env.get("OPENBLAS_CORETYPE"),
               "command": " ".join(sys.argv), "rows": [dict(zip(["measurement", "kvlab", "reference", "ratio", "goal"], r))
                                                     for r in rows], "raw": raw}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
