#!/usr/bin/env python3
"""scripts/replay_contrasts.py on a hand-made replay result (a ctest, `replay_contrasts`): a unit's
seeds are averaged, each contrast is stats.paired_interval over the units both methods have, and
the Holm-adjusted p over the printed contrasts is stats.holm's.

  tests/python/test_replay_contrasts.py [repo root]
"""
import json
import os
import sys
import tempfile

from script_check import expect, script_runner  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats  # noqa: E402

run = script_runner(ROOT, "replay_contrasts.py")
err = {"a": [0.10, 0.20, 0.15, 0.30], "b": [0.12, 0.25, 0.15, 0.36], "c": [0.5, 0.1, 0.4, 0.2]}
rows = []
for m, values in err.items():
    for i, v in enumerate(values):
        for seed, shift in ((1, -0.01), (2, +0.01)):  # two seeds average to v
            rows.append({"method": m, "bytes": 0.25, "sample": 0, "layer": i // 2, "head": i % 2, "seed": seed,
                         "rel_err": v + shift})
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "result.json")
    json.dump({"rows": rows}, open(path, "w"))
    rc, out = run(path, "--pairs", "a:b,c:b")
    ab = stats.paired_interval(err["a"], err["b"])
    cb = stats.paired_interval(err["c"], err["b"])
    p = stats.holm([ab.p, cb.p])
    want = f"| bytes=0.25 | a − b | 4 | {ab.mean:+.4f} | [{ab.lo:+.4f}, {ab.hi:+.4f}] | {p[0]:.2g} |"
    expect(rc == 0 and want in out, want, out)
    want = f"| bytes=0.25 | c − b | 4 | {cb.mean:+.4f} | [{cb.lo:+.4f}, {cb.hi:+.4f}] | {p[1]:.2g} |"
    expect(want in out, want, out)
    rc, out = run(path, "--pairs", "a:zz")
    expect(rc != 0 and "share no unit" in out, "an unknown method is an error naming both", out)
print("replay_contrasts: ok")
