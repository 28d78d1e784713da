#!/usr/bin/env python3
"""scripts/layer_error_vs_score.py on hand-made runs (a ctest, `layer_error_vs_score`): the per-branch
means, Spearman's rho across branches and within a branch against stats.spearman on the same numbers,
intervals that contain them, and a run without layer_rel_err refused by name.

  tests/python/test_layer_error_vs_score.py [repo root]
"""
import csv
import os
import sys
import tempfile

from script_check import expect, script_runner, write_ruler_results  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats  # noqa: E402

run = script_runner(ROOT, "layer_error_vs_score.py")
N = 12
# the full cache scores 1 on every record; three branches, more error and more misses as kept falls
exact = [{"id": i, "score": 1.0, "layer_rel_err": 0.0} for i in range(N)]
miss = {0.5: {3}, 0.25: {1, 3, 7, 9}, 0.125: {0, 1, 3, 5, 7, 9, 11}}
err = {0.5: 0.05, 0.25: 0.12, 0.125: 0.3}


def branch(kept):
    # a record's error: the branch's level, higher on the records it misses (within-branch signal)
    return [{"id": i, "score": 0.0 if i in miss[kept] else 1.0,
             "layer_rel_err": err[kept] + (0.02 if i in miss[kept] else 0.0) + 0.001 * i} for i in range(N)]


with tempfile.TemporaryDirectory() as d:
    folder = os.path.join(d, "r")
    # two more methods at 0.25: the per-kept table ranks three methods there
    h2o = [dict(r, layer_rel_err=r["layer_rel_err"] * 0.5) for r in branch(0.5)]    # less error, fewer misses
    knorm = [dict(r, layer_rel_err=r["layer_rel_err"] * 3.0) for r in branch(0.125)]  # more error, more misses
    write_ruler_results(folder, "context", {("exact", None): exact, **{("snapkv", k): branch(k) for k in miss},
                                            ("h2o", 0.25): h2o, ("knorm", 0.25): knorm},
                        task="niah_single_1", length=4096)
    rc, out = run(folder, "--boot", "300", "--out", os.path.join(d, "rows.csv"))
    expect(rc == 0, "runs", out)
    expect("5 branches, 12 records in every branch (1 tasks)" in out, "the shape", out)
    at = [h2o, branch(0.25), knorm]
    rho_k = stats.spearman([sum(r["layer_rel_err"] for r in b) for b in at], [sum(r["score"] for r in b) for b in at])
    expect(rho_k == -1.0 and f"| 0.25 | 3 | {rho_k:+.3f} |" in out, "the methods at kept 0.25 ranked by their error", out)
    expect("| 0.5 | " not in out.split("across the methods")[1].split("within the branch")[0],
           "a kept fraction with fewer than three methods has no row", out)
    e = stats.mean_se([r["layer_rel_err"] for r in branch(0.25)])[0]
    expect(f"| snapkv kept 0.25 | 12 | {e:.4f} | 66.7 | 100.0 | +33.3 |" in out, "snapkv 0.25's row", out)
    means = {b: (sum(r["layer_rel_err"] for r in v), sum(r["score"] for r in v))
             for b, v in {"s5": branch(0.5), "s25": branch(0.25), "s125": branch(0.125), "h": h2o, "k": knorm}.items()}
    rho = stats.spearman([m[0] for m in means.values()], [m[1] for m in means.values()])
    expect(f"Spearman rho(mean layer_rel_err, mean score) = {rho:+.3f}" in out, f"rho {rho:+.3f} across branches", out)
    b = branch(0.125)
    want = stats.spearman([r["layer_rel_err"] for r in b], [1.0 - r["score"] for r in b])
    expect(want > 0.8 and f"| snapkv kept 0.125 | {want:+.3f} |" in out, f"within-branch rho {want:+.3f}", out)
    row = next(line for line in out.splitlines() if line.startswith("| snapkv kept 0.125 | ") and line.count("[") == 2)
    expect(row.count(f"| {want:+.3f} | [") == 2, "one task: the mean of the per-task rho is the pooled rho", out)
    rows = list(csv.DictReader(open(os.path.join(d, "rows.csv"))))
    got = {(r["branch"], r["statistic"]): float(r["value"]) for r in rows}
    expect(got[("snapkv kept 0.125", "within_rho_lo")] <= want <= got[("snapkv kept 0.125", "within_rho_hi")],
           "the within-branch interval contains rho", out)
    expect(abs(got[("across branches", "spearman_rho")] - rho) < 1e-12, "--out: rho", out)
    # a run made without --layer-error is refused, naming the flag
    plain = os.path.join(d, "plain")
    write_ruler_results(plain, "context", {("exact", None): [{"id": 0, "score": 1.0}],
                                           ("snapkv", 0.5): [{"id": 0, "score": 1.0}]})
    rc, out = run(plain)
    expect(rc != 0 and "carry no layer_rel_err" in out and "--layer-error" in out, "refused without the error", out)
    rc, out = run(folder, "--tasks", "vt")
    expect(rc != 0 and "--tasks vt: not in the runs" in out, "an unknown task named", out)
print("layer_error_vs_score: passed")
