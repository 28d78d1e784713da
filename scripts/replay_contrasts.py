#!/usr/bin/env python3
"""Paired contrasts of replay rel_err between methods of one run, per setting, with Holm's correction.

  scripts/replay_contrasts.py RESULT.json --pairs snapkv+fp8:snapkv,uniform+fp8:uniform [--settings bytes=0.125]

A unit is a (sample, layer, KV head) of the run (its rows averaged over seeds); each contrast is the
paired t interval of mean(rel_err(a) - rel_err(b)) over the units both methods have (python/kvlab/
stats.py, = scipy.stats.ttest_rel). Holm's correction is over every contrast printed. The units of
one prompt are its heads, not independent prompts: the intervals describe this capture.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import stats  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--pairs", required=True, help="a:b,... (a minus b)")
    ap.add_argument("--settings", default="", help="settings to compare (default: every setting of the run)")
    a = ap.parse_args()
    rows = json.load(open(a.result))["rows"]
    if not isinstance(rows, list):
        sys.exit(f"replay_contrasts: {a.result}: rows are in another file (rows_file); pass a run with inline rows")
    unit = defaultdict(list)  # (method, setting, sample, layer, head) -> rel_err over seeds
    for r in rows:
        unit[(r["method"], _setting(r), r["sample"], r["layer"], r["head"])].append(r["rel_err"])
    settings = a.settings.split(",") if a.settings else sorted({k[1] for k in unit})
    pairs = [p.split(":") for p in a.pairs.split(",")]
    out = []
    for s in settings:
        for x, y in pairs:
            ux = {k[2:]: sum(v) / len(v) for k, v in unit.items() if k[0] == x and k[1] == s}
            uy = {k[2:]: sum(v) / len(v) for k, v in unit.items() if k[0] == y and k[1] == s}
            common = sorted(set(ux) & set(uy))
            if not common:
                sys.exit(f"replay_contrasts: {x} and {y} share no unit at {s}")
            out.append((s, x, y, stats.paired_interval([ux[k] for k in common], [uy[k] for k in common])))
    adjusted = stats.holm([iv.p for *_, iv in out])
    print("| setting | contrast (a − b) | units | mean | 95% interval | Holm p |")
    print("|---|---|---|---|---|---|")
    for (s, x, y, iv), p in zip(out, adjusted):
        print(f"| {s} | {x} − {y} | {iv.n} | {iv.mean:+.4f} | [{iv.lo:+.4f}, {iv.hi:+.4f}] | {p:.2g} |")


def _setting(r):
    """The row's budget as kvlab's tables label it: ratio=0.2, budget=64, T=2, bytes=0.125."""
    for key in ("ratio", "budget", "T", "bytes"):
        if key in r:
            return f"{key}={r[key]}"
    return "full"


if __name__ == "__main__":
    main()
