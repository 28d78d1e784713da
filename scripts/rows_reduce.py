#!/usr/bin/env python3
"""A run's rows averaged within units: the small table a verdict reads, committed where the rows
themselves are too many (replay's rows.jsonl is git-ignored).

  scripts/rows_reduce.py RUN --keys sample,layer,method,setting --metric rel_err --out FILE.csv.gz

RUN: a run folder or its result.json (rows inline or in the rows file it names). Rows with equal
--keys are averaged (every other field, e.g. seed and head, is averaged over); `setting` is the row's
budget as kvlab's tables label it (T=2, ratio=0.2, ...). Writes one CSV row per unit: the keys, the
mean of each --metric and the number of rows averaged, sorted by the keys; gzip with no timestamp, so
the same rows give the same bytes.
"""
import argparse
import csv
import gzip
import io
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_rows  # noqa: E402
from contrasts import _setting  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--keys", required=True, help="row fields a unit is keyed on; 'setting' = the budget's label")
    ap.add_argument("--metric", default="rel_err", help="comma-separated row fields averaged (default rel_err)")
    ap.add_argument("--out", required=True, help="the CSV to write (.csv.gz: gzip)")
    a = ap.parse_args()
    path = os.path.join(a.run, "result.json") if os.path.isdir(a.run) else a.run
    if not os.path.isfile(path):
        sys.exit(f"rows_reduce: no result.json at {path}")
    keys, metrics = a.keys.split(","), a.metric.split(",")
    sums = defaultdict(lambda: [0.0] * (len(metrics) + 1))
    for r in compare_rows.load_rows(path):
        row = dict(r, setting=_setting(r))
        missing = [k for k in keys + metrics if k not in row]
        if missing:
            sys.exit(f"rows_reduce: {path}: a {r.get('method')} row has no {', '.join(missing)} (--keys / --metric)")
        acc = sums[tuple(row[k] for k in keys)]
        for i, m in enumerate(metrics):
            acc[i] += float(row[m])
        acc[-1] += 1
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    w.writerow(keys + metrics + ["n_rows"])
    for k in sorted(sums, key=lambda t: tuple((isinstance(x, str), x) for x in t)):
        acc = sums[k]
        w.writerow(list(k) + [f"{v / acc[-1]:.9g}" for v in acc[:-1]] + [int(acc[-1])])
    data = text.getvalue().encode()
    if a.out.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, a.out)
    print(f"rows_reduce: {len(sums)} units -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
