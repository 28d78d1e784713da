#!/usr/bin/env python3
"""Equal memory, counted whole, in `kvlab ruler` runs: the entries each branch starts decoding with.

  scripts/ruler_memory.py RUN [RUN ...] [--against snapkv] [--apart subgen]

RUN is a run folder (merged, or one shard; several are pooled, e.g. a step's shards and its _extra
step's). Reads RUN/pred/<method>_ratio<kept>/<task>_<length>.jsonl ("id", "entries_start": the
entries summed over layers and KV heads when decoding starts; "output"). Prints:
  1. per method, its entries_start over the --against method's on the same (task, id, ratio):
     lines, min, max, mean, and on how many lines they are exactly equal;
  2. per ratio, the largest relative spread (max - min) / max of entries_start over all methods
     but those in --apart (a method whose budget counts other things than entries, e.g. subgen's
     s numerator entries + m*t denominator keys: its bytes, not its entries, match), with the cell;
  3. whether the full cache's output is the same in every run holding a sample (runs over the very
     same samples, as a step and its _extra step are).
Exits 1 when a sample's full-cache outputs differ between runs, else 0 (the numbers are for the
README; what counts as equal enough is for the reader: kvlab's methods round budgets per head).
"""
import argparse
import sys
from collections import defaultdict

from ruler_table import prediction_lines  # noqa: E402  (scripts/ is on sys.path)


def load(runs):
    entries = defaultdict(dict)  # (dataset, id, kept) -> method -> entries_start
    exact = defaultdict(dict)    # (dataset, id) -> run -> output
    for run in runs:
        for _, branch, task, length, r in prediction_lines(run):
            dataset = f"{task}_{length}"
            method, kept = branch
            if method == "exact":
                exact[(dataset, r["sample"])][run] = r["output"]
            elif kept is not None:
                entries[(dataset, r["sample"], f"{kept:g}")][method] = r["entries_start"]
    return entries, exact


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--against", default="snapkv", help="the method the others are divided by")
    ap.add_argument("--apart", default="subgen", help="comma-separated methods left out of the spread")
    a = ap.parse_args()
    entries, exact = load(a.runs)  # prediction_lines refuses a folder without pred/
    apart = set(filter(None, a.apart.split(",")))

    ratios = defaultdict(list)  # method -> [its entries / against's]
    for cell, by_method in entries.items():
        base = by_method.get(a.against)
        if base:
            for m, e in by_method.items():
                if m != a.against:
                    ratios[m].append(e / base)
    print(f"entries_start over {a.against}'s on the same (task, id, ratio):\n")
    print("| method | lines | min | max | mean | exactly equal |\n|---|---|---|---|---|---|")
    for m in sorted(ratios):
        xs = ratios[m]
        print(f"| {m} | {len(xs)} | {min(xs):.4f} | {max(xs):.4f} | {sum(xs) / len(xs):.4f} | {sum(x == 1 for x in xs)} |")

    print(f"\nlargest relative spread of entries_start over the methods (all but {sorted(apart)}), per kept fraction:\n")
    worst = {}
    for (dataset, sid, kept), by_method in entries.items():
        vals = {m: e for m, e in by_method.items() if m not in apart}
        if len(vals) < 2:
            continue
        lo, hi = min(vals.values()), max(vals.values())
        spread = (hi - lo) / hi if hi else 0.0
        if kept not in worst or spread > worst[kept][0]:
            worst[kept] = (spread, dataset, sid, len(vals))
    for kept in sorted(worst, key=float, reverse=True):
        s, dataset, sid, n = worst[kept]
        cells = sum(1 for c in entries if c[2] == kept)
        print(f"- kept {kept}: {s:.2e} over {cells} (sample, ratio) cells (worst: {dataset} id {sid}, {n} methods)")

    shared = {k: v for k, v in exact.items() if len(v) > 1}
    differ = [k for k, v in shared.items() if len(set(v.values())) > 1]
    print(f"\nfull cache: {len(exact)} samples, {len(shared)} in more than one run, "
          f"output identical on {len(shared) - len(differ)} of them")
    for dataset, sid in differ[:10]:
        print(f"  differs: {dataset} id {sid}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
