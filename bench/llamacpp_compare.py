#!/usr/bin/env python3
"""llama.cpp beside kvlab on the same GGUF, prompt and threads (issue 51): prefill tokens/s and decode
ms per token, kvlab with its weights in fp32 and as stored (--weights stored), llama.cpp through
llama-cpp-python (built from its source distribution: it compiles llama.cpp for this CPU).

The prompt is kvlab bench prefill's (and bench/prefill_transformers.py's): ids[i] = 100 + (i * 7919)
% (vocab - 100). llama.cpp evaluates it in one batch (n_batch = n_ubatch = the prompt's length) and
then decodes --decode tokens one at a time (the prompt's ids fed again: the time does not depend on
which token it is; kvlab feeds its greedy choices). Median of --reps
prefills after one warm-up, median decode step. Each engine runs in its own process, one after the
other, with OMP_WAIT_POLICY=PASSIVE.

Setup (once; ~10 minutes on 2 cores, pinned):
  python3 -m venv /opt/llamacpp-py
  /opt/llamacpp-py/bin/pip install llama-cpp-python==0.3.36 numpy
Usage:
  /opt/llamacpp-py/bin/python bench/llamacpp_compare.py --model smollm2-135m --tokens 512 --decode 32 --threads 2
  ... --llamacpp-only --json     (the llama.cpp side alone, one JSON line: what the script runs itself)
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gguf_path(model):
    if model.endswith(".gguf"):
        return model
    models = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))
    found = sorted(glob.glob(os.path.join(models, model, "*.gguf")))
    if not found:
        sys.exit(f"--model {model}: no .gguf under {os.path.join(models, model)} (data_scripts/get_*.sh)")
    return found[0]


def llamacpp(gguf, tokens, decode, threads, reps):
    from llama_cpp import Llama, __version__

    llm = Llama(model_path=gguf, n_ctx=tokens + decode + 8, n_batch=tokens, n_ubatch=tokens, n_threads=threads,
                n_threads_batch=threads, logits_all=False, verbose=False)
    vocab = llm.n_vocab()
    ids = [100 + (i * 7919) % (vocab - 100) for i in range(tokens)]
    times = []
    for r in range(reps + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        if r > 0:
            times.append(time.perf_counter() - t0)
    steps = []
    for s in range(decode):  # the prompt's ids again as the decoded tokens: the time does not depend on them
        t0 = time.perf_counter()
        llm.eval([ids[s % tokens]])
        steps.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"impl": "llama.cpp", "version": __version__, "tokens": tokens, "threads": threads, "seconds": med,
            "tokens_per_s": tokens / med, "decode_steps": decode, "tpot_s": statistics.median(steps) if steps else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a .gguf file or a name under models/")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--kvlab", default=os.environ.get("KVLAB_BIN", os.path.join(REPO, "build", "apps", "kvlab")))
    ap.add_argument("--llamacpp-only", action="store_true", help="run llama.cpp alone and print its JSON line")
    ap.add_argument("--json", action="store_true", help="one JSON line per engine")
    args = ap.parse_args()
    gguf = gguf_path(args.model)
    if args.llamacpp_only:
        print(json.dumps(llamacpp(gguf, args.tokens, args.decode, args.threads, args.reps)))
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    rows = []
    for weights in ("fp32", "stored"):
        out = subprocess.run([args.kvlab, "--threads", str(args.threads), "bench", "prefill", "--model", gguf,
                              "--tokens", str(args.tokens), "--reps", str(args.reps), "--decode", str(args.decode),
                              "--weights", weights, "--json"], env=env, capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["impl"] = f"kvlab --weights {weights}"
        rows.append(row)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", gguf, "--tokens", str(args.tokens),
                          "--decode", str(args.decode), "--threads", str(args.threads), "--reps", str(args.reps),
                          "--llamacpp-only"], env=env, capture_output=True, text=True, check=True)
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"{os.path.basename(gguf)}, {args.tokens}-token prompt, {args.decode} decode steps, {args.threads} threads")
    ref = rows[-1]
    for r in rows:
        print(f"  {r['impl']:<22} prefill {r['tokens_per_s']:8.1f} tokens/s ({r['tokens_per_s'] / ref['tokens_per_s']:.2f}x "
              f"llama.cpp)   decode {1e3 * r['tpot_s']:7.2f} ms/token ({r['tpot_s'] / ref['tpot_s']:.2f}x llama.cpp)")


if __name__ == "__main__":
    main()
