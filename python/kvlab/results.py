"""kvlab's results as data: one record per (sample, branch), its identity in fields, not in paths.

A results folder (docs/results.md) holds
  predictions.jsonl.gz  one JSON object per (sample, branch): the identity fields below, then what
                        kvlab wrote for that record (output, score, entries, bytes, seconds, ...)
  rows.csv.gz           the same records in long format: the identity fields, `metric`, `value`,
                        one row per numeric field of a prediction (derived from predictions, never
                        edited by hand)
  data.jsonl.gz         the task's samples (one copy, each line carrying its task and length)
  run.json              provenance: the runs and shards that made it, kvlab's own summary tables
Both tables load in one line of pandas: pd.read_json(p, lines=True) / pd.read_csv(p), or
pd.concat(map(pd.read_csv, sorted(glob.glob(folder + "/rows*.csv.gz")))) where a table has parts:
a .gz table whose gzip would pass PART_BYTES is written as parts, predictions.1of3.jsonl.gz ...
(consecutive records, each part a whole file: a CSV part repeats the header); `table_paths` lists
them in order and refuses a set with a part missing; `load`, `read_rows` read them as one table.

The budget has one name here: `kept`, the fraction of the whole cache a branch keeps when decoding
starts (1.0 for the full cache; kvpress's "compression ratio" is 1 - kept). A budget that is not a
fraction (BUZZ's T, a fixed cache size) leaves `kept` empty and is named by `setting`.

Legacy task runs (result.json + pred/<branch>/<dataset>.jsonl, what `kvlab` task commands still write)
are read by `from_task_run`: the branch's method, parameters and setting come from result.json's
rows, the task and length from each line's gold record; no path is parsed.
"""
import csv
import glob
import gzip
import io
import json
import os
import re

# Identity of a record, in this order, in both tables.
IDENTITY = ("benchmark", "task", "length", "sample", "method", "params", "setting", "kept",
            "protocol", "preset", "decode_rule", "model", "shard")
# Fields of a prediction that are settings or text, not measurements: not rows of the long table.
NOT_METRICS = {"id", "gold", "output", "input_key", "model_key", "keep_first", "keep_last",
               "context_group", "question_index"}

PREDICTIONS, ROWS, DATA, RUN = "predictions.jsonl.gz", "rows.csv.gz", "data.jsonl.gz", "run.json"
# The gzip size a table file stays under: a larger table is split into parts, so no committed
# file passes the 2 MiB a repository host's checks warn at.
PART_BYTES = 1_500_000


class ResultsError(SystemExit):
    """A results folder or run that cannot be read; the message names the file."""


def kept_of(setting):
    """The kept fraction a branch setting states: "ratio=0.25" -> 0.25, "full" -> 1.0, else None."""
    if setting == "full":
        return 1.0
    name, _, value = (setting or "").partition("=")
    return float(value) if name == "ratio" and value else None


def branch_label(r):
    """A record's branch as kvlab's task commands name it (made from its fields, never parsed back):
    exact, or <method>_<setting without '='> (snapkv_ratio0.2, snapkv+kivi2_bytes0.25); a branch
    without eviction (setting full: exact, or the full cache quantized, kivi2) is its method alone."""
    if r["method"] == "exact" or r.get("setting") == "full":
        return r["method"]
    return f"{r['method']}_{r.get('setting', '').replace('=', '')}"


def dataset_label(r):
    """A record's dataset as kvlab's task commands name it: the task, with its length where it has one."""
    return r["task"] if r.get("length") in (None, "") else f"{r['task']}_{r['length']}"


def part_names(table, n):
    """The file names of a table written in n parts: "rows.csv.gz", 3 -> rows.1of3.csv.gz, ...; i is
    padded to n's width (01of12), so the names sort in order and `sorted(glob("rows*.csv.gz"))` reads them."""
    if n == 1:
        return [table]
    stem, ext = table.split(".", 1)
    return [f"{stem}.{i:0{len(str(n))}d}of{n}.{ext}" for i in range(1, n + 1)]


def table_paths(folder, table):
    """The files holding `table` (PREDICTIONS, ROWS, DATA) in a results folder, in order: the file
    itself, or its parts; [] when it has neither. A set with a part missing, or parts of two
    writes, is an error naming the folder and what is there."""
    single = os.path.join(folder, table)
    stem, ext = table.split(".", 1)
    pattern = re.compile(rf"{re.escape(stem)}\.(\d+)of(\d+)\.{re.escape(ext)}$")
    parts = sorted((int(m[1]), int(m[2]), p) for p in glob.glob(os.path.join(glob.escape(folder), f"{stem}.*of*.{ext}"))
                   if (m := pattern.match(os.path.basename(p))))
    if os.path.isfile(single):
        if parts:
            raise ResultsError(f"{folder}: holds both {table} and its parts ({os.path.basename(parts[0][2])}, ...); "
                               f"one write left the other: remove what is stale")
        return [single]
    if not parts:
        return []
    n = parts[0][1]
    if [(i, m) for i, m, _ in parts] != [(i, n) for i in range(1, n + 1)]:
        raise ResultsError(f"{folder}: the parts of {table} are incomplete or mixed: expected "
                           f"{', '.join(part_names(table, n))}, found {', '.join(os.path.basename(p) for *_, p in parts)}")
    return [p for *_, p in parts]


def is_results_dir(path):
    return bool(table_paths(path, PREDICTIONS))


# ---------------------------------------------------------------------------------------------
# reading

def read_jsonl_gz(path):
    """Every line of a .jsonl.gz as a dict; a truncated last line (a writer killed mid-line) ends it."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ResultsError(f"{path}: line {n} is not JSON ({e})")
    return out


def load(path):
    """Records of a results folder (all parts of its predictions), or of a legacy task run folder
    (converted in memory)."""
    if is_results_dir(path):
        return [rec for part in table_paths(path, PREDICTIONS) for rec in read_jsonl_gz(part)]
    return from_task_run(path)


def read_data(path):
    """The samples of a results folder (data.jsonl.gz, or its parts); [] when it has none."""
    return [d for part in table_paths(path, DATA) for d in read_jsonl_gz(part)]


def run_info(path):
    """run.json of a results folder, or a legacy run's result.json without its rows."""
    name = RUN if is_results_dir(path) else "result.json"
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        raise ResultsError(f"{file} is missing: expected a results folder ({PREDICTIONS}, {RUN}) or a kvlab "
                           f"task run (result.json, pred/)")
    with open(file) as f:
        info = json.load(f)
    rows = info.pop("rows", [])
    if name == "result.json":
        identify_summary_rows(info, rows)
    return info


def identify_summary_rows(info, rows):
    """kvlab's own per-task tables (result.json "ruler") name a branch by its label only: give each
    of their rows the branch's method and kept fraction, from the run's rows (which carry both)."""
    by_branch = {r["branch"]: (r["method"], kept_of(r.get("setting", ""))) for r in rows if "branch" in r}
    for row in info.get("ruler", []):
        if "branch" in row and row["branch"] in by_branch:
            row["method"], row["kept"] = by_branch[row.pop("branch")]


# ---------------------------------------------------------------------------------------------
# legacy task runs: result.json rows name each branch; lines carry their gold record

def from_task_run(run):
    """Records of a `kvlab ruler|longbench|...` run folder (result.json + pred/).

    Refuses a folder without pred/: a merged run's pred/ was never committed (its shards hold it)."""
    result_path, pred = os.path.join(run, "result.json"), os.path.join(run, "pred")
    if not os.path.isdir(pred):
        raise ResultsError(f"{pred} is missing: not a kvlab task run folder or shard, nor a results folder "
                           f"({PREDICTIONS}); a merged run's pred/ is not committed, so pass its shards instead "
                           f"({os.path.dirname(os.path.normpath(run))}/shards/shard*) or its converted results folder")
    if not os.path.isfile(result_path):
        raise ResultsError(f"{result_path} is missing: a task run folder holds result.json beside pred/")
    with open(result_path) as f:
        result = json.load(f)
    ctx = result.get("context", {})
    cfg = ctx.get("config", {})
    benchmark = cfg.get("name", "?")
    out = []
    for row in result.get("rows", []):
        path = os.path.join(pred, row["branch"], row["dataset"] + ".jsonl")
        if not os.path.isfile(path):
            continue  # a shard in progress that has not reached this branch's file yet
        ident = {
            "benchmark": benchmark,
            "method": row["method"],
            "params": row.get("params", {}),
            "setting": row.get("setting", ""),
            "kept": kept_of(row.get("setting", "")),
            "protocol": row.get("protocol", cfg.get("protocol")),
            "preset": row.get("preset", cfg.get("preset")),
            "decode_rule": row.get("decode_rule", cfg.get("decode_rule")),
            "model": ctx.get("model_id", cfg.get("model")),
            "shard": cfg.get("shard", ""),
        }
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a shard in progress writing its last line
                if not line.strip():
                    continue
                r = json.loads(line)
                # RULER and NIAH name a dataset <task>_<length> and their gold records carry both; elsewhere
                # (LongBench's gold "length" counts the record's words) the dataset is the task
                gold = r.get("gold") if isinstance(r.get("gold"), dict) else {}
                task, length = gold.get("task"), gold.get("length")
                if task is None or length is None or f"{task}_{length}" != row["dataset"]:
                    task, length = row["dataset"], None
                rec = {"benchmark": benchmark, "task": task, "length": length, "sample": str(r["id"])}
                rec.update(ident)
                for k, v in r.items():  # a field named like an identity field keeps its value as record_<name>
                    if k != "id":
                        rec[f"record_{k}" if k in IDENTITY else k] = v
                out.append(rec)
    return out


# ---------------------------------------------------------------------------------------------
# writing

def gzip_bytes(data):
    """gzip of `data` (text as UTF-8) with no timestamp or name: the same input gives the same bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="", compresslevel=9) as g:
        g.write(data.encode("utf-8") if isinstance(data, str) else data)
    return buf.getvalue()


def write_atomic(path, data):
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sort_key(rec):
    kept = rec.get("kept")
    return (rec["benchmark"], rec["task"], rec.get("length") or 0, rec["method"], -(kept if kept is not None else 2),
            rec.get("setting", ""), sample_key(rec["sample"]))


def sample_key(s):
    """A sample id's sort key: numbers in numeric order, before the other ids."""
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def predictions_lines(records):
    """One line per record (ending in a newline), identity first, keys sorted after it: a stable text."""
    lines = []
    for rec in sorted(records, key=sort_key):
        ordered = {k: rec.get(k) for k in IDENTITY}
        ordered.update({k: rec[k] for k in sorted(rec) if k not in ordered})
        lines.append(json.dumps(ordered, ensure_ascii=False, separators=(",", ":")) + "\n")
    return lines


def predictions_text(records):
    return "".join(predictions_lines(records))


def metric_items(rec):
    """(metric, value) for each numeric field of a record (booleans as 0/1), sorted by name."""
    for k in sorted(rec):
        v = rec[k]
        if k in IDENTITY or k in NOT_METRICS:
            continue
        if isinstance(v, bool):
            yield k, int(v)
        elif isinstance(v, (int, float)):
            yield k, v


def _csv_line(row):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(row)
    return buf.getvalue()


ROWS_HEADER = _csv_line(IDENTITY + ("metric", "value"))


def rows_lines(records):
    """The long table's lines after its header: IDENTITY columns, then metric, value (params as
    compact JSON)."""
    lines = []
    for rec in sorted(records, key=sort_key):
        ident = [json.dumps(rec.get(k), separators=(",", ":"), sort_keys=True) if k == "params"
                 else ("" if rec.get(k) is None else rec.get(k)) for k in IDENTITY]
        for metric, value in metric_items(rec):
            lines.append(_csv_line(ident + [metric, repr(float(value)) if isinstance(value, float) else value]))
    return lines


def rows_text(records):
    return ROWS_HEADER + "".join(rows_lines(records))


def gzip_parts(lines, header="", limit=None):
    """The gzip files of one table: the fewest equal runs of consecutive lines (each part opening
    with `header`) whose every gzip is at most `limit` bytes (PART_BYTES); one part when it fits.
    The same lines give the same parts."""
    limit = limit or PART_BYTES
    n = 1
    while True:
        size = -(-len(lines) // n) if lines else 0
        blobs = [gzip_bytes(header + "".join(lines[i:i + size])) for i in range(0, len(lines), size or 1)] or \
                [gzip_bytes(header)]
        largest = max(len(b) for b in blobs)
        if largest <= limit or size <= 1:
            return blobs
        n = max(n + 1, -(-n * largest // limit))


def write_table(out, table, blobs):
    """Writes a table's parts (gzip_parts) under their names, then removes the files of an earlier
    write of the same table under other names (a single file now split, or parts of another count)."""
    names = part_names(table, len(blobs))
    for name, blob in zip(names, blobs):
        write_atomic(os.path.join(out, name), blob)
    stem, ext = table.split(".", 1)
    for old in [os.path.join(out, table)] + glob.glob(os.path.join(glob.escape(out), f"{stem}.*of*.{ext}")):
        if os.path.basename(old) not in names and os.path.isfile(old):
            os.remove(old)


def check_unique(records, where):
    """A (benchmark, task, length, sample, method, setting, params) given twice is an error."""
    seen = {}
    for rec in records:
        key = (rec["benchmark"], rec["task"], rec.get("length"), rec["sample"], rec["method"], rec.get("setting"),
               json.dumps(rec.get("params"), sort_keys=True))
        if key in seen and seen[key] != rec:
            raise ResultsError(f"{where}: sample {rec['sample']} of {rec['method']} ({rec.get('setting')}) "
                               f"{rec['task']} {rec.get('length')} appears twice with different values")
        seen[key] = rec
    return list(seen.values())


def write_results(out, records, data=None, run=None):
    """Writes a results folder (see the module's docstring); each file atomically."""
    os.makedirs(out, exist_ok=True)
    records = check_unique(records, out)
    write_table(out, PREDICTIONS, gzip_parts(predictions_lines(records)))
    write_table(out, ROWS, gzip_parts(rows_lines(records), ROWS_HEADER))
    if data is not None:
        write_table(out, DATA, gzip_parts(data_lines(data)))
    if run is not None:
        write_atomic(os.path.join(out, RUN), (json.dumps(run, indent=1, sort_keys=True) + "\n").encode())


def data_lines(data):
    return [json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n" for d in data]


def read_rows(path):
    """The long table of a results folder (all its parts) as a list of dicts (value as float)."""
    rows = []
    for part in table_paths(path, ROWS):
        with gzip.open(part, "rt", encoding="utf-8", newline="") as f:
            rows += list(csv.DictReader(f))
    for r in rows:
        r["value"] = float(r["value"])
    return rows

