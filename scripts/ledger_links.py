#!/usr/bin/env python3
"""The prose agrees with the claims ledger (issue 48: "README and every results README agree with it").

docs/claims.md's ledger is the one place a verdict is decided; README.md, docs/*.md and
results/*/README.md link to its rows. This checks, in every such file:
  - each link to docs/claims.md#<anchor> names a row that exists, and a link whose text is a row id
    (e.g. [BUZZ-T2a](...#buzz-t2a)) points at that row;
  - a verdict written right after a link, or after a list of links ("[A](..), [B](..): *fail*",
    "[C](..): not separated"), is each linked row's verdict (holds, fails, not separated,
    untestable; "hold"/"fail" as plurals);
  - the counts of verdicts (README's "five *hold* (CHL-F8, ...)", the ledger's own "Verdicts: holds 5
    (...)") equal the ledger's, and the ids listed with a count are the rows with that verdict.
  - with --intervals, every "effect [low, high]" in a ledger row's effect cell is one that
    scripts/claims_check.py prints (or its negation: "-rho" printed, "rho" written), so no interval
    in the ledger is copied by hand or left behind by a rerun.
Prints each disagreement as file:line and exits 1 when there is one.

  python3 scripts/ledger_links.py [REPO] [--intervals]      # default: this checkout
"""
import os
import re
import subprocess
import sys

VERDICTS = ("holds", "fails", "not separated", "untestable")
NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}

WRAP = re.compile(r"\s*\n\s*")  # a line break and the indentation around it, read as one space
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]*?)claims\.md#([a-z0-9-]+)\)")
# a run of links joined by ", " / " and " / ", and " / ", " then ": verdict"
GROUP = re.compile(r"(?:\[[^\]]+\]\([^)\s]*?claims\.md#[a-z0-9-]+\)\)?(?:,\s+(?:and\s+)?|\s+and\s+)?)+"
                   r":\s+\*?(holds?|fails?|not separated|untestable)\b")


def flatten(text):
    """The text with every line break (and the indentation around it) as one space: a list of links,
    or a count with its ids, may wrap."""
    return WRAP.sub(" ", text)


def canonical(word):
    """'hold' -> 'holds', 'fail' -> 'fails'; the others as they are."""
    return {"hold": "holds", "fail": "fails"}.get(word, word)


def heading_anchors(text):
    """GitHub's anchors of the ledger's headings (lower case, punctuation dropped, spaces as hyphens)."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


def ledger_rows(text):
    """{anchor: (id, verdict, effect cell)} from the ledger's table rows:
    `| <a id="x"></a>ID | paper | table | claim | test | model | n | effect | MDE | verdict (...) | note |`."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r'\|\s*<a id="([a-z0-9-]+)"></a>([^|]+?)\s*\|', line)
        if not m:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        verdict = next((v for v in VERDICTS if cells[-2].startswith(v)), None)
        if verdict is None:
            raise SystemExit(f"ledger_links: row {m.group(2)}: verdict cell '{cells[-2][:40]}' starts with none of {VERDICTS}")
        rows[m.group(1)] = (m.group(2), verdict, cells[7])
    return rows


def check_links(path, text, rows, headings):
    """Problems with the links in one file and the verdicts written right after them; the number of
    verdicts read."""
    out, read = [], 0
    lineno = lambda pos: text.count("\n", 0, pos) + 1
    for m in LINK.finditer(text):
        label, anchor = m.group(1), m.group(3)
        if anchor not in rows and anchor not in headings:
            out.append(f"{path}:{lineno(m.start())}: link to claims.md#{anchor}: no such row")
        elif re.fullmatch(r"[A-Z]+-[A-Za-z0-9/]+", label) and label != rows[anchor][0]:
            out.append(f"{path}:{lineno(m.start())}: link text {label} points at row {rows[anchor][0]}")
    for g in GROUP.finditer(flatten(text)):  # positions in the flattened text
        said = canonical(g.group(1))
        line = lineno(_unflatten(text, g.start()))
        for m in LINK.finditer(g.group(0)):
            anchor = m.group(3)
            read += anchor in rows
            if anchor in rows and rows[anchor][1] != said:
                out.append(f"{path}:{line}: {rows[anchor][0]} is written '{g.group(1)}', the ledger says '{rows[anchor][1]}'")
    return out, read


def _unflatten(text, flat_pos):
    """The position in `text` of position `flat_pos` of flatten(text)."""
    pos = flat = 0
    for m in WRAP.finditer(text):
        if flat + (m.start() - pos) >= flat_pos:
            break
        flat += m.start() - pos + 1
        pos = m.end()
    return pos + (flat_pos - flat)


def check_counts(path, text, rows):
    """README's "five *hold* (A, B), six *fail* (...)" and the ledger's "Verdicts: holds 5 (...)"."""
    out = []
    by_verdict = {v: sorted(r[0] for r in rows.values() if r[1] == v) for v in VERDICTS}
    flat = flatten(text)
    patterns = [  # README: number word, *verdict*, optional (ids); ledger: verdict, digits, optional (ids)
        re.compile(r"\b(" + "|".join(NUMBERS) + r"|\d+) \*(hold|fail|not separated|untestable)\*(?: \(([^()]*)\))?"),
        re.compile(r"\b(holds|fails|not separated|untestable) (\d+)(?: \(((?:[^()]|\([^()]*\))*)\))?"),
    ]
    for k, pat in enumerate(patterns):
        for m in pat.finditer(flat):
            if k == 0:
                n, verdict, ids = m.group(1), canonical(m.group(2)), m.group(3)
            else:
                verdict, n, ids = m.group(1), m.group(2), m.group(3)
                if not flat[:m.start()].rstrip().endswith(("Verdicts:", ",")):
                    continue
            n = NUMBERS.get(n, None) if not n.isdigit() else int(n)
            want = by_verdict[verdict]
            if n != len(want):
                out.append(f"{path}: '{m.group(0)[:60]}': {n} rows, the ledger has {len(want)} {verdict}")
            if ids:
                named = sorted(i for i in {r[0] for r in rows.values()}
                               if re.search(r"(?<![\w-])" + re.escape(i) + r"(?![\w/-])", ids))
                if named and named != want:
                    out.append(f"{path}: '{m.group(0)[:40]}…' names {named}, the ledger's {verdict} rows are {want}")
    return out


NUM = r"([+-]?\d+(?:\.\d+)?)"
INTERVAL = re.compile(NUM + r" \[" + NUM + ", " + NUM + r"\]")


def check_intervals(rows, printed):
    """Intervals in the rows' effect cells that claims_check's output `printed` lacks, in either sign;
    and how many were read."""
    minus = lambda t: t.replace("\u2212", "-")
    have = {tuple(float(v) for v in m.groups()) for m in INTERVAL.finditer(minus(printed))}
    out, read = [], 0
    for row_id, _, effect in rows.values():
        for m in INTERVAL.finditer(minus(effect)):
            read += 1
            e, lo, hi = (float(v) for v in m.groups())
            if (e, lo, hi) not in have and (-e, -hi, -lo) not in have:
                out.append(f"docs/claims.md: row {row_id}: {m.group(0)} is not in claims_check.py's output")
    return out, read


def files(repo):
    yield "README.md"
    for name in sorted(os.listdir(os.path.join(repo, "docs"))):
        if name.endswith(".md"):
            yield os.path.join("docs", name)
    for name in sorted(os.listdir(os.path.join(repo, "results"))):
        p = os.path.join("results", name, "README.md")
        if os.path.isfile(os.path.join(repo, p)):
            yield p
    yield os.path.join("results", "README.md")


def main(argv):
    args = [a for a in argv[1:] if a != "--intervals"]
    repo = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ledger = open(os.path.join(repo, "docs", "claims.md"), encoding="utf-8").read()
    rows, headings = ledger_rows(ledger), heading_anchors(ledger)
    problems, links, read = [], 0, 0
    for rel in files(repo):
        text = open(os.path.join(repo, rel), encoding="utf-8").read()
        links += len(LINK.findall(text))
        found, n = check_links(rel, text, rows, headings)
        problems += found
        read += n
        if rel in ("README.md", os.path.join("docs", "claims.md")):
            problems += check_counts(rel, text, rows)
    if "--intervals" in argv:
        r = subprocess.run([sys.executable, os.path.join(repo, "scripts", "claims_check.py")],
                           capture_output=True, text=True, cwd=repo)
        if r.returncode != 0:
            problems.append(f"scripts/claims_check.py failed: {r.stderr.strip()[-300:]}")
        found, n = check_intervals(rows, r.stdout)
        problems += found
        print(f"ledger_links: {n} intervals in the ledger's effect cells checked against claims_check.py's output")
    for p in problems:
        print(p)
    print(f"ledger_links: {len(rows)} rows, {links} links, {read} verdicts written after a link, "
          f"{len(problems)} disagreement(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
