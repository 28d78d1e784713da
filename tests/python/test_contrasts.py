#!/usr/bin/env python3
"""scripts/contrasts.py on hand-made replay and ppl results (a ctest, `contrasts`): a unit's seeds
are averaged, each contrast is stats.paired_interval over the units both methods have, the smallest
detectable difference is stats.mde_paired at the differences' sd, and the Holm-adjusted p over the
printed contrasts is stats.holm's; ppl's rows pair on segments (--metric nll --unit segment).

  tests/python/test_contrasts.py [repo root]
"""
import json
import os
import sys
import tempfile

from script_check import expect, script_runner  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats  # noqa: E402

run = script_runner(ROOT, "contrasts.py")
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
    mde = lambda iv: stats.mde_paired(stats.mean_se([x - y for x, y in iv])[1] * len(iv) ** 0.5, len(iv))  # noqa: E731
    want = (f"| bytes=0.25 | a − b | 4 | {ab.mean:+.4f} | [{ab.lo:+.4f}, {ab.hi:+.4f}] | "
            f"{mde(list(zip(err['a'], err['b']))):.4f} | {p[0]:.2g} |")
    expect(rc == 0 and want in out, want, out)
    want = (f"| bytes=0.25 | c − b | 4 | {cb.mean:+.4f} | [{cb.lo:+.4f}, {cb.hi:+.4f}] | "
            f"{mde(list(zip(err['c'], err['b']))):.4f} | {p[1]:.2g} |")
    expect(want in out, want, out)
    rc, out = run(path, "--pairs", "a:zz")
    expect(rc != 0 and "share no unit" in out, "an unknown method is an error naming both", out)
    # ppl --segments: rows per (method, cache_size, segment); the full cache's rows are not a setting.
    nll = {"buzz": [3.1, 3.4, 2.9], "h2o": [3.3, 3.5, 3.0]}
    prow = [{"method": "full", "cache_size": 1024, "segment": i, "nll": 2.5} for i in range(3)]
    prow += [{"method": m, "cache_size": 50, "segment": i, "nll": v} for m, vs in nll.items() for i, v in enumerate(vs)]
    json.dump({"rows": prow}, open(path, "w"))
    rc, out = run(path, "--metric", "nll", "--unit", "segment", "--pairs", "h2o:buzz")
    hb = stats.paired_interval(nll["h2o"], nll["buzz"])
    want = (f"| cache_size=50 | h2o − buzz | 3 | {hb.mean:+.4f} | [{hb.lo:+.4f}, {hb.hi:+.4f}] | "
            f"{mde(list(zip(nll['h2o'], nll['buzz']))):.4f} | {hb.p:.2g} |")
    expect(rc == 0 and want in out and "full" not in out, want, out)
    rc, out = run(path, "--metric", "rel_err", "--unit", "segment", "--pairs", "h2o:buzz")
    expect(rc != 0 and "no rel_err" in out, "a missing metric is an error naming it", out)
print("contrasts: ok")
