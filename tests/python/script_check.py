"""What the tests of scripts/*.py share: run a script, keep its exit status and output, and fail
with that output when an expectation does not hold.

  from script_check import expect, script_runner
  run = script_runner(ROOT, "ruler_memory.py")
  rc, out = run("--flag", "folder")
"""
import os
import subprocess
import sys


def script_runner(root, name):
    """A function running scripts/<name> with the given arguments: (exit status, stdout + stderr)."""
    script = os.path.join(root, "scripts", name)

    def run(*args):
        p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    return run


def expect(cond, what, out):
    if not cond:
        print(f"FAIL: {what}\n--- output ---\n{out}")
        sys.exit(1)
