#!/usr/bin/env python3
"""scripts/ruler_protocols.py on two hand-made runs, one per protocol (a ctest, `ruler_protocols`):
the paired whole − context of the score, the entries each protocol decodes from (under `context`
the question and answer prefix are added to the compressed haystack), and the refusal when the
full cache's output differs between the two sides.

  tests/python/test_ruler_protocols.py [repo root]
"""
import json
import os
import sys
import tempfile

from script_check import expect, script_runner, write_ruler_results  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
run = script_runner(ROOT, "ruler_protocols.py")


def write_run(run, protocol, branches):
    """branches: {(method, kept): [(id, score, entries_start, output), ...]} -> a results folder of vt at
    1024; every sample has 100 prompt tokens of which 90 are context (the question and answer prefix: 10)."""
    write_ruler_results(run, protocol, {
        b: [{"id": i, "score": sc, "rougeL_vs_exact": sc, "entries_start": e, "prompt_tokens": 100, "context_len": 90,
             "output": o} for i, sc, e, o in lines] for b, lines in branches.items()})


with tempfile.TemporaryDirectory() as d:
    c, w = os.path.join(d, "context"), os.path.join(d, "whole")
    # kept 0.5: under context snapkv compresses the 90 context tokens to 45 and adds 10 (55 when the
    # answer starts); under whole it fits all 100 into 50. It scores 0, 0 under context, 1, 0 under whole.
    write_run(c, "context", {("exact", None): [("0", 1, 100, " 42."), ("1", 1, 100, " 7.")],
                             ("snapkv", 0.5): [("0", 0, 45, "x"), ("1", 0, 45, "y")]})
    write_run(w, "whole", {("exact", None): [("0", 1, 100, " 42."), ("1", 1, 100, " 7.")],
                           ("snapkv", 0.5): [("0", 1, 50, " 42."), ("1", 0, 50, "y")]})
    rc, out = run("--context", c, "--whole", w)
    expect(rc == 0, "exit 0 on runs over the same samples", out)
    expect("identical under both protocols on all 2 samples" in out, "the full cache compared", out)
    expect("| snapkv | +50.0 ± 50.0 | +50.0 |" in out, "whole − context of the score: (100 + 0) / 2, SE 50", out)
    expect("context / whole (mean over the shared samples): 50%: 1.100 (2 samples)" in out,
           "55 entries under context against 50 under whole", out)
    rc, out = run("--context", w, "--whole", c)
    expect(rc != 0 and "protocol whole" in out, "sides swapped: refused, naming the protocols", out)
    merged = os.path.join(d, "step", "20270101-000000_abcdef0")  # a merged run as committed: no pred/
    os.makedirs(merged)
    with open(os.path.join(merged, "result.json"), "w") as f:
        json.dump({"context": {"config": {"protocol": "whole"}}}, f)
    rc, out = run("--context", c, "--whole", merged)
    expect(rc != 0 and "pred is missing" in out and os.path.join(d, "step", "shards", "shard*") in out,
           "a merged run without pred/ is refused, pointing at its shards", out)
    write_run(w, "whole", {("exact", None): [("0", 1, 100, " 42."), ("1", 1, 100, " 8.")]})
    rc, out = run("--context", c, "--whole", w)
    expect(rc != 0 and "vt_1024 sample 1 differs" in out, "refused, naming the sample whose full cache differs", out)
print("ok")
