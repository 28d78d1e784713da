#!/usr/bin/env python3
"""scripts/ledger_links.py: the prose agrees with docs/claims.md's ledger. On a hand-made repository
each kind of disagreement is found (and only it), then this checkout has none.

  python3 tests/python/test_ledger_links.py REPO
"""
import io
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout

REPO = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import ledger_links  # noqa: E402

LEDGER = """# Claims

## The full-cache gate

| id | paper | table/figure | claim | test | model | n | effect | MDE | verdict | note |
|---|---|---|---|---|---|---|---|---|---|---|
| <a id="p-t1"></a>P-T1 | P | Table 1 | x | y | m | 10 | +1 [+0.5, +1.5] | 0.4 | holds | 1 |
| <a id="p-t2"></a>P-T2 | P | Table 2 | x | y | m | 10 | −1 [−1.5, −0.5] | 0.4 | fails (the claim +1 lies outside) | 2 |
| <a id="p-f1"></a>P-F1 | P | Fig. 1 | x | y | m | 10 | +0.1 [−0.5, +0.7] | 0.9 | not separated | 3 |
| <a id="q-f2"></a>Q-F2 | Q | Fig. 2 | x | — | — | — | — | — | untestable (absent) | 4 |

**Count.** 4 rows. Verdicts: holds 1 (P-T1), fails 1 (P-T2), not separated 1 (P-F1),
untestable 1 (Q-F2).
"""

README = """# kvlab

The ledger has four rows: one *hold* (P-T1), one *fail* (P-T2), one *not separated* (P-F1),
one *untestable*. See [the gate](docs/claims.md#the-full-cache-gate).

- [P-T1](docs/claims.md#p-t1): *holds*; [P-T2](docs/claims.md#p-t2) and
  [P-F1](docs/claims.md#p-f1): not separated at n = 10 (the sentence a reader would misread).
"""


def run(readme, ledger=LEDGER, results=None):
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        os.makedirs(os.path.join(d, "results", "r1"))
        open(os.path.join(d, "docs", "claims.md"), "w").write(ledger)
        open(os.path.join(d, "README.md"), "w").write(readme)
        open(os.path.join(d, "results", "README.md"), "w").write("# results\n")
        open(os.path.join(d, "results", "r1", "README.md"), "w").write(results or "# r1\n")
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = ledger_links.main(["ledger_links.py", d])
        return rc, buf.getvalue()


failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f"\n     {detail}"))
    failures += not ok


# the hand-made README says P-T2 is not separated (a list whose verdict covers both links)
rc, out = run(README)
check("a list of links takes the verdict after it", rc == 1 and "P-T2 is written 'not separated'" in out
      and "P-F1" not in out.replace("P-F1)", ""), out)
check("one disagreement and no other", out.count("\n") == 2, out)

good = README.replace("[P-T2](docs/claims.md#p-t2) and\n  [P-F1](docs/claims.md#p-f1): not separated",
                      "[P-T2](docs/claims.md#p-t2): *fails*; [P-F1](docs/claims.md#p-f1): not separated")
rc, out = run(good)
check("agreeing prose passes, a heading anchor is a target", rc == 0 and "3 verdicts written after a link" in out, out)

rc, out = run(good.replace("one *hold* (P-T1)", "two *hold* (P-T1)"))
check("README's count of a verdict", rc == 1 and "2 rows, the ledger has 1 holds" in out, out)
rc, out = run(good.replace("one *fail* (P-T2)", "one *fail* (P-F1)"))
check("README's ids listed with a count", rc == 1 and "names ['P-F1']" in out, out)
rc, out = run(good, ledger=LEDGER.replace("not separated 1 (P-F1)", "not separated 2 (P-F1)"))
check("the ledger's own count line", rc == 1 and "docs/claims.md" in out and "2 rows, the ledger has 1 not separated" in out, out)
rc, out = run(good, results="[P-T9](../../docs/claims.md#p-t9) and [P-T1](../../docs/claims.md#p-t2)\n")
check("a link to no row; a row id pointing at another row",
      rc == 1 and "claims.md#p-t9: no such row" in out and "link text P-T1 points at row P-T2" in out, out)
rc, out = run(good, results="As [Q-F2](../../docs/claims.md#q-f2)\nsays: untestable here, and\n"
                            "[P-F1](../../docs/claims.md#p-f1)): *hold* where tried\n")
check("a verdict after a wrapped line and a closing parenthesis", rc == 1 and "results/r1/README.md:3: P-F1 is written 'hold'" in out
      and "Q-F2" not in out, out)

# intervals: the ledger's against what claims_check prints (the same numbers, either sign)
printed = "  P-T1  a - b  +1.00 [+0.50, +1.50]  n=10\n  P-T2  -rho  +1.00 [+0.50, +1.50]\n  P-F1  +0.10 [-0.50, +0.70]\n"
found, n = ledger_links.check_intervals(ledger_links.ledger_rows(LEDGER), printed)
check("every ledger interval printed (P-T2's as its negation)", found == [] and n == 3, found)
found, n = ledger_links.check_intervals(ledger_links.ledger_rows(LEDGER.replace("+0.1 [−0.5, +0.7]", "+0.1 [−0.6, +0.7]")), printed)
check("an interval claims_check does not print", len(found) == 1 and "row P-F1: +0.1 [-0.6, +0.7]" in found[0], found)
found, n = ledger_links.check_intervals(ledger_links.ledger_rows(LEDGER.replace("−1 [−1.5, −0.5]", "+1 [+0.5, +1.5] and −1 [−1.5, −0.6]")), printed)
check("a negation matches only as a whole", len(found) == 1 and "row P-T2" in found[0], found)

# this checkout, intervals included (runs claims_check.py)
r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "ledger_links.py"), REPO, "--intervals"],
                   capture_output=True, text=True)
check("this checkout's prose agrees with its ledger", r.returncode == 0, r.stdout + r.stderr)

print(f"{failures} failed")
sys.exit(1 if failures else 0)
