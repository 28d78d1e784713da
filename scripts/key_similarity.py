#!/usr/bin/env python3
"""Cosine similarity of key states against token distance (Chelsea Figs. 2-3, issue 48).

  scripts/key_similarity.py --windows ../shared/data/wikitext2/wiki.test.raw > captures/wikitext2_windows.jsonl
  build/apps/kvlab dump --model smollm2-135m --dataset captures/wikitext2_windows.jsonl --samples 10 --layers all \
      --queries last:1 --dtype float16 --chat-template none --out captures/smollm2_wikitext2_10x15k.h5
  scripts/key_similarity.py captures/smollm2_wikitext2_10x15k.h5 --out results/chelsea_key_similarity

--windows: the text's first 10 consecutive windows of 15,000 characters as {"text"} records (about
3.4-4.6k SmolLM2 tokens each, so none is cut: Chelsea's figures use 4k-token WikiText-2 sequences).

For every sample, layer and KV head of a kvlab capture (docs/capture-format.md: post-RoPE keys at
their original positions), the mean cosine similarity between the key at position i and the key
at i - d, over the anchors i = 256, 272, 288, ... (every 16th position from 256 on), for the
distances d = 1 ... 16 and 24, 32, ..., 256: Chelsea §4's measurement ("we randomly sample multiple
tokens within the sequence, define the local region as 256 tokens, and compute the average
similarity"), with a fixed grid of anchors instead of random ones.

Writes OUT/curve.csv.gz (sample, layer, kv_head, distance, cos_sim; long format, pandas reads it)
and OUT/run.json (the capture's model, source and sizes). Needs numpy and h5py (the reference
environment, data_scripts/requirements.txt).
"""
import argparse
import gzip
import json
import os

import h5py
import numpy as np

DISTANCES = list(range(1, 17)) + list(range(24, 257, 8))
ANCHOR_START, ANCHOR_STEP = 256, 16


def curve(k):
    """k [H, n, d] -> [H, len(DISTANCES)] mean cosine similarity of k[:, i] and k[:, i - dist]."""
    kn = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-12)   # [H, n, d]
    anchors = np.arange(ANCHOR_START, k.shape[1], ANCHOR_STEP)               # [A]
    out = np.empty((k.shape[0], len(DISTANCES)))
    for j, dist in enumerate(DISTANCES):
        out[:, j] = np.einsum("had,had->ha", kn[:, anchors], kn[:, anchors - dist]).mean(axis=1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture", nargs="?")
    ap.add_argument("--out")
    ap.add_argument("--windows", metavar="TEXT", help="print the dump's {text} records from this text file instead")
    a = ap.parse_args()
    if a.windows:
        with open(a.windows, encoding="utf-8") as f:
            text = f.read()
        for i in range(10):
            print(json.dumps({"text": text[i * 15000:(i + 1) * 15000]}))
        return
    if not (a.capture and a.out):
        ap.error("give CAPTURE and --out (or --windows TEXT)")
    lines = ["sample,layer,kv_head,distance,cos_sim\n"]
    with h5py.File(a.capture, "r") as f:
        attrs = {}
        for k, v in f.attrs.items():
            v = v.decode() if isinstance(v, bytes) else v
            attrs[k] = v.item() if hasattr(v, "size") and getattr(v, "size", 0) == 1 else v
        samples = sorted(g for g in f if g.startswith("sample_"))
        tokens = []
        for s_i, s in enumerate(samples):
            layers = sorted(g for g in f[s] if g.startswith("layer_"))
            n = f[s][layers[0]]["k"].shape[1]
            tokens.append(int(n))
            for layer in layers:
                c = curve(np.asarray(f[s][layer]["k"], dtype=np.float64))
                for h in range(c.shape[0]):
                    for j, dist in enumerate(DISTANCES):
                        lines.append(f"{s_i},{int(layer[6:])},{h},{dist},{c[h, j]:.6f}\n")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "curve.csv.gz"), "wb") as g:
        g.write(gzip.compress("".join(lines).encode(), mtime=0))
    run = {"made_by": "scripts/key_similarity.py", "capture": os.path.basename(a.capture),
           "capture_attrs": {k: attrs[k] for k in sorted(attrs) if isinstance(attrs[k], (str, int, float))},
           "tokens_per_sample": tokens, "distances": DISTANCES,
           "anchors": f"every {ANCHOR_STEP}th position from {ANCHOR_START}"}
    with open(os.path.join(a.out, "run.json"), "w") as g:
        json.dump(run, g, indent=1, sort_keys=True)
        g.write("\n")
    print(f"key_similarity: {len(samples)} samples, {len(lines) - 1} rows -> {a.out}")


if __name__ == "__main__":
    main()
