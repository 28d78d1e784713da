#!/usr/bin/env python3
"""Converts kvlab task runs (result.json + pred/<branch>/<dataset>.jsonl + data/) into one results
folder (docs/results.md): predictions.jsonl.gz, rows.csv.gz, data.jsonl.gz, run.json.

  scripts/results_convert.py --out DIR [--merged RUN] RUN [RUN ...]

RUN: the shards of one step (or one run). Their records are pooled; a record given twice must be
identical. --merged: the step's merged run (result.json, no pred/), whose context (the shards'
provenance under merged_from) and kvlab's own per-task table become run.json; without it, run.json
holds each RUN's context. data/: every RUN's data/<dataset>.jsonl must be identical (the shards of
a step generate the same samples); one copy is kept, each line with its dataset's name.
--out may be the step's own folder (beside its README and shards); converting a step again as it
progresses adds records, and a folder holding a record the runs do not give again is refused, so
nothing converted before is lost.
"""
import argparse
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402


def read_data(runs):
    """{dataset: text} of data/*.jsonl, identical across the runs (else an error naming both files)."""
    data, where = {}, {}
    for run in runs:
        for path in sorted(glob.glob(os.path.join(run, "data", "*.jsonl"))):
            name = os.path.basename(path)[: -len(".jsonl")]
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if name in data and data[name] != text:
                sys.exit(f"results_convert: {path} differs from {where[name]}: the runs hold other samples")
            data.setdefault(name, text)
            where.setdefault(name, path)
    out = []
    for name in sorted(data):
        for line in data[name].splitlines():
            if line.strip():
                d = json.loads(line)
                out.append({"dataset": name, **d})
    return out


def head_commit():
    """The repository's commit when converting: where the converted folders can still be found."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="task run folders (shards of one step)")
    ap.add_argument("--out", required=True, help="the results folder to write")
    ap.add_argument("--merged", help="the step's merged run folder (its result.json)")
    args = ap.parse_args()
    records = []
    for run in args.runs:
        records += results.from_task_run(run)
    if results.is_results_dir(args.out):  # a step converted before (in progress): only more records, none changed
        new = set(results.predictions_text(results.check_unique(records, args.out)).splitlines())
        lost = [line for line in results.predictions_text(results.load(args.out)).splitlines() if line not in new]
        if lost:
            sys.exit(f"results_convert: --out {args.out} holds {len(lost)} records these runs do not give again "
                     f"(e.g. {lost[0][:160]}...): not writing over them; choose another folder")
    run = {"format": 1, "converted_from": [os.path.normpath(r) for r in args.runs], "converted_at_commit": head_commit()}
    if args.merged:
        run.update(results.run_info(args.merged))
        run["merged_run"] = os.path.normpath(args.merged)
    else:
        run["runs"] = [results.run_info(r) for r in args.runs]
    data = read_data(args.runs)
    results.write_results(args.out, records, data=data or None, run=run)
    print(f"results_convert: {len(records)} records from {len(args.runs)} runs, {len(data)} samples -> {args.out}")


if __name__ == "__main__":
    main()
