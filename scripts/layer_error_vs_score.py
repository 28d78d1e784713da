#!/usr/bin/env python3
"""Does single-layer attention error predict the end-task score? (issue 48, what only kvlab can answer)

  scripts/layer_error_vs_score.py RUN [RUN ...] [--tasks a,b] [--boot 2000] [--out rows.csv]

RUN: a results folder or task run folders whose prediction lines carry `layer_rel_err` (a task
command run with `--layer-error --protocol context`: each branch's single-layer error on the
question's own queries, generate/branches.h QuestionProbe). Their records are pooled.

Prints, per (benchmark, length):
  1. per branch (method, kept): records, mean layer_rel_err, mean score x 100 and the full cache's on
     the same records;
  2. across branches: Spearman's rho between a branch's mean error and its mean score (stats.spearman,
     ties at average ranks), with a 95% percentile bootstrap interval over records (records resampled
     with replacement within each task, every branch's means recomputed on the resample; seed 0);
     then the same at each kept fraction across the methods (does the error rank the methods as
     their scores do, at equal memory?);
  3. within each branch: rho between a record's error and its score loss against the full cache
     (exact's score - the branch's), over that branch's records, and the mean over tasks of each
     task's rho (the pooled one also carries differences between tasks), with the same bootstrap.
A negative rho in 2 (more error, lower score) is the prediction; rho is printed with its interval and
nothing more is read from it. --out writes the numbers as long-format rows (one per statistic).
"""
import argparse
import csv
import os
import random
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402
from kvlab import stats  # noqa: E402


def boot_interval(units, statistic, n_boot, seed=0):
    """Percentile interval of statistic(resampled units): units {stratum: [unit, ...]} resampled with
    replacement within each stratum; resamples where the statistic is nan (a constant side) are
    dropped and counted."""
    rng = random.Random(seed)
    vals = []
    for _ in range(n_boot):
        v = statistic({s: rng.choices(us, k=len(us)) for s, us in units.items()})
        if v == v:
            vals.append(v)
    vals.sort()
    if len(vals) < 2:
        return float("nan"), float("nan"), n_boot - len(vals)
    return stats.percentile(vals, 0.025), stats.percentile(vals, 0.975), n_boot - len(vals)


def branch_name(r):
    return "exact" if r["method"] == "exact" else f"{r['method']} kept {r['kept']:g}"


def analyse(recs, n_boot, label, out_rows):
    by = defaultdict(dict)  # branch -> (task, sample) -> record
    for r in recs:
        by[branch_name(r)][(r["task"], r["sample"])] = r
    if "exact" not in by:
        sys.exit(f"layer_error_vs_score: {label}: no full-cache (exact) records to measure score loss against")
    exact = by.pop("exact")
    branches = sorted(by)
    missing = [b for b in branches if any("layer_rel_err" not in r for r in by[b].values())]
    if missing:
        sys.exit(f"layer_error_vs_score: {label}: records of {', '.join(missing)} carry no layer_rel_err "
                 "(run the task command with --layer-error --protocol context)")
    # the records every branch and the full cache have, by task (the bootstrap's strata)
    common = set(exact)
    for b in branches:
        common &= set(by[b])
    units = defaultdict(list)
    for key in sorted(common):
        units[key[0]].append(key)
    n = len(common)
    print(f"## {label}: {len(branches)} branches, {n} records in every branch ({len(units)} tasks)\n")
    print("| branch | n | layer_rel_err | score | full cache | loss |")
    print("|---|---|---|---|---|---|")
    for b in branches:
        e = stats.mean_se([by[b][k]["layer_rel_err"] for k in common])[0]
        s = stats.mean_se([100 * by[b][k]["score"] for k in common])[0]
        f = stats.mean_se([100 * exact[k]["score"] for k in common])[0]
        print(f"| {b} | {n} | {e:.4f} | {s:.1f} | {f:.1f} | {f - s:+.1f} |")
        out_rows += [(label, b, "n", n), (label, b, "mean_layer_rel_err", e), (label, b, "mean_score", s),
                     (label, b, "full_cache_score", f)]

    def rho_of_means(bs):
        """rho between the branches' mean error and mean score on a (resampled) set of records."""
        def statistic(sample):
            keys = [k for ks in sample.values() for k in ks]
            return stats.spearman([sum(by[b][k]["layer_rel_err"] for k in keys) / len(keys) for b in bs],
                                  [sum(by[b][k]["score"] for k in keys) / len(keys) for b in bs])
        return statistic
    across = rho_of_means(branches)
    rho = across(units)
    lo, hi, dropped = boot_interval(units, across, n_boot)
    print(f"\nAcross branches: Spearman rho(mean layer_rel_err, mean score) = {rho:+.3f} [{lo:+.3f}, {hi:+.3f}] "
          f"(95% bootstrap over records, {n_boot} resamples{f', {dropped} constant' if dropped else ''}; "
          f"{len(branches)} branches)\n")
    out_rows += [(label, "across branches", "spearman_rho", rho), (label, "across branches", "rho_lo", lo),
                 (label, "across branches", "rho_hi", hi)]
    # at one kept fraction: do the methods' errors rank them as their scores do?
    by_kept = defaultdict(list)
    for b in branches:
        by_kept[next(iter(by[b].values()))["kept"]].append(b)
    print("| kept | methods | rho(mean layer_rel_err, mean score) across the methods | 95% bootstrap |")
    print("|---|---|---|---|")
    for kept, bs in sorted(by_kept.items(), reverse=True):
        if len(bs) < 3:
            continue
        at_kept = rho_of_means(bs)
        rho_k = at_kept(units)
        lo_k, hi_k, _ = boot_interval(units, at_kept, n_boot)
        print(f"| {kept:g} | {len(bs)} | {rho_k:+.3f} | [{lo_k:+.3f}, {hi_k:+.3f}] |")
        out_rows += [(label, f"kept {kept:g}", "spearman_rho", rho_k), (label, f"kept {kept:g}", "rho_lo", lo_k),
                     (label, f"kept {kept:g}", "rho_hi", hi_k)]
    print()
    print("| branch | rho(layer_rel_err, score loss) within the branch | 95% bootstrap | within each task (mean) | 95% bootstrap |")
    print("|---|---|---|---|---|")
    for b in branches:
        def pairs(keys, b=b):
            return ([by[b][k]["layer_rel_err"] for k in keys], [exact[k]["score"] - by[b][k]["score"] for k in keys])

        def within(sample):
            return stats.spearman(*pairs([k for ks in sample.values() for k in ks]))

        def within_tasks(sample):
            # the mean over tasks of each task's rho (tasks where neither side is constant): the
            # pooled rho also carries differences between tasks, in error level and in difficulty
            rhos = [r for ks in sample.values() if (r := stats.spearman(*pairs(ks))) == r]
            return sum(rhos) / len(rhos) if rhos else float("nan")
        rho_b, rho_t = within(units), within_tasks(units)
        lo_b, hi_b, _ = boot_interval(units, within, n_boot)
        lo_t, hi_t, _ = boot_interval(units, within_tasks, n_boot)
        print(f"| {b} | {rho_b:+.3f} | [{lo_b:+.3f}, {hi_b:+.3f}] | {rho_t:+.3f} | [{lo_t:+.3f}, {hi_t:+.3f}] |")
        out_rows += [(label, b, "within_rho", rho_b), (label, b, "within_rho_lo", lo_b),
                     (label, b, "within_rho_hi", hi_b), (label, b, "within_task_rho", rho_t),
                     (label, b, "within_task_rho_lo", lo_t), (label, b, "within_task_rho_hi", hi_t)]
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--tasks", default="", help="only these tasks (comma-separated), e.g. where the full cache passes the gate")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--out", default="", help="write the numbers as long-format rows (CSV) here")
    a = ap.parse_args()
    try:
        recs = [r for run in a.runs for r in results.load(run)]
    except results.ResultsError as e:
        sys.exit(f"layer_error_vs_score: {e}")
    if a.tasks:
        wanted = set(a.tasks.split(","))
        unknown = wanted - {r["task"] for r in recs}
        if unknown:
            sys.exit(f"layer_error_vs_score: --tasks {','.join(sorted(unknown))}: not in the runs "
                     f"(they hold {', '.join(sorted({r['task'] for r in recs}))})")
        recs = [r for r in recs if r["task"] in wanted]
    groups = defaultdict(list)
    for r in recs:
        groups[(r["benchmark"], r.get("length"))].append(r)
    out_rows = []
    for (bench, length), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        analyse(rs, a.boot, f"{bench}{f' {length}' if length else ''}", out_rows)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(("group", "branch", "statistic", "value"))
            w.writerows(out_rows)


if __name__ == "__main__":
    main()
