#!/usr/bin/env python3
"""Markdown tables of a task run (longbench, longeval, niah, summarize) with standard errors.

  scripts/task_table.py RUN_DIR [--metric score|rougeL_vs_exact|rouge1|...] [--dataset NAME] [--by METRIC]
                        [--pairs a-b,c-d]

RUN_DIR: a results folder (docs/results.md) or a kvlab task run (result.json, pred/<branch>/<dataset>.jsonl),
read through python/kvlab/results.py. For each branch: the mean of each metric over the records with its standard error
(sample sd / sqrt(n)), live KV entries per (layer, KV head) right after compression, mean and
peak (these count each branch's own generated tokens), and "mem *" where the entries after
compression are more than 1% from the setting's median.
Then the branches sorted by --by (default rougeL_vs_exact), with the paired difference of --by
between each branch and the next (mean +- SE over the same records, and how many SEs it is), then the
pairs named by --pairs.
Used to write the results READMEs from committed runs.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402  (python/ of this repository)
from kvlab.stats import mean_se  # noqa: E402


def branch_order(config):
    """Sort key of records: the full cache first, then the run's methods and ratios in its config's order."""
    methods = [m for m in str(config.get("method", "")).split(",") if m]
    ratios = list(config.get("ratio") or [])

    def key(r):
        m = r["method"]
        kept = r.get("kept")
        return (m != "exact", methods.index(m) if m in methods else len(methods), m,
                ratios.index(kept) if kept in ratios else len(ratios), r.get("setting", ""))
    return key


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--metric", default="score,rougeL_vs_exact", help="comma-separated per-record metrics")
    ap.add_argument("--dataset", default=None, help="one dataset (default: every dataset of the run)")
    ap.add_argument("--by", default="rougeL_vs_exact", help="the metric the branches are sorted and paired by")
    ap.add_argument("--scale", default="score:100,rouge1:100,rouge2:100,rougeL:100",
                    help="metric:factor pairs applied to the means (score x 100 as the tables print it)")
    ap.add_argument("--pairs", default="",
                    help="extra paired differences of --by, e.g. clustergen-h2o,exact-h2o (method names: the "
                         "branch of each setting whose label starts with the name)")
    args = ap.parse_args()
    try:
        records = results.load(args.run)
        info = results.run_info(args.run)
    except results.ResultsError as e:
        sys.exit(f"task_table: {e}")
    ctx = info.get("context", {})
    proto = ctx.get("protocol", {})
    scale = dict((kv.split(":")[0], float(kv.split(":")[1])) for kv in args.scale.split(",") if kv)
    metrics = args.metric.split(",")
    datasets = [args.dataset] if args.dataset else sorted({results.dataset_label(r) for r in records})
    # The preset is recorded per record (each method's); the context has it only in older runs.
    presets = sorted({r["preset"] for r in records if r["method"] != "exact" and r.get("preset")})
    preset = ctx.get("preset") or (",".join(presets) if presets else "?")
    print(f"run `{args.run}`: preset {preset}, protocol {proto.get('protocol', '?')}, "
          f"decode rule {proto.get('decode_rule', '?')}; sha {str(ctx.get('git_sha', ctx.get('git', '?')))[:7]}\n")
    branch_key = branch_order(ctx.get("config", {}))
    for ds in datasets:
        per = {}  # label -> (branch facts, {sample: record})
        for r in sorted((r for r in records if results.dataset_label(r) == ds), key=branch_key):
            b = results.branch_label(r)
            facts, lines = per.setdefault(b, ({"setting": r.get("setting", "")}, {}))
            lines[r["sample"]] = r
        for b, (facts, lines) in per.items():  # a branch's means over its records, as kvlab's rows state them
            for k in ("entries_mean", "entries_peak"):
                xs = [float(x[k]) for x in lines.values() if k in x]
                facts[k] = sum(xs) / len(xs) if xs else float("nan")
        ids = sorted(set.intersection(*[set(l.keys()) for _, l in per.values()]))
        print(f"dataset {ds}: {len(ids)} records\n")
        # mem *: entries right after compression (the budget) more than 1% from the setting's median,
        # computed from the lines (runs before the mark used entries_start marked on the peak).
        start = {b: sum(float(l[i].get("entries_start", float("nan"))) for i in ids) / max(len(ids), 1)
                 for b, (_, l) in per.items()}
        med = {}
        for b, (r, _) in per.items():
            if b != "exact":
                med.setdefault(r.get("setting", ""), []).append(start[b])
        def mark(b):
            if b == "exact":
                return ""
            v = sorted(med[per[b][0].get("setting", "")])
            m = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
            return "*" if abs(start[b] - m) > 0.01 * m else ""
        head = ["branch"] + [f"{m} (± SE)" for m in metrics] + ["entries after compression", "entries mean",
                                                                "entries peak", "mem"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for b, (r, lines) in per.items():
            cells = [b]
            for m in metrics:
                xs = [float(lines[i][m]) * scale.get(m, 1.0) for i in ids]
                mu, se = mean_se(xs)
                cells.append(f"{mu:.3f} ± {se:.3f}" if not math.isnan(se) else f"{mu:.3f}")
            cells.append(f"{start[b]:.1f}")
            cells.append(f"{r.get('entries_mean', float('nan')):.1f}")
            cells.append(f"{r.get('entries_peak', float('nan')):.1f}")
            cells.append(mark(b))
            print("| " + " | ".join(cells) + " |")
        print(f"\npaired differences of {args.by} (x{scale.get(args.by, 1.0):g}) within each setting, each branch "
              f"minus the next:\n")
        print("| branch | next | difference ± SE | SEs |")
        print("|---|---|---|---|")
        settings = sorted({per[b][0].get("setting", "") for b in per if b != "exact"})
        pairs = []
        for st in settings:
            order = sorted((b for b in per if b != "exact" and per[b][0].get("setting", "") == st),
                           key=lambda b: -sum(float(per[b][1][i][args.by]) for i in ids))
            pairs += list(zip(order, order[1:]))
        extra = [p.split("-", 1) for p in args.pairs.split(",") if p]
        for st in settings:
            def branch(name):
                found = [b for b in per if b == name or (b.startswith(name + "_") and per[b][0].get("setting", "") == st)]
                if not found:
                    sys.exit(f"--pairs: no branch '{name}' in setting '{st}' of dataset {ds}")
                return found[0]
            pairs += [(branch(a), branch(b)) for a, b in extra]
        for a, b in pairs:
            d = [(float(per[a][1][i][args.by]) - float(per[b][1][i][args.by])) * scale.get(args.by, 1.0) for i in ids]
            mu, se = mean_se(d)
            z = mu / se if se and not math.isnan(se) and se > 0 else float("inf") if mu else 0.0
            print(f"| {a} | {b} | {mu:+.3f} ± {se:.3f} | {z:.1f} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
