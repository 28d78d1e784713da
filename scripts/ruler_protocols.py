#!/usr/bin/env python3
"""RULER under the two protocols, paired: whole − context per method and compression ratio.

  scripts/ruler_protocols.py --context RUN [RUN ...] --whole RUN [RUN ...] [--entries METHOD]

The runs of each side are read (and pooled, and checked) as scripts/ruler_table.py does: e.g. step 1
of configs/paper/ruler.json (`--protocol context`) against step 3 (`--protocol whole`), both over
the same seeded samples. The two sides must hold the same samples: the full cache (exact) does not
depend on the protocol, so its output must be identical, sample by sample, on both sides, or this
refuses (naming the file and sample). Only the samples both sides hold enter a cell.

Prints, per length, one markdown table in the leaderboard's layout (methods x fraction removed):
the task average of the per-sample difference of string_match_all x 100, whole − context, with its
SE (each task's sd / sqrt(n) of the differences, combined over tasks as in ruler_table.py), and
the same for fidelity (ROUGE-L F1 to the full cache). Positive: the method scores higher under
`whole`. Below them, for --entries M (default snapkv), how many more entries M decodes from under
`context` than under `whole`: the entries it holds when the answer starts, summed over the samples
both sides hold, context / whole, per ratio. The protocols differ in more than whether the compression sees the question: under
`whole` the question and answer prefix are compressed with the haystack (a method may evict part
of them) and the first answer token comes from the exact prefill; under `context` they go through
the compressed cache exactly. The difference is the protocol's, all of it.
"""
import argparse
import sys
from collections import defaultdict

from ruler_table import EXACT, TASKS, compression_label, load, prediction_lines, split_label, task_average


def exact_outputs(runs):
    """{(task, length, id): (output, path)} of the exact branch over the runs' pred/ folders."""
    return {(task, length, r["sample"]): (r["output"], path)
            for spec in runs for path, _, task, length, r in prediction_lines(split_label(spec)[0], "exact")}


def check_same_samples(context_runs, whole_runs):
    """The full cache's outputs must agree on every sample both sides hold; returns how many."""
    a, b = exact_outputs(context_runs), exact_outputs(whole_runs)
    shared = sorted(set(a) & set(b))
    for key in shared:
        if a[key][0] != b[key][0]:
            sys.exit(f"ruler_protocols: the full cache's output of {key[0]}_{key[1]} sample {key[2]} differs: "
                     f"{a[key][1]} has {a[key][0]!r}, {b[key][1]} {b[key][0]!r}: not the same samples or model")
    return len(shared)


def paired_protocols(ctx, whole, branch, length, tasks, which):
    """{task: [whole − context of metric `which` (0 score, 1 fidelity) per shared sample]}."""
    out = {}
    for t in tasks:
        rc, rw = ctx.get((branch, t, length), {}), whole.get((branch, t, length), {})
        out[t] = [rw[i][which] - rc[i][which] for i in rw if i in rc]
    return out


def entries_decoding(runs, method, protocol):
    """{(branch, length, task, id): the entries `method` holds when its answer's first token is fed}
    over the runs' pred/ folders. `entries_start` counts the cache right after compression: under
    `whole` the compressed prompt, under `context` the compressed haystack, to which the question
    and answer prefix (prompt_tokens − context_len) are then added exactly."""
    def added(r):
        return r["prompt_tokens"] - r["context_len"] if protocol == "context" else 0
    return {(b, length, task, r["sample"]): r["entries_start"] + added(r)
            for spec in runs for _, b, task, length, r in prediction_lines(split_label(spec)[0], method)
            if b[1] is not None}


def entries_ratio(context_runs, whole_runs, method):
    """{(length, kept): (mean entries when the answer starts under context / the same under whole,
    samples)} over the samples both sides hold: `context` compresses the haystack to the budget and
    adds the question and answer prefix exactly, `whole` fits all of them into the budget."""
    a, b = entries_decoding(context_runs, method, "context"), entries_decoding(whole_runs, method, "whole")
    cells = defaultdict(list)
    for key in set(a) & set(b):
        branch, length = key[0], key[1]
        cells[(length, branch[1])].append((a[key], b[key]))
    return {k: (sum(x for x, _ in v) / sum(y for _, y in v), len(v)) for k, v in cells.items()}


def signed(d, se, digits):
    return f"{d:+.{digits}f} ± {se:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", nargs="+", required=True, help="run folders of --protocol context")
    ap.add_argument("--whole", nargs="+", required=True, help="run folders of --protocol whole, the same samples")
    ap.add_argument("--entries", default="snapkv", help="the method whose entries are compared across the protocols")
    args = ap.parse_args()
    ctx, p_ctx = load(args.context)
    whole, p_whole = load(args.whole)
    if (p_ctx, p_whole) != ("context", "whole"):
        sys.exit(f"ruler_protocols: --context runs are protocol {p_ctx}, --whole runs {p_whole}")
    n_shared = check_same_samples(args.context, args.whole)
    if n_shared == 0:
        sys.exit("ruler_protocols: the two sides share no sample of the full cache (exact): not runs over the same samples")
    print(f"The full cache's output is identical under both protocols on all {n_shared} samples both hold.\n")
    ratio = entries_ratio(args.context, args.whole, args.entries)
    lengths = sorted({l for (_, _, l) in whole} & {l for (_, _, l) in ctx})
    for length in lengths:
        branches = sorted({b for (b, _, l) in whole if l == length} & {b for (b, _, l) in ctx if l == length})
        branches = [b for b in branches if b != EXACT]
        if not branches:
            sys.exit(f"ruler_protocols: at {length} tokens no compressed branch is on both sides "
                     f"(a RUN@LABEL on one side only renames its methods)")
        diffs = {which: {b: paired_protocols(ctx, whole, b, length, TASKS, which) for b in branches} for which in (0, 1)}
        # tasks where every branch has shared samples
        tasks = [t for t in TASKS if all(diffs[0][b][t] for b in branches)]
        counts = sorted({len(diffs[0][b][t]) for b in branches for t in tasks})
        kepts = sorted({b[1] for b in branches}, reverse=True)
        methods = sorted({b[0] for b in branches})
        cols = [compression_label(k) for k in kepts]
        for which, title, digits in ((0, "string_match_all x 100", 1), (1, "fidelity (ROUGE-L F1 to the full cache)", 3)):
            cell = {b: task_average({t: diffs[which][b][t] for t in tasks}) for b in branches}

            def row_mean(m):
                xs = [cell[(m, k)][0] for k in kepts if (m, k) in cell]
                return sum(xs) / len(xs)

            print(f"### {length} tokens: whole − context, {title}; {len(tasks)} tasks, "
                  f"{'/'.join(map(str, counts))} paired samples per task\n")
            print("| method | " + " | ".join(cols) + " | mean |")
            print("|---|" + "---|" * (len(cols) + 1))
            for m in sorted(methods, key=lambda m: -row_mean(m)):
                cells = [signed(*cell[(m, k)], digits) if (m, k) in cell else "" for k in kepts]
                print(f"| {m} | " + " | ".join(cells) + f" | {row_mean(m):+.{digits}f} |")
            print()
        cells = [f"{compression_label(k)}: {ratio[(length, k)][0]:.3f} ({ratio[(length, k)][1]} samples)"
                 for k in kepts if (length, k) in ratio]
        if cells:
            print(f"{args.entries}'s entries when the answer starts, context / whole (mean over the shared samples): "
                  + ", ".join(cells) + "\n")


if __name__ == "__main__":
    main()
