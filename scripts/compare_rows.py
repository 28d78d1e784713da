#!/usr/bin/env python3
"""Compares the rows of two replay results bitwise, timing fields aside.

  scripts/compare_rows.py A/result.json B/result.json [--ignore compress_ms,...]

Rows come from result.json's "rows", or from the rows.jsonl it names ("rows_file"). Every row must
be equal as JSON (numbers compared exactly, as written) except the ignored fields. Used to show a
refactor changes no result: run the same config with the old and the new binary and compare.
Exit 0 when identical, 1 otherwise (the first differences are printed).
"""
import argparse
import json
import os
import sys


def load_rows(path):
    """The rows of a result.json: inline, or in the rows_file it names (n_rows of them)."""
    with open(path) as f:
        result = json.load(f)
    if not result.get("rows_file"):
        return result["rows"]
    rows_path = os.path.join(os.path.dirname(path), result["rows_file"])
    if not os.path.isfile(rows_path):
        sys.exit(f"{path} names its rows file {rows_path}, which is missing (replay's rows.jsonl is git-ignored)")
    with open(rows_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != result["n_rows"]:
        sys.exit(f"{rows_path}: holds {len(rows)} rows but {path} says {result['n_rows']}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--ignore", default="compress_ms", help="comma-separated fields not compared")
    args = ap.parse_args()
    ignore = set(filter(None, args.ignore.split(",")))
    ra, rb = load_rows(args.a), load_rows(args.b)
    strip = lambda r: {k: v for k, v in r.items() if k not in ignore}
    diffs = []
    if len(ra) != len(rb):
        diffs.append(f"row counts differ: {len(ra)} vs {len(rb)}")
    for i, (x, y) in enumerate(zip(ra, rb)):
        x, y = strip(x), strip(y)
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            diffs.append(f"row {i} ({x.get('method')}, layer {x.get('layer')}, head {x.get('head')}): "
                         + ", ".join(f"{k}: {x.get(k)!r} vs {y.get(k)!r}" for k in keys))
    if diffs:
        print(f"DIFFERENT: {len(diffs)} difference(s)")
        for d in diffs[:20]:
            print("  " + d)
        return 1
    print(f"identical: {len(ra)} rows (ignoring {', '.join(sorted(ignore)) or 'nothing'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
