"""What the tests of scripts/*.py share: run a script, keep its exit status and output, fail with that
output when an expectation does not hold, and write hand-made results folders (docs/results.md).

  from script_check import expect, script_runner, write_ruler_results
  run = script_runner(ROOT, "ruler_memory.py")
  rc, out = run("--flag", "folder")
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from kvlab import results  # noqa: E402


def script_runner(root, name):
    """A function running scripts/<name> with the given arguments: (exit status, stdout + stderr)."""
    script = os.path.join(root, "scripts", name)

    def run(*args):
        p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    return run


def write_ruler_results(folder, protocol, branches, task="vt", length=1024, run=None):
    """A RULER results folder by hand. branches: {(method, kept): [{"id": ..., field: value}, ...]},
    kept None for exact; every record gets the identity fields of `task` at `length`."""
    records = []
    for (method, kept), lines in branches.items():
        for line in lines:
            rec = {"benchmark": "ruler", "task": task, "length": length, "sample": str(line["id"]),
                   "method": method, "params": {}, "setting": "full" if kept is None else f"ratio={kept:g}",
                   "kept": 1.0 if kept is None else kept, "protocol": protocol, "preset": "paper",
                   "decode_rule": "prefill", "model": "test", "shard": ""}
            rec.update({k: v for k, v in line.items() if k != "id"})
            records.append(rec)
    results.write_results(folder, records, run=run or {"format": 1})


def expect(cond, what, out):
    if not cond:
        print(f"FAIL: {what}\n--- output ---\n{out}")
        sys.exit(1)
