#!/usr/bin/env python3
"""Checks the shards of a task run before they are committed mid-way (killed workers, issue 23).

  scripts/check_shards.py SHARD_DIR [SHARD_DIR ...]

For each shard folder (results/<step>/shards/shard<i>): every prediction line parses as JSON with
an "id", and every branch folder of pred/ holds the same sample ids in every dataset file, so no
sample was left half written (a sample's lines go to every branch; a worker killed between two
branches leaves some branches one line ahead, and the resume would then redo that sample: its
committed lines are fine, but this says so). Prints, per shard, the samples done per dataset and
in all; exits 1 naming the file and line when a line is broken, 2 when branches disagree.
"""
import glob
import json
import os
import sys
from collections import defaultdict


def check(shard):
    ids = defaultdict(dict)  # dataset -> branch -> [ids]
    for path in sorted(glob.glob(os.path.join(shard, "pred", "*", "*.jsonl"))):
        branch = os.path.basename(os.path.dirname(path))
        dataset = os.path.basename(path)[: -len(".jsonl")]
        got = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    got.append(json.loads(line)["id"])
                except (ValueError, KeyError) as e:
                    print(f"check_shards: {path}:{n}: not a prediction line ({e}); {shard} not checked further",
                          file=sys.stderr)
                    return 1, None
        ids[dataset][branch] = got
    bad = 0
    done = 0
    branches = sorted({b for per in ids.values() for b in per})
    for dataset in sorted(ids):
        per = ids[dataset]
        sets = {b: sorted(per.get(b, [])) for b in branches}
        common = set.intersection(*(set(v) for v in sets.values()))
        counts = sorted({len(v) for v in sets.values()})
        if len(counts) > 1 or counts[0] != len(common):
            bad = 2
            short = sorted(b for b, v in sets.items() if len(v) == counts[0])
            print(f"check_shards: {shard}: {dataset}: the branches hold {counts[0]} to {counts[-1]} samples "
                  f"({len(common)} in all of them; fewest: {', '.join(short[:3])}{' ...' if len(short) > 3 else ''}): "
                  f"a sample half written", file=sys.stderr)
        done += len(common)
    print(f"{shard}: {done} samples complete over {len(ids)} datasets, {len(branches)} branches")
    return bad, done


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    worst, total = 0, 0
    for shard in sys.argv[1:]:
        if not os.path.isdir(os.path.join(shard, "pred")):
            sys.exit(f"check_shards: {shard}: no pred/ folder")
        status, done = check(shard)
        worst = max(worst, status)
        total = None if done is None or total is None else total + done
    if total is not None:
        print(f"{total} samples complete in {len(sys.argv) - 1} shard(s)")
    sys.exit(worst)


if __name__ == "__main__":
    main()
