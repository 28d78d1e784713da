#!/usr/bin/env python3
"""scripts/question_table.py on a hand-made run asking each context three questions (a ctest,
`question_table`): per-question means, the per-context slope (for three questions (y2 - y0)/2) with
its t interval, the last-minus-first discordant counts, and a record without a question index refused.

  tests/python/test_question_table.py [repo root]
"""
import os
import sys
import tempfile

from script_check import expect, script_runner, write_ruler_results  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats  # noqa: E402

run = script_runner(ROOT, "question_table.py")
# 6 contexts x 3 questions; the full cache finds every answer, snapkv loses later ones more often
snap = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 0], [1, 1, 0], [1, 0, 1]]


def lines(scores):
    return [{"id": 3 * c + q, "score": float(s), "same_as_exact": s == 1, "rougeL_vs_exact": float(s),
             "entries_start": 100.0, "seconds": 10.0 if q == 0 else 1.0, "context_group": str(c),
             "question_index": q, "output": str(s)}
            for c, row in enumerate(scores) for q, s in enumerate(row)]


with tempfile.TemporaryDirectory() as d:
    folder = os.path.join(d, "mq")
    write_ruler_results(folder, "context", {("exact", None): lines([[1, 1, 1]] * 6), ("snapkv", 0.25): lines(snap)},
                        task="niah_multiquestion", length=4096)
    rc, out = run(folder)
    expect(rc == 0 and "6 contexts x 3 questions" in out, "the run's shape", out)
    q2 = [row[2] * 100.0 for row in snap]
    m, se = stats.mean_se(q2)
    expect(f"| snapkv kept 0.25 | 83.3 ± 16.7 | 66.7 ± 21.1 | {m:.1f} ± {se:.1f} | 61.1 |" in out,
           "snapkv's score per question index", out)
    slopes = [100.0 * (row[2] - row[0]) / 2 for row in snap]  # least squares over q = 0, 1, 2
    iv = stats.diff_interval(slopes)
    b = sum(1 for row in snap if row[2] == 1 and row[0] == 0)  # last right, first wrong
    c = sum(1 for row in snap if row[2] == 0 and row[0] == 1)
    expect((b, c) == (0, 3), "the hand count of discordant contexts", out)
    row = f"| snapkv kept 0.25 | {iv.mean:.1f} | [{iv.lo:.1f}, {iv.hi:.1f}] |"
    expect(row in out and f"| -50.0 | " in out and f"| {b}, {c} | 0.250 |" in out,
           f"the slope row {row}, last - first -50 points, McNemar (0, 3) p 0.25", out)
    expect("| exact (full cache) | 12.0 | 10.0 | 1.0 |" in out, "seconds per context, first and later questions", out)
    # a record of a run that asks one question per context is refused by name
    plain = os.path.join(d, "plain")
    write_ruler_results(plain, "context", {("exact", None): [{"id": 0, "score": 1.0, "output": "x"}]})
    rc, out = run(plain)
    expect(rc != 0 and "has no question_index" in out, "a run without question indices is refused", out)
print("5 passed, 0 failed")
