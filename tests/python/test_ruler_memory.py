#!/usr/bin/env python3
"""scripts/ruler_memory.py on two hand-made runs (a ctest, `ruler_memory`): the ratios to snapkv,
the largest spread with and without a method set apart, and the exit status when the full cache's
output differs between runs holding the same sample.

  tests/python/test_ruler_memory.py [repo root]
"""
import json
import os
import sys
import tempfile

from script_check import expect, script_runner, write_ruler_results  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
run = script_runner(ROOT, "ruler_memory.py")


def write_run(run, branches):
    """branches: {(method, kept): [(id, entries_start, output), ...]} -> a results folder of vt at 1024"""
    write_ruler_results(run, "context", {b: [{"id": i, "entries_start": e, "output": o} for i, e, o in lines]
                                         for b, lines in branches.items()})


with tempfile.TemporaryDirectory() as d:
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    # two samples at kept 0.5: snapkv 1000 / 2000 entries; knorm equal; subgen half; duo 0.998 on id 1
    write_run(a, {("exact", None): [("0", 4000, " 42."), ("1", 4000, " 7.")],
                  ("snapkv", 0.5): [("0", 1000, "x"), ("1", 2000, "y")],
                  ("knorm", 0.5): [("0", 1000, "x"), ("1", 2000, "y")]})
    write_run(b, {("exact", None): [("0", 4000, " 42."), ("1", 4000, " 7.")],
                  ("subgen", 0.5): [("0", 500, "z"), ("1", 1100, "z")],
                  ("duo_attention", 0.5): [("0", 1000, "w"), ("1", 1996, "w")]})
    rc, out = run(a, b)
    expect(rc == 0, "exit 0 when the full cache agrees", out)
    expect("| knorm | 2 | 1.0000 | 1.0000 | 1.0000 | 2 |" in out, "knorm equal to snapkv on both lines", out)
    expect("| subgen | 2 | 0.5000 | 0.5500 | 0.5250 | 0 |" in out, "subgen's ratios 0.5 and 0.55", out)
    expect("| duo_attention | 2 | 0.9980 | 1.0000 | 0.9990 | 1 |" in out, "duo_attention within 0.2%", out)
    expect("kept 0.5: 2.00e-03 over 2" in out, "spread 0.002 (duo on id 1), subgen apart by default", out)
    expect("output identical on 2 of them" in out, "the full cache compared across runs", out)
    rc, out = run(a, b, "--apart", "subgen,duo_attention")
    expect("kept 0.5: 0.00e+00 over 2" in out, "no spread once duo_attention is set apart", out)
    write_run(b, {("exact", None): [("0", 4000, " 42."), ("1", 4000, " 8.")]})
    rc, out = run(a, b)
    expect(rc == 1 and "differs: vt_1024 id 1" in out, "exit 1 naming the sample whose full cache differs", out)
    rc, out = run(os.path.join(d, "missing"))
    expect(rc != 0 and "pred is missing" in out, "a folder without pred/ is refused by name", out)
print("ruler_memory: all checks pass")
