#!/usr/bin/env python3
"""RULER in kvpress's leaderboard layout, from a `kvlab ruler` run: methods x compression ratios.

  scripts/ruler_table.py RUN [RUN ...] [--floor 20] [--top 3] [--compare A:B[,C:D ...]]

RUN is a run folder (a merged run, or the shards of one: their records are pooled; every folder
must come from the same config apart from --shard, or from steps over the same samples with
different methods, e.g. a step of configs/paper/ruler.json and its _extra step: a sample both runs
hold, the full cache's, must score the same in both). RUN@LABEL renames the run's methods
M -> M@LABEL (not exact), so a run of a method with other settings pools with the run of its
default ones (step 11 of ruler.json with step 3: RUN@no_outliers gives chelsea@no_outliers). Reads RUN/pred/<branch>/<task>_<length>.jsonl
(one line per sample: "score" in 0..1, "rougeL_vs_exact") and RUN/result.json (the protocol).
Prints, per length, markdown tables:
  1. the leaderboard's layout: one row per method, one column per compression ratio (kvpress's
     notation: the fraction removed, 1 - the kept fraction kvlab's branch names carry), the cell
     the average over tasks of string_match_all x 100 +- its standard error, the full cache first;
  2. the same layout for fidelity: ROUGE-L F1 of each output against the full cache's;
  3. the full cache per task, marking the tasks where it is near the floor (< --floor);
  4. per ratio, the --top methods closest to the full cache by fidelity, with the paired
     difference of the task average to the full cache (mean +- SE over the same samples);
  5. with --compare A:B, per ratio, the paired difference A − B of the task average of the score
     (e.g. chelsea:snapkv for a paper's claim), and how many SEs it is; with --ci instead its 95%
     interval and its p adjusted by Holm over the table's cells (python/kvlab/stats.py).
Standard errors: each task's sample variance over its samples (sd / sqrt(n)); the average over T
tasks has SE sqrt(sum_t var_t / n_t) / T, and a paired difference the same over per-sample
differences. A merged run's result.json also holds kvlab's own table of per-task scores
("ruler"); every mean printed here is checked against it.
"""
import argparse
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402  (python/ of this repository)
from kvlab import stats  # noqa: E402
from kvlab.stats import mean_se  # noqa: E402

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"]
EXACT = ("exact", None)  # the full cache's branch; every branch is a (method, kept fraction) tuple


def branch_text(branch):
    method, kept = branch
    return method if kept is None else f"{method} at kept {kept:g}"


def prediction_lines(run, method=None):
    """(source, branch, task, length, record) for every RULER record of a results folder or a
    legacy run folder (python/kvlab/results.py), of one method or all; records of other tasks (e.g.
    kvpress's) are skipped. The branch is (method, kept) from the record's fields."""
    try:
        records = results.load(run)
    except results.ResultsError as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")
    for r in records:
        if r["task"] not in TASKS or (method is not None and r["method"] != method):
            continue
        kept = None if r["method"] == "exact" else r.get("kept")
        yield f"{run} ({r['method']} {r.get('setting', '')} {r['task']} {r['length']})", (r["method"], kept), \
            r["task"], int(r["length"]), r


def load(runs):
    """records[(branch, task, length)][sample] = (score x 100, rougeL_vs_exact), pooled over the folders."""
    records = defaultdict(dict)
    protocol = None
    infos = []
    for spec in runs:
        run, label = split_label(spec)
        lines = list(prediction_lines(run))  # first: a merged run without pred/ is named as such
        info = results.run_info(run)
        infos.append((run, label, info))
        protocols = {r["protocol"] for *_, r in lines}
        if len(protocols) > 1:
            sys.exit(f"ruler_table: {run} holds protocols {sorted(protocols)}: one protocol per table")
        this = protocols.pop() if protocols else None
        if protocol not in (None, this):
            sys.exit(f"ruler_table: {run} is protocol {this}, the others {protocol}")
        protocol = this
        for path, branch, task, length, r in lines:
            key, value = (relabel(branch, label), task, length), (100.0 * r["score"], r["rougeL_vs_exact"])
            # runs pooled over the same samples (a step and its _extra step) share exact
            if records[key].get(r["sample"], value) != value:
                sys.exit(f"ruler_table: {path}: sample {r['sample']} scores {value}, another run "
                         f"{records[key][r['sample']]}: only runs over the same samples, whose shared branches have the same "
                         f"settings, can be pooled")
            records[key][r["sample"]] = value
    # A whole run's own table covers all its samples; a shard's covers only its own, so shards
    # pooled with their siblings are not checked one by one.
    for run, label, info in infos:
        if len(runs) == 1 or "merged_from" in info.get("context", {}):
            check_against_result(info, records, run, label)
    return records, protocol


def split_label(spec):
    """"DIR@LABEL" -> (DIR, LABEL); a plain folder -> (DIR, None)."""
    run, at, label = spec.rpartition("@")
    if not at or os.path.isdir(spec):
        return spec, None
    if not label or not os.path.isdir(run):
        sys.exit(f"ruler_table: {spec}: expected a run folder or RUN@LABEL with RUN a folder")
    if any(c in label for c in ":,/ "):
        sys.exit(f"ruler_table: {spec}: a label may not hold ':', ',', '/' or spaces (--compare names it)")
    return run, label


def relabel(branch, label):
    """(snapkv, 0.5) -> (snapkv@LABEL, 0.5) (exact, the shared reference, keeps its name)."""
    if label is None or branch == EXACT:
        return branch
    return (f"{branch[0]}@{label}", branch[1])


def check_against_result(result, records, run, label=None):
    """kvlab's own per-task means (result.json "ruler", merged runs only) must equal ours."""
    if "ruler" not in result:
        return
    for row in result["ruler"]:
        for task in TASKS:
            if task in row:
                if "method" not in row:
                    sys.exit(f"ruler_table: {run}: its summary table names a branch no row describes: {row}")
                branch = EXACT if row["method"] == "exact" else (row["method"], row["kept"])
                got = records.get((relabel(branch, label), task, row["length"]))
                ours = sum(s for s, _ in got.values()) / len(got) if got else float("nan")
                if not math.isclose(ours, row[task], abs_tol=1e-9):
                    sys.exit(f"ruler_table: {run}: {branch_text(branch)} {task}_{row['length']}: "
                             f"the records give {ours}, the run's own table {row[task]}")


def task_average(per_task):
    """per_task: {task: [values]} -> (average over tasks, its SE: sqrt(sum of the tasks' SE^2) / T)."""
    stats = [mean_se(xs) for xs in per_task.values() if xs]
    T = len(stats)
    if T == 0:
        return float("nan"), float("nan")
    return sum(m for m, _ in stats) / T, math.sqrt(sum(se * se for _, se in stats)) / T


def values(records, branch, length, which, tasks):
    return {t: [v[which] for v in records[(branch, t, length)].values()] for t in tasks}


def paired(records, a, b, length, tasks):
    """Per-sample differences of the score, a - b, over the samples both have."""
    out = {}
    for t in tasks:
        ra, rb = records[(a, t, length)], records[(b, t, length)]
        out[t] = [ra[i][0] - rb[i][0] for i in ra if i in rb]
    return out


def fmt(avg, se, digits=1):
    return f"{avg:.{digits}f} ± {se:.{digits}f}"


def in_se(d, se):
    """How many SEs d is ("—" when both are 0: identical samples)."""
    if se != se:
        return "SE n/a"  # one sample per task
    if se > 0:
        return f"{d / se:.1f} SE"
    return "—" if d == 0 else "inf SE"


def compression_label(kept):
    return f"{100 * (1 - kept):g}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--floor", type=float, default=20.0, help="a task where the full cache scores below this is near the floor")
    ap.add_argument("--top", type=int, default=3, help="methods listed as closest to the full cache, per ratio")
    ap.add_argument("--compare", default="", help="comma-separated method pairs A:B: paired A − B per ratio")
    ap.add_argument("--ci", action="store_true",
                    help="--compare as 95%% intervals with Holm-adjusted p (docs/claims.md's statistics), not ± SE")
    args = ap.parse_args()
    records, protocol = load(args.runs)
    lengths = sorted({l for (_, _, l) in records})
    known = ["exact"] + sorted({b[0] for (b, _, _) in records} - {"exact"})
    pairs = [p.split(":") for p in args.compare.split(",") if p]
    for pair in pairs:
        if len(pair) != 2 or any(m not in known for m in pair):
            sys.exit(f"ruler_table: --compare {':'.join(pair)}: expected A:B, two of {known}")
    for length in lengths:
        branches = sorted({b for (b, _, l) in records if l == length})
        if EXACT not in branches:
            sys.exit(f"ruler_table: no exact branch at {length}: fidelity and the full cache's row need it")
        # only tasks every branch has (shards in progress may have more tasks for some branches)
        tasks = [t for t in TASKS if all(records.get((b, t, length)) for b in branches)]
        counts = sorted({len(records[(b, t, length)]) for b in branches for t in tasks})
        kepts = sorted({b[1] for b in branches if b[1] is not None}, reverse=True)
        methods = sorted({b[0] for b in branches if b != EXACT})
        score = {b: task_average(values(records, b, length, 0, tasks)) for b in branches}
        fid = {b: task_average(values(records, b, length, 1, tasks)) for b in branches}
        cols = [compression_label(k) for k in kepts]
        print(f"### {length} tokens, --protocol {protocol}: {len(tasks)} tasks, "
              f"{'/'.join(map(str, counts))} samples per task\n")
        print("Average over tasks of string_match_all x 100 (± SE); columns: compression ratio "
              "(kept " + " / ".join(f"{k:g}" for k in kepts) + " of the whole cache)\n")
        print("| method | " + " | ".join(cols) + " | mean |")
        print("|---|" + "---|" * (len(cols) + 1))
        print(f"| exact (full cache) | " + " | ".join(fmt(*score[EXACT]) for _ in cols) + f" | {score[EXACT][0]:.1f} |")

        def row_mean(table, m):
            xs = [table[(m, k)][0] for k in kepts if (m, k) in table]
            return sum(xs) / len(xs)

        for m in sorted(methods, key=lambda m: -row_mean(score, m)):
            cells = [fmt(*score[(m, k)]) if (m, k) in score else "" for k in kepts]
            print(f"| {m} | " + " | ".join(cells) + f" | {row_mean(score, m):.1f} |")
        print("\nFidelity: ROUGE-L F1 of the output against the full cache's, average over tasks (± SE)\n")
        print("| method | " + " | ".join(cols) + " | mean |")
        print("|---|" + "---|" * (len(cols) + 1))
        for m in sorted(methods, key=lambda m: -row_mean(fid, m)):
            cells = [fmt(*fid[(m, k)], digits=3) if (m, k) in fid else "" for k in kepts]
            print(f"| {m} | " + " | ".join(cells) + f" | {row_mean(fid, m):.3f} |")
        print("\nThe full cache per task (string_match_all x 100 ± SE)\n")
        print("| task | exact | |")
        print("|---|---|---|")
        for t in tasks:
            m, se = mean_se(values(records, EXACT, length, 0, [t])[t])
            floor = f"near the floor (< {args.floor:g})" if m < args.floor else ""
            print(f"| {t} | {fmt(m, se)} | {floor} |")
        print(f"\nClosest to the full cache (fidelity), per compression ratio; exact − method of the task "
              f"average, paired over the same samples\n")
        for k in kepts:
            ranked = sorted((b for b in branches if b[1] == k), key=lambda b: -fid[b][0])
            parts = []
            for b in ranked[: args.top]:
                d, se = task_average(paired(records, EXACT, b, length, tasks))
                parts.append(f"{b[0]} {fid[b][0]:.3f} (exact − it {fmt(d, se)}, {in_se(d, se)})")
            print(f"- {compression_label(k)}: " + "; ".join(parts))
        print()
        if pairs:
            print(f"Paired differences of the task average (string_match_all x 100), A − B over the same samples\n")
            print("| A − B | " + " | ".join(cols) + " |")
            print("|---|" + "---|" * len(cols))
            family, rows = [], []  # with --ci: the intervals, and each row's cells as indices into them
            for a, b in pairs:
                cells = []
                for k in kepts:
                    ba, bb = (EXACT if m == "exact" else (m, k) for m in (a, b))
                    if ba not in score or bb not in score:
                        cells.append("")  # a method not run at this ratio or length
                        continue
                    if args.ci:
                        cells.append(len(family))
                        family.append(interval(paired(records, ba, bb, length, tasks)))
                        continue
                    d, se = task_average(paired(records, ba, bb, length, tasks))
                    cells.append(f"{fmt(d, se)} ({in_se(d, se)})")
                rows.append((a, b, cells))
            if args.ci:  # one family per length: Holm over every cell of the table
                adjusted = stats.holm([ci.p if ci.p == ci.p else 1.0 for ci in family])
                for a, b, cells in rows:
                    print(f"| {a} − {b} | " + " | ".join(
                        c if c == "" else f"{family[c].mean:+.1f} [{family[c].lo:+.1f}, {family[c].hi:+.1f}], "
                        f"Holm p {adjusted[c]:.3g}" for c in cells) + " |")
                print(f"\n95% t intervals of the task-stratified paired difference (python/kvlab/stats.py "
                      f"stratified_interval); p adjusted by Holm over the {len(family)} cells of this table")
            else:
                for a, b, cells in rows:
                    print(f"| {a} − {b} | " + " | ".join(cells) + " |")
            print()


def interval(per_task):
    """The stratified interval of {task: [differences]} over the tasks with two or more samples."""
    groups = [xs for xs in per_task.values() if len(xs) >= 2]
    return stats.stratified_interval(groups) if groups else stats.Interval(*([float("nan")] * 7))


if __name__ == "__main__":
    main()
