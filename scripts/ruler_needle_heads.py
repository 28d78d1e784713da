#!/usr/bin/env python3
"""Where a RULER needle's value is kept, per (layer, KV head), from a `kvlab ruler --kept-out` run.

  scripts/ruler_needle_heads.py RUN A B [--tokenizer tokenizer.json] [--prefix 24]

RUN holds data/<task>.jsonl, pred/<branch>/<task>.jsonl and kept/<task>/<id>.json (every branch's
kept positions per layer and KV head). For every niah sample with one answer, the value's tokens
are found in the input's tokens (PyPI `tokenizers` on the model's tokenizer.json; --prefix: the chat
template's tokens before the input, 24 for SmolLM2-135M-Instruct), and for branches A and B (e.g.
snapkv_ratio0.75 and adakv_ratio0.75) this prints, over the samples A answers and B does not
("failing") and over the rest: the mean number of heads keeping every token of the value, and the
heads where B keeps none of them while A keeps some, with how often that happens in each group.
Used for the second look in results/ruler_whole_extra/README.md (is the adaptive split's loss the
needle's tokens leaving particular heads?).
"""
import argparse
import collections
import glob
import json
import os

import tokenizers


def span_positions(tok, text, value, prefix, span):
    """Prompt positions of the tokens covering the value (span "value"), or the whole needle
    sentence holding it, from the "One of the special magic ..." opening to its final "." (span
    "sentence"), found by the tokenizer's character offsets; None if the value (or its sentence) is
    not in the text."""
    start = text.find(value)
    if start < 0:
        return None
    end = start + len(value)
    if span == "sentence":
        start, end = text.rfind("One of the special", 0, start), text.find(".", end) + 1
        if start < 0 or end == 0:
            return None
    enc = tok.encode(text, add_special_tokens=False)
    return {prefix + i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start and text[a:b].strip()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("a", help="the branch that answers, e.g. snapkv_ratio0.75")
    ap.add_argument("b", help="the branch compared, e.g. adakv_ratio0.75")
    ap.add_argument("--tokenizer", default=os.path.join(os.environ.get("KVLAB_SHARED", "../shared"),
                                                         "tokenizers/smollm2/tokenizer.json"))
    ap.add_argument("--prefix", type=int, default=24)
    ap.add_argument("--span", choices=["value", "sentence"], default="value",
                    help="the tokens counted: the value's, or the whole needle sentence's")
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    heads = {"failing": collections.Counter(), "rest": collections.Counter()}
    full = {"failing": [], "rest": []}
    for data in sorted(glob.glob(f"{args.run}/data/niah_*.jsonl")):
        task = os.path.basename(data)[:-len(".jsonl")]
        score = {br: {r["id"]: r["score"] for r in map(json.loads, open(f"{args.run}/pred/{br}/{task}.jsonl"))}
                 for br in (args.a, args.b)}
        for d in map(json.loads, open(data)):
            sid = str(d["index"])
            if len(d["outputs"]) != 1 or not os.path.exists(f"{args.run}/kept/{task}/{sid}.json"):
                continue
            value = d["outputs"][0]
            pos = span_positions(tok, d["input"], value, args.prefix, args.span)
            if pos is None:
                raise SystemExit(f"{task} sample {sid}: the value {value!r} (--span {args.span}) is not in its input")
            kept = {br["branch"]: [[len(pos & set(h["positions"])) for h in layer["kv_heads"]] for layer in br["layers"]]
                    for br in json.load(open(f"{args.run}/kept/{task}/{sid}.json"))["branches"]}
            group = "failing" if score[args.a][sid] > score[args.b][sid] else "rest"
            ka, kb = kept[args.a], kept[args.b]
            full[group].append((sum(x == len(pos) for row in ka for x in row), sum(x == len(pos) for row in kb for x in row)))
            for l, (ra, rb) in enumerate(zip(ka, kb)):
                for h, (xa, xb) in enumerate(zip(ra, rb)):
                    if xb == 0 and xa > 0:
                        heads[group][(l, h)] += 1
    n_fail, n_rest = len(full["failing"]), len(full["rest"])
    print(f"{n_fail} samples {args.a} answers and {args.b} does not; {n_rest} others")
    for g, v in full.items():
        if v:
            print(f"{g}: heads keeping every token of the {args.span}: {args.a} {sum(a for a, _ in v) / len(v):.1f}, "
                  f"{args.b} {sum(b for _, b in v) / len(v):.1f} (mean over {len(v)} samples)")
    print(f"heads where {args.b} keeps none of the {args.span} and {args.a} some (failing samples of {n_fail}, others of {n_rest}):")
    for (l, h), c in heads["failing"].most_common(8):
        print(f"  layer {l} KV head {h}: {c} failing, {heads['rest'][(l, h)]} others")


if __name__ == "__main__":
    main()
