#!/usr/bin/env python3
"""Paired contrasts of a metric between methods of one run, per setting, with Holm's correction.

  scripts/contrasts.py RESULT.json --pairs snapkv+fp8:snapkv,uniform+fp8:uniform [--settings bytes=0.125]
  scripts/contrasts.py RESULT.json --metric nll --unit segment --pairs h2o:buzz,streaming_llm:buzz

A unit is what the rows are paired on (replay, the default: a (sample, layer, KV head), its rows
averaged over seeds; ppl --segments: a segment); each contrast is the paired t interval of
mean(metric(a) - metric(b)) over the units both methods have (python/kvlab/stats.py, =
scipy.stats.ttest_rel), with the smallest difference the test detects with 80% power (stats.
mde_paired at the differences' sd). Holm's correction is over every contrast printed. The units of
one prompt (its heads) are not independent prompts: such intervals describe that capture.
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
    ap.add_argument("--metric", default="rel_err", help="the row field compared (default rel_err; ppl: nll)")
    ap.add_argument("--unit", default="sample,layer,head", help="the row fields a unit is keyed on "
                    "(default sample,layer,head; ppl: segment)")
    a = ap.parse_args()
    rows = json.load(open(a.result))["rows"]
    if not isinstance(rows, list):
        sys.exit(f"contrasts: {a.result}: rows are in another file (rows_file); pass a run with inline rows")
    keys = a.unit.split(",")
    unit = defaultdict(list)  # (method, setting, *unit) -> the metric over seeds
    for r in rows:
        missing = [k for k in keys + [a.metric] if k not in r]
        if missing:
            sys.exit(f"contrasts: {a.result}: a {r.get('method')} row has no {', '.join(missing)} (--unit / --metric)")
        unit[(r["method"], _setting(r)) + tuple(r[k] for k in keys)].append(r[a.metric])
    settings = a.settings.split(",") if a.settings else sorted({k[1] for k in unit if k[1] != "full"})
    pairs = [p.split(":") for p in a.pairs.split(",")]
    out = []
    for s in settings:
        for x, y in pairs:
            ux = {k[2:]: sum(v) / len(v) for k, v in unit.items() if k[0] == x and k[1] == s}
            uy = {k[2:]: sum(v) / len(v) for k, v in unit.items() if k[0] == y and k[1] == s}
            common = sorted(set(ux) & set(uy))
            if not common:
                sys.exit(f"contrasts: {x} and {y} share no unit at {s}")
            out.append((s, x, y, stats.paired_interval([ux[k] for k in common], [uy[k] for k in common])))
    adjusted = stats.holm([iv.p for *_, iv in out])
    print(f"| setting | contrast of {a.metric} (a − b) | units | mean | 95% interval | smallest detectable | Holm p |")
    print("|---|---|---|---|---|---|---|")
    for (s, x, y, iv), p in zip(out, adjusted):
        mde = stats.mde_paired(iv.se * iv.n ** 0.5, iv.n) if iv.n >= 2 else float("nan")
        print(f"| {s} | {x} − {y} | {iv.n} | {iv.mean:+.4f} | [{iv.lo:+.4f}, {iv.hi:+.4f}] | {mde:.4f} | {p:.2g} |")


def _setting(r):
    """The row's budget as kvlab's tables label it: ratio=0.2, budget=64, T=2, bytes=0.125,
    cache_size=50 (ppl); "full" for ppl's full-cache row."""
    if r.get("method") == "full":
        return "full"
    for key in ("ratio", "budget", "T", "bytes", "cache_size"):
        if key in r:
            return f"{key}={r[key]}"
    return "full"


if __name__ == "__main__":
    main()
