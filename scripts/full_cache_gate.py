#!/usr/bin/env python3
"""The full-cache gate: can the model do the task at all? A claim about a compression method is
tested only where the full cache (method `exact`) scores well above the floor.

  scripts/full_cache_gate.py RUN [RUN ...] [--floor 50] [--level 0.95]

RUN: a results folder (docs/results.md) or a kvlab task run folder (its shards too). For each
(benchmark, task, length) the full cache's mean score x 100 over its samples, with its t interval
(python/kvlab/stats.py), and the gate of docs/claims.md: **open** when the mean is at least --floor
(default 50, half the task's maximum; the ledger uses half the paper's own full-cache score where
the paper reports one: pass it as --floor), **closed** otherwise — a claim on that cell is
*untestable*. The interval says how sure the gate is. Exit 0 when every cell is open, 1 otherwise
(so a grid can refuse to start on a model that cannot do its tasks).
"""
import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results, stats  # noqa: E402


def gate(records, floor, level):
    """[(benchmark, task, length, n, mean, lo, hi, open)] of the full cache's score x 100."""
    cells = defaultdict(dict)
    for r in records:
        if r["method"] == "exact" and "score" in r:
            cells[(r["benchmark"], r["task"], r.get("length"))][r["sample"]] = 100.0 * float(r["score"])
    out = []
    for (bench, task, length), by_sample in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        xs = list(by_sample.values())
        ci = stats.diff_interval(xs, level)
        lo = ci.lo if ci.lo == ci.lo else ci.mean  # one sample, or all equal: the mean bounds itself
        out.append((bench, task, length, len(xs), ci.mean, lo, ci.hi if ci.hi == ci.hi else ci.mean,
                    ci.mean >= floor - 1e-9))  # a mean of exactly the floor, summed in floating point
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--floor", type=float, default=50.0, help="the mean full-cache score (x 100) a cell must reach")
    ap.add_argument("--level", type=float, default=0.95, help="the interval's confidence level")
    args = ap.parse_args()
    records = []
    for run in args.runs:
        try:
            records += results.load(run)
        except results.ResultsError as e:
            sys.exit(f"full_cache_gate: {e}")
    rows = gate(records, args.floor, args.level)
    if not rows:
        sys.exit("full_cache_gate: no records of the full cache (method exact) with a score in these runs")
    models = sorted({str(r.get("model")) for r in records if r["method"] == "exact"})
    print(f"Full-cache gate on {', '.join(models)}: open when the full cache's mean score x 100 is at least "
          f"{args.floor:g} ({100 * args.level:g}% t interval beside it)\n")
    print("| benchmark | task | length | n | full cache | interval | gate |")
    print("|---|---|---|---|---|---|---|")
    for bench, task, length, n, m, lo, hi, ok in rows:
        print(f"| {bench} | {task} | {length or ''} | {n} | {m:.1f} | [{lo:.1f}, {hi:.1f}] | {'open' if ok else 'closed'} |")
    n_open = sum(r[-1] for r in rows)
    print(f"\n{n_open} of {len(rows)} cells open")
    return 0 if n_open == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
