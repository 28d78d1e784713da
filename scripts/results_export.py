#!/usr/bin/env python3
"""Exports a results folder (docs/results.md) in the layout of kvlab's task runs, for tools that read
it: LongBench's eval.py reads pred/<branch>/<dataset>.jsonl (its "pred", "answers", "all_classes",
"length"), `kvlab ruler eval` and `kvlab merge` read the same layout.

  scripts/results_export.py FOLDER --out DIR

Writes DIR/pred/<branch>/<dataset>.jsonl, one line per record as kvlab wrote it (the sample as "id",
fields stored as record_<name> under their own name again, the identity fields left out), with
branch = exact or <method>_<setting without '='> and dataset = <task> or <task>_<length>, the names
kvlab's task commands give them. Refuses a DIR that already holds pred/.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402


def as_written(r):
    """The record as kvlab's prediction line: id first, then the other fields, identity left out."""
    line = {"id": r["sample"]}
    for k in sorted(r):
        if k in results.IDENTITY:
            continue
        name = k[len("record_"):] if k.startswith("record_") and k[len("record_"):] in results.IDENTITY else k
        line[name] = r[k]
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="a results folder")
    ap.add_argument("--out", required=True, help="where pred/ is written")
    args = ap.parse_args()
    if not results.is_results_dir(args.folder):
        sys.exit(f"results_export: {args.folder} is not a results folder (no {results.PREDICTIONS})")
    if os.path.exists(os.path.join(args.out, "pred")):
        sys.exit(f"results_export: --out {args.out} already holds pred/: refusing to write over it")
    files = {}
    for r in results.load(args.folder):
        files.setdefault((results.branch_label(r), results.dataset_label(r)), []).append(as_written(r))
    for (branch, dataset), lines in sorted(files.items()):
        os.makedirs(os.path.join(args.out, "pred", branch), exist_ok=True)
        text = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines)
        results.write_atomic(os.path.join(args.out, "pred", branch, dataset + ".jsonl"), text.encode("utf-8"))
    print(f"results_export: {sum(len(v) for v in files.values())} records in {len(files)} files -> {args.out}/pred")


if __name__ == "__main__":
    main()
