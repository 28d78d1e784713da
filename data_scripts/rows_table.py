#!/usr/bin/env python3
"""A markdown table of the rows of a kvlab result.json (kvlab ppl, kvlab bench generate, kvlab sweep, ...).

Usage: data_scripts/rows_table.py RESULT_JSON_OR_RUN_DIR --columns method,cache_size,ppl [--digits 4]
       [--pivot ROW_KEY,COL_KEY,VALUE]   e.g. --pivot method,cache_size,ppl (BUZZ Table 3's layout)

Numbers are printed with --digits significant digits. Standard library only.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import compare_rows  # noqa: E402  (load_rows)


def load_rows(path):
    if os.path.isdir(path):
        path = os.path.join(path, "result.json")
    if not os.path.isfile(path):
        sys.exit(f"rows_table: no result.json at {path}")
    return compare_rows.load_rows(path)  # inline, or the rows file it names (kvlab sweep)


def fmt(v, digits):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--columns", default="")
    ap.add_argument("--pivot", default="")
    ap.add_argument("--digits", type=int, default=4)
    a = ap.parse_args()
    rows = load_rows(a.result)
    if a.pivot:
        rk, ck, vk = a.pivot.split(",")
        cols = []
        for r in rows:
            if r[ck] not in cols:
                cols.append(r[ck])
        table = {}
        for r in rows:
            table.setdefault(r[rk], {})[r[ck]] = r[vk]
        print("| " + rk + " | " + " | ".join(f"{ck} {c}" for c in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for name, vals in table.items():
            print(f"| {name} | " + " | ".join(fmt(vals.get(c, ""), a.digits) for c in cols) + " |")
        return
    cols = a.columns.split(",")
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c, ""), a.digits) for c in cols) + " |")


if __name__ == "__main__":
    main()
