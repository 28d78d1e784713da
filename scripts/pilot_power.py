#!/usr/bin/env python3
"""How many samples a grid needs, from a pilot: per pair of branches, the paired difference of the
task-averaged score, its interval, the smallest effect the pilot could detect, and the samples per
task a run needs to detect each margin (issue 48: choose n from a pilot so that the test can decide).

  scripts/pilot_power.py RUN [RUN ...] [--pairs a:b,...] [--margins 2,5,10] [--power 0.8] [--alpha 0.05]

RUN: results folders (docs/results.md) or kvlab task runs. One row per pair, length and kept fraction. Pairs name methods (the same kept fraction
on both sides; `exact` is the full cache); by default every method against exact at each kept
fraction. The score is the record's `score` x 100; a task-averaged difference weights every task
equally (python/kvlab/stats.py stratified_interval). Samples per task for a margin m: the smallest n
with mde_paired(sd, T n) <= m, where sd^2 is the mean over tasks of each task's variance of the
paired differences (the variance of the task-averaged difference with n per task is then
sd^2 / (T n)).
"""
import argparse
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results, stats  # noqa: E402


def load(runs):
    """{(method, kept): {(task, length, sample): score x 100}} (exact under kept None)."""
    out = defaultdict(dict)
    for run in runs:
        for r in results.load(run):
            if "score" in r:
                kept = None if r["method"] == "exact" else r.get("kept")
                out[(r["method"], kept)][(r["task"], r.get("length"), r["sample"])] = 100.0 * float(r["score"])
    return out


def differences(a, b):
    """{(task, length): [a - b over the samples both hold]}."""
    by_task = defaultdict(list)
    for key in sorted(set(a) & set(b)):
        by_task[key[:2]].append(a[key] - b[key])
    return by_task


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--pairs", default="", help="comma-separated A:B method pairs (default: each method:exact)")
    ap.add_argument("--margins", default="2,5,10", help="effects (points of score x 100) a run should detect")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    args = ap.parse_args()
    try:
        scores = load(args.runs)
    except results.ResultsError as e:
        sys.exit(f"pilot_power: {e}")
    margins = [float(m) for m in args.margins.split(",") if m]
    kepts = sorted({k for (_, k) in scores if k is not None}, reverse=True)
    methods = sorted({m for (m, _) in scores})
    if args.pairs:
        pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
        for p in pairs:
            if len(p) != 2 or any(m not in methods for m in p):
                sys.exit(f"pilot_power: --pairs {':'.join(p)}: expected A:B, two of {methods}")
    else:
        pairs = [(m, "exact") for m in methods if m != "exact"]
    print(f"Paired difference of the task-averaged score x 100, A - B; n per task for a two-sided test at "
          f"alpha {args.alpha:g} with power {args.power:g}\n")
    print("| A - B | length | kept | tasks | n per task | difference [95% CI] | smallest detectable now | "
          + " | ".join(f"n per task for {m:g}" for m in margins) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(margins))
    lengths = sorted({key[1] for v in scores.values() for key in v}, key=lambda x: (x is None, x or 0))
    for a, b, length, kept in ((a, b, length, kept) for a, b in pairs for length in lengths for kept in kepts):
        if True:
            ka = (a, None if a == "exact" else kept)
            kb = (b, None if b == "exact" else kept)
            if ka not in scores or kb not in scores:
                continue
            by_task = {t: d for t, d in differences(scores[ka], scores[kb]).items() if len(d) >= 2 and t[1] == length}
            if not by_task:
                continue
            ci = stats.stratified_interval(list(by_task.values()))
            T = len(by_task)
            n_now = min(len(d) for d in by_task.values())
            var = [stats.mean_se(d)[1] ** 2 * len(d) for d in by_task.values()]  # each task's variance
            sd = math.sqrt(sum(var) / T)
            mde_now = stats.mde_paired(sd, T * n_now, args.alpha, args.power) if sd > 0 else 0.0
            needs = []
            for m in margins:
                if sd == 0:
                    needs.append("any")
                    continue
                total = stats.n_for_margin(sd, m, args.alpha, args.power)
                needs.append(str(max(2, math.ceil(total / T))))
            print(f"| {a} - {b} | {length or ''} | {kept:g} | {T} | {n_now} | {ci.mean:+.1f} [{ci.lo:+.1f}, {ci.hi:+.1f}] | "
                  f"{mde_now:.1f} | " + " | ".join(needs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
