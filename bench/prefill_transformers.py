#!/usr/bin/env python3
"""Prefill throughput of Hugging Face transformers (PyTorch eager, CPU) on the same GGUF and the
same prompt as `kvlab bench prefill`: ids[i] = 100 + (i * 7919) % (vocab - 100), logits of the
last position only (logits_to_keep=1), float32, median of --reps runs after one warm-up; with
--decode S, then S greedy one-token steps through the DynamicCache of the last prefill and their
median time per output token (as `kvlab bench prefill --decode S`).

Usage: /opt/kvlab-py/bin/python bench/prefill_transformers.py --tokens 512 --threads 2 [--json]
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", type=int, default=0, help="decode steps timed after the last prefill")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa (default) or eager")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    models = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))
    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(models, "smollm2-135m", "*.gguf")))), None)
    if not gguf:
        sys.exit("no GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")
    torch.set_num_threads(args.threads)

    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
        dtype=torch.float32, attn_implementation=args.attn)
    model.eval()
    vocab = model.config.vocab_size
    ids = torch.tensor([[100 + (i * 7919) % (vocab - 100) for i in range(args.tokens)]])  # [1, N]

    last = {}

    def once():
        with torch.inference_mode():
            out = model(ids, use_cache=True, logits_to_keep=1)
            out.logits.sum().item()
        last["out"] = out

    once()  # warm-up
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    steps = []
    out = last["out"]
    with torch.inference_mode():
        for _ in range(args.decode):
            t0 = time.perf_counter()
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
            out = model(nxt, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
            out.logits.sum().item()
            steps.append(time.perf_counter() - t0)
    tpot = statistics.median(steps) if steps else 0.0
    res = {"impl": "transformers", "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "attn_implementation": args.attn,
           "model": os.path.basename(gguf), "tokens": args.tokens,
           "threads": torch.get_num_threads(), "seconds": med, "tokens_per_s": args.tokens / med,
           "decode_steps": args.decode, "tpot_s": tpot,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"transformers prefill: model={res['model']} tokens={args.tokens} "
              f"threads={res['threads']} attn={args.attn}  {med:.3f} s  {res['tokens_per_s']:.1f} tokens/s")
        if args.decode:
            print(f"transformers decode: {args.decode} steps after {args.tokens} tokens  TPOT {tpot * 1e3:.2f} ms (median)")


if __name__ == "__main__":
    main()
