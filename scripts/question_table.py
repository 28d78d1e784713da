#!/usr/bin/env python3
"""Tables per question index of a run that asks one compressed context several questions (issue 53;
RULER's niah_multiquestion, `kvlab ruler --tasks niah_multiquestion --protocol context`).

  scripts/question_table.py RUN [RUN ...]

RUN: a results folder or task run folders (the shards of one step: their records are pooled). Every
record must carry context_group and question_index (the task runner writes them for such tasks).
Prints, per task and length, markdown tables:
  1. score x 100 per question index, one row per branch (method, kept), with the mean over all
     questions; each cell a mean over the contexts;
  2. fidelity to the full cache per question index: the fraction of outputs equal to the full
     cache's, and the mean ROUGE-L F1 against it;
  3. the entries each branch held when its first answer token was chosen (entries_start, per
     (layer, KV head)), per question index: equal for every question when the context is compressed
     once and the question fed through it;
  4. decay over the questions, per branch: (a) the slope of the score (x 100) per question index,
     each context's least-squares slope over its questions, then the mean over the contexts with its
     t interval (stats.diff_interval), its p adjusted by Holm over the table's branches
     (stats.holm), and the smallest slope the test could detect at alpha 0.05 and power 0.8
     (stats.mde_paired on the slopes' sd); (b) the last question against the first, paired over the
     contexts: the difference in points with Newcombe's interval and the exact McNemar p
     (stats.mcnemar_from_pairs; outcomes are the score rounded to 0/1, exact for one reference);
  5. the cost: seconds per context (its questions' lines summed: the prefill, and kvzip's second
     prefill, on the first question's lines only) beside seconds per question.
"""
import argparse
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402
from kvlab import stats  # noqa: E402


def fmt(x, nd=1):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def branch_name(b):
    method, kept = b
    return "exact (full cache)" if method == "exact" else f"{method} kept {kept:g}"


def load(runs):
    recs = []
    for run in runs:
        try:
            recs += results.load(run)
        except results.ResultsError as e:
            sys.exit(f"question_table: {e}")
    seen, out = {}, []
    for r in recs:
        if "question_index" not in r or "context_group" not in r:
            sys.exit(f"question_table: record {r.get('sample')} of {r.get('task')} ({r.get('method')}) has no "
                     f"question_index / context_group: not a run asking several questions per context")
        key = (r["task"], r.get("length"), r["method"], r.get("kept"), r["sample"])
        if key in seen:
            if seen[key]["output"] != r["output"]:
                sys.exit(f"question_table: {key} is given twice with different outputs")
            continue
        seen[key] = r
        out.append(r)
    return out


def slope(points):
    """Least-squares slope of y on q over (q, y) pairs."""
    qs = [q for q, _ in points]
    mq = sum(qs) / len(qs)
    my = sum(y for _, y in points) / len(points)
    den = sum((q - mq) ** 2 for q in qs)
    return sum((q - mq) * (y - my) for q, y in points) / den if den else float("nan")


def tables(recs):
    by_dataset = defaultdict(list)
    for r in recs:
        by_dataset[(r["task"], r.get("length"))].append(r)
    for (task, length), rs in sorted(by_dataset.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        # cell[branch][context][question] = record
        cell = defaultdict(lambda: defaultdict(dict))
        for r in rs:
            cell[(r["method"], r.get("kept"))][str(r["context_group"])][int(r["question_index"])] = r
        branches = sorted(cell, key=lambda b: (b[0] != "exact", b[0], -(b[1] or 0)))
        qidx = sorted({q for b in cell.values() for c in b.values() for q in c})
        contexts = sorted({c for b in cell.values() for c in b}, key=lambda c: (len(c), c))
        complete = [c for c in contexts if all(len(cell[b][c]) == len(qidx) for b in branches)]
        print(f"## {task}, {length} tokens: {len(complete)} contexts x {len(qidx)} questions "
              f"({len(contexts) - len(complete)} incomplete contexts left out)\n")
        head = "| branch | " + " | ".join(f"q{q}" for q in qidx) + " | all |"
        sep = "|---|" + "---|" * (len(qidx) + 1)

        def per_q(metric, scale):
            print(head)
            print(sep)
            for b in branches:
                cols = []
                for q in qidx:
                    m, se = stats.mean_se([scale * float(cell[b][c][q][metric]) for c in complete])
                    cols.append(f"{fmt(m)} ± {fmt(se)}")
                m, se = stats.mean_se([scale * float(cell[b][c][q][metric]) for c in complete for q in qidx])
                print(f"| {branch_name(b)} | " + " | ".join(cols) + f" | {fmt(m)} |")
            print()

        print("### Score (string_match_all x 100, mean ± SE over the contexts)\n")
        per_q("score", 100.0)
        print("### Fidelity: outputs equal to the full cache's (%)\n")
        per_q("same_as_exact", 100.0)
        print("### Fidelity: ROUGE-L F1 against the full cache's output (x 100)\n")
        per_q("rougeL_vs_exact", 100.0)
        print("### Entries held when the first answer token is chosen (per layer and KV head)\n")
        print(head)
        print(sep)
        for b in branches:
            cols = [fmt(sum(float(cell[b][c][q]["entries_start"]) for c in complete) / len(complete))
                    for q in qidx]
            allq = [float(cell[b][c][q]["entries_start"]) for c in complete for q in qidx]
            print(f"| {branch_name(b)} | " + " | ".join(cols) + f" | {fmt(sum(allq) / len(allq))} |")
        print()

        print("### Decay over the questions\n")
        print("Slope: points of score per question index, each context's least-squares slope, mean over the "
              "contexts with its 95% t interval, p adjusted by Holm over the branches, and the smallest slope "
              "the test detects (alpha 0.05, power 0.8). Last - first: q"
              f"{qidx[-1]} minus q{qidx[0]}, paired over the contexts, Newcombe's 95% interval, exact McNemar p.\n")
        rows = []
        for b in branches:
            slopes = [100.0 * slope([(q, float(cell[b][c][q]["score"])) for q in qidx]) for c in complete]
            iv = stats.diff_interval(slopes)
            sd = iv.se * math.sqrt(iv.n) if iv.n > 1 else float("nan")
            mde = stats.mde_paired(sd, iv.n) if iv.n > 1 and sd > 0 else float("nan")
            last = [round(float(cell[b][c][qidx[-1]]["score"])) for c in complete]
            first = [round(float(cell[b][c][qidx[0]]["score"])) for c in complete]
            mc = stats.mcnemar_from_pairs(last, first)
            rows.append((b, iv, mde, mc))
        pv = [iv.p if not math.isnan(iv.p) else 1.0 for _, iv, _, _ in rows]
        adj = stats.holm(pv)
        print("| branch | slope per question | 95% interval | Holm p | detectable | last - first | 95% interval "
              "| discordant (b, c) | McNemar p |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (b, iv, mde, mc), p in zip(rows, adj):
            print(f"| {branch_name(b)} | {fmt(iv.mean)} | [{fmt(iv.lo)}, {fmt(iv.hi)}] | {fmt(p, 3)} | {fmt(mde)} "
                  f"| {fmt(100 * mc['diff'])} | [{fmt(100 * mc['lo'])}, {fmt(100 * mc['hi'])}] | "
                  f"{mc['b']}, {mc['c']} | {fmt(mc['p'], 3)} |")
        print()

        print("### Cost: seconds per context and per question (the prefill, and kvzip's reconstruction, "
              "on the first question's lines)\n")
        print("| branch | per context | first question | each later question |")
        print("|---|---|---|---|")
        for b in branches:
            per_ctx = [sum(float(cell[b][c][q]["seconds"]) for q in qidx) for c in complete]
            first = [float(cell[b][c][qidx[0]]["seconds"]) for c in complete]
            later = [float(cell[b][c][q]["seconds"]) for c in complete for q in qidx[1:]]
            print(f"| {branch_name(b)} | {fmt(sum(per_ctx) / len(per_ctx))} | {fmt(sum(first) / len(first))} | "
                  f"{fmt(sum(later) / len(later)) if later else '—'} |")
        print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="results folders or task run folders (shards of one step)")
    args = ap.parse_args()
    recs = load(args.runs)
    if not recs:
        sys.exit("question_table: no records")
    tables(recs)


if __name__ == "__main__":
    main()
