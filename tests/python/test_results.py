#!/usr/bin/env python3
"""Results as data (docs/results.md, python/kvlab/results.py), a ctest (`results`):

1. every committed results folder is what its writer would write: rows.csv.gz is exactly the long
   table derived from predictions.jsonl.gz, both byte-identical to a fresh write (sorted, no
   timestamp), and no identity repeats;
2. committed tables are rebuilt from committed data: `scripts/ruler_table.py results/ruler_context`
   prints exactly tests/fixtures/tables/ruler_context.md, which the pre-conversion script
   (1fb1bf58) printed from the step's legacy shards, and `scripts/task_table.py
   results/longbench_context` the LongBench table the same script printed from the merged run;
3. the writer on hand-made records: a round trip, a repeated identity with other values refused, a
   truncated last line (a killed writer) read up to it, a legacy run folder read without parsing
   its paths (a branch folder named against its rows does not change the method).

  tests/python/test_results.py [repo root]
"""
import glob
import gzip
import json
import os
import sys
import tempfile

from script_check import expect, script_runner  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import results  # noqa: E402

passed = 0


def check(cond, what, out=""):
    global passed
    expect(cond, what, out)
    passed += 1


def file_bytes(folder, table):
    out = []
    for p in results.table_paths(folder, table):
        with open(p, "rb") as f:
            out.append(f.read())
    return out


# 1. committed folders
# a step's folder, or one run of a step whose runs re-ran each other's branches (results/niah_leaderboard_*/<run>)
folders = sorted(p for pattern in (("*",), ("*", "*"))
                 for p in glob.glob(os.path.join(ROOT, "results", *pattern)) if results.is_results_dir(p))
check(len(folders) >= 3, f"at least the three converted RULER steps are results folders (found {len(folders)})")
for folder in folders:
    name = os.path.relpath(folder, ROOT)
    records = results.load(folder)
    check(len(results.check_unique(records, name)) == len(records), f"{name}: no identity repeats")
    check(file_bytes(folder, results.PREDICTIONS) == results.gzip_parts(results.predictions_lines(records)),
          f"{name}: predictions.jsonl.gz (or its parts) is byte-identical to a fresh write of its records")
    check(file_bytes(folder, results.ROWS) == results.gzip_parts(results.rows_lines(records), results.ROWS_HEADER),
          f"{name}: rows.csv.gz (or its parts) is byte for byte the long table of its predictions")
    sizes = {os.path.basename(p): os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*"))}
    check(max(sizes.values()) <= 2 << 20, f"{name}: no file over 2 MiB", str(sizes))
    info = results.run_info(folder)
    check(info.get("format") == 1 and info.get("converted_from"), f"{name}: run.json says its format and sources")

# 2. a committed table rebuilt
run = script_runner(ROOT, "ruler_table.py")
rc, out = run(os.path.join(ROOT, "results", "ruler_context"))
with open(os.path.join(ROOT, "tests", "fixtures", "tables", "ruler_context.md"), encoding="utf-8") as f:
    want = f.read()
check(rc == 0 and out == want, "ruler_table.py on results/ruler_context prints the table the legacy shards gave", out)

# ... and a LongBench table (the first line names the folder read; the rest must match)
run = script_runner(ROOT, "task_table.py")
rc, out = run(os.path.join(ROOT, "results", "longbench_context"), "--dataset", "multi_news", "--by", "score")
with open(os.path.join(ROOT, "tests", "fixtures", "tables", "longbench_context_multi_news.md"), encoding="utf-8") as f:
    want = f.read()
check(rc == 0 and out.split("\n", 1)[1] == want.split("\n", 1)[1],
      "task_table.py on results/longbench_context prints the table the merged run gave", out)
# LongBench's own "length" (words) is kept as record_length; the export gives eval.py its fields back
recs = results.load(os.path.join(ROOT, "results", "longbench_context"))
check(all(r["length"] is None and isinstance(r.get("record_length"), int) for r in recs),
      "LongBench records: no task length, the record's word count as record_length")

# 3. the writer
with tempfile.TemporaryDirectory() as d:
    base = {"benchmark": "ruler", "task": "vt", "length": 1024, "method": "snapkv", "params": {"window": 32},
            "setting": "ratio=0.5", "kept": 0.5, "protocol": "context", "preset": "paper", "decode_rule": "prefill",
            "model": "m", "shard": ""}
    recs = [dict(base, sample=str(i), score=i % 2, output=f"o{i}", entries_start=100 + i, same_as_exact=True)
            for i in (10, 2, 1)]
    out_dir = os.path.join(d, "r")
    results.write_results(out_dir, recs)
    back = results.load(out_dir)
    check([r["sample"] for r in back] == ["1", "2", "10"], "records sorted by sample id as numbers",
          str([r["sample"] for r in back]))
    check(back[0] == recs[2], "a record round-trips unchanged", f"{back[0]} vs {recs[2]}")
    rows = results.read_rows(out_dir)
    check(len(rows) == 9 and {r["metric"] for r in rows} == {"score", "entries_start", "same_as_exact"},
          "three numeric fields a record -> three rows each (text fields are not metrics)", str(rows[:3]))
    check(json.loads(rows[0]["params"]) == {"window": 32} and rows[0]["kept"] == "0.5", "identity columns in rows")
    try:
        results.write_results(os.path.join(d, "dup"), recs + [dict(recs[0], score=0.25)])
        check(False, "a repeated identity with other values is refused")
    except results.ResultsError as e:
        check("appears twice" in str(e), "a repeated identity with other values is refused, naming it", str(e))
    # a writer killed mid-line: the reader stops before the broken line
    raw = results.predictions_text(recs)
    with gzip.open(os.path.join(out_dir, results.PREDICTIONS), "wt", encoding="utf-8") as f:
        f.write(raw[: raw.rindex("\n", 0, len(raw) - 1) + 20])
    check(len(results.load(out_dir)) == 2, "a truncated last line is not read")
    # a legacy run: method and kept from result.json's rows, task and length from the gold record
    legacy = os.path.join(d, "legacy")
    os.makedirs(os.path.join(legacy, "pred", "not_a_method_name"))
    with open(os.path.join(legacy, "result.json"), "w") as f:
        json.dump({"context": {"model_id": "m", "config": {"name": "ruler", "protocol": "whole", "shard": "1/8"}},
                   "rows": [{"branch": "not_a_method_name", "dataset": "cwe_2048", "method": "knorm",
                             "params": {}, "setting": "ratio=0.25", "preset": "paper", "protocol": "whole"}]}, f)
    with open(os.path.join(legacy, "pred", "not_a_method_name", "cwe_2048.jsonl"), "w") as f:
        f.write(json.dumps({"id": "7", "score": 1.0, "gold": {"task": "cwe", "length": 2048}}) + "\n")
    # a table larger than PART_BYTES is written in parts, read back as one; a later write that fits
    # leaves one file again; a missing part is refused by name
    many = [dict(base, sample=str(i), score=i % 3 / 2, output=f"out {i * 7919 % 1000}", entries_start=100 + i)
            for i in range(400)]
    parted = os.path.join(d, "parted")
    saved, results.PART_BYTES = results.PART_BYTES, 1500
    try:
        results.write_results(parted, many, data=[{"id": str(i), "text": f"sample {i}"} for i in range(400)])
    finally:
        results.PART_BYTES = saved
    preds, rows_parts = results.table_paths(parted, results.PREDICTIONS), results.table_paths(parted, results.ROWS)
    check(len(preds) > 2 and len(rows_parts) > 2 and all(os.path.getsize(p) <= 1500 for p in preds + rows_parts),
          "a large table is split into parts under the limit", str([os.path.basename(p) for p in preds + rows_parts]))
    check(os.path.basename(preds[0]) == f"predictions.1of{len(preds)}.jsonl.gz" and not
          os.path.exists(os.path.join(parted, results.PREDICTIONS)), "parts are named i of n", str(preds))
    check(results.load(parted) == sorted(many, key=results.sort_key), "the parts read back as the whole table, in order")
    check(len(results.read_rows(parted)) == 2 * len(many) and len(results.read_data(parted)) == 400,
          "rows and data read across their parts (each CSV part repeats the header)")
    os.remove(preds[1])
    try:
        results.load(parted)
        check(False, "a missing part is refused")
    except results.ResultsError as e:
        check(os.path.basename(preds[1]) in str(e) and "incomplete" in str(e), "a missing part is refused, naming it", str(e))
    results.write_results(parted, many)
    check(results.table_paths(parted, results.PREDICTIONS) == [os.path.join(parted, results.PREDICTIONS)] and
          len(glob.glob(os.path.join(parted, "*of*"))) == len(results.table_paths(parted, results.DATA)),
          "a write that fits in one file removes the parts of the earlier write", str(os.listdir(parted)))
    (r,) = results.load(legacy)
    check((r["method"], r["kept"], r["task"], r["length"], r["sample"], r["shard"]) == ("knorm", 0.25, "cwe", 2048, "7", "1/8"),
          "a legacy run's identity comes from its rows and gold records, not its paths", str(r))

print(f"{passed} passed, 0 failed")
