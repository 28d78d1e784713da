#!/usr/bin/env python3
"""scripts/pilot_power.py on a hand-made pilot (a ctest, `pilot_power`): the task-averaged paired
difference and its interval equal stats.stratified_interval on the same differences, and the samples
per task for a margin follow from the pooled sd: n = ceil(n_for_margin(sd, m) / T); and
`scripts/ruler_table.py --compare A:B --ci` prints the same interval with its Holm-adjusted p.

  tests/python/test_pilot_power.py [repo root]
"""
import math
import os
import sys
import tempfile

from script_check import expect, script_runner, write_ruler_results  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats  # noqa: E402

run = script_runner(ROOT, "pilot_power.py")
# two tasks, 6 samples each: exact scores 1 everywhere, snapkv at kept 0.5 misses some
miss = {"vt": [0, 1, 0, 0, 1, 1], "cwe": [0, 0, 0, 1, 0, 0]}
with tempfile.TemporaryDirectory() as d:
    for task in ("vt", "cwe"):
        write_ruler_results(os.path.join(d, task), "context", {
            ("exact", None): [{"id": i, "score": 1.0, "rougeL_vs_exact": 1.0} for i in range(6)],
            ("snapkv", 0.5): [{"id": i, "score": 1.0 - m, "rougeL_vs_exact": 1.0 - m}
                              for i, m in enumerate(miss[task])]}, task=task, length=4096)
    rc, out = run(os.path.join(d, "vt"), os.path.join(d, "cwe"), "--margins", "20,50")
    diffs = [[-100.0 * m for m in miss["cwe"]], [-100.0 * m for m in miss["vt"]]]
    ci = stats.stratified_interval(diffs)
    sd = math.sqrt(sum(stats.mean_se(g)[1] ** 2 * len(g) for g in diffs) / 2)
    n20 = max(2, math.ceil(stats.n_for_margin(sd, 20) / 2))
    n50 = max(2, math.ceil(stats.n_for_margin(sd, 50) / 2))
    row = (f"| snapkv - exact | 4096 | 0.5 | 2 | 6 | {ci.mean:+.1f} [{ci.lo:+.1f}, {ci.hi:+.1f}] | "
           f"{stats.mde_paired(sd, 12):.1f} | {n20} | {n50} |")
    expect(rc == 0 and row in out, f"the row {row}", out)
    expect(ci.mean == -100.0 * 4 / 12 and n20 > n50 >= 2, "difference -33.3, more samples for a smaller margin", out)
    # ruler_table.py --ci: the same interval, and Holm over the table's one cell is the cell's own p
    rc, out = script_runner(ROOT, "ruler_table.py")(os.path.join(d, "vt"), os.path.join(d, "cwe"),
                                                    "--compare", "snapkv:exact", "--ci")
    cell = f"| snapkv − exact | {ci.mean:+.1f} [{ci.lo:+.1f}, {ci.hi:+.1f}], Holm p {ci.p:.3g} |"
    expect(rc == 0 and cell in out, f"ruler_table --ci prints {cell}", out)
    rc, out = run(os.path.join(d, "vt"), "--pairs", "snapkv:nosuch")
    expect(rc != 0 and "--pairs snapkv:nosuch" in out, "an unknown method in --pairs is refused by name", out)
print("3 passed, 0 failed")
