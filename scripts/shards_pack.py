#!/usr/bin/env python3
"""A step's shards in progress as one committed file, so that a long run resumes on another machine
without committing thousands of prediction files (docs/results.md, "Runs in progress").

  scripts/shards_pack.py pack STEP_DIR      # STEP_DIR/shards/ -> STEP_DIR/shards.tar.gz
  scripts/shards_pack.py unpack STEP_DIR    # STEP_DIR/shards.tar.gz -> STEP_DIR/shards/ (what is missing)

pack: every file under STEP_DIR/shards/ (a shard's config.json, result.json, data/, pred/), sorted,
with fixed owners and times and gzip without a timestamp, so the same shards give the same bytes; a
prediction file's unfinished last line (a worker writing) is left out. Written atomically.
unpack: writes the files the folder does not have; a file it has is kept when the archive's is a
prefix of it (the run went on here) and refused otherwise (naming it), so nothing written is lost.
"""
import argparse
import io
import os
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402

ARCHIVE = "shards.tar.gz"


def complete_lines(data, name):
    """A .jsonl file up to its last newline (a worker may be writing its last line)."""
    if name.endswith(".jsonl") and data and not data.endswith(b"\n"):
        return data[: data.rfind(b"\n") + 1]
    return data


def pack(step):
    root = os.path.join(step, "shards")
    if not os.path.isdir(root):
        sys.exit(f"shards_pack: {root} is missing: nothing to pack")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        n = 0
        for dirpath, dirnames, filenames in sorted(os.walk(root)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".partial") or name == ".kvlab.lock":
                    continue
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    data = complete_lines(f.read(), name)
                info = tarfile.TarInfo(os.path.relpath(path, step))
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
                n += 1
    out, packed = os.path.join(step, ARCHIVE), results.gzip_bytes(buf.getvalue())
    results.write_atomic(out, packed)
    print(f"shards_pack: {n} files -> {out} ({len(packed) / 1e6:.1f} MB)")


def unpack(step):
    archive = os.path.join(step, ARCHIVE)
    if not os.path.isfile(archive):
        sys.exit(f"shards_pack: {archive} is missing: nothing to unpack")
    written = kept = 0
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar.getmembers():
            if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/") or not m.name.startswith("shards/"):
                sys.exit(f"shards_pack: {archive}: unexpected member {m.name!r}")
            data = tar.extractfile(m).read()
            path = os.path.join(step, m.name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    here = f.read()
                if not here.startswith(data) and not (m.name.endswith(".json") and here == data):
                    if m.name.endswith("result.json") or m.name.endswith("config.json"):
                        kept += 1  # rewritten by every run of the shard: the folder's own is the newer
                        continue
                    sys.exit(f"shards_pack: {path} differs from the archive's and is not a continuation of it: "
                             f"not unpacking over it (move it away or remove it first)")
                kept += 1
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            results.write_atomic(path, data)
            written += 1
    print(f"shards_pack: {written} files written, {kept} already here -> {os.path.join(step, 'shards')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["pack", "unpack"])
    ap.add_argument("step", help="a step's folder, results/<step name>")
    args = ap.parse_args()
    (pack if args.action == "pack" else unpack)(args.step)


if __name__ == "__main__":
    main()
