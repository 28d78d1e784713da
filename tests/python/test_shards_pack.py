#!/usr/bin/env python3
"""scripts/shards_pack.py (a ctest, `shards_pack`): a step's shards in progress packed into one file
and unpacked on another machine: the same bytes for the same shards, a worker's unfinished last line
left out, a round trip equal to the shards, a folder that went on kept, a conflicting file refused.

  tests/python/test_shards_pack.py [repo root]
"""
import os
import sys
import tempfile

from script_check import expect, script_runner  # tests/python/ is on sys.path

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
run = script_runner(ROOT, "shards_pack.py")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def read(path):
    with open(path) as f:
        return f.read()


with tempfile.TemporaryDirectory() as d:
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    pred = os.path.join("shards", "shard0", "pred", "exact", "vt_1024.jsonl")
    write(os.path.join(a, pred), '{"id":"0"}\n{"id":"1"}\n{"id":"2", "unfinish')
    write(os.path.join(a, "shards", "shard0", "result.json"), '{"complete": false}\n')
    rc, out = run("pack", a)
    expect(rc == 0, "pack", out)
    first = open(os.path.join(a, "shards.tar.gz"), "rb").read()
    rc, out = run("pack", a)
    expect(open(os.path.join(a, "shards.tar.gz"), "rb").read() == first, "the same shards give the same bytes", out)
    os.makedirs(b)
    os.replace(os.path.join(a, "shards.tar.gz"), os.path.join(b, "shards.tar.gz"))
    rc, out = run("unpack", b)
    expect(rc == 0 and read(os.path.join(b, pred)) == '{"id":"0"}\n{"id":"1"}\n', "unpacked without the unfinished line", out)
    write(os.path.join(b, pred), '{"id":"0"}\n{"id":"1"}\n{"id":"2"}\n')
    rc, out = run("unpack", b)
    expect(rc == 0 and read(os.path.join(b, pred)).endswith('{"id":"2"}\n'), "a file that went on is kept", out)
    write(os.path.join(b, pred), '{"id":"9"}\n')
    rc, out = run("unpack", b)
    expect(rc != 0 and "vt_1024.jsonl differs" in out and read(os.path.join(b, pred)) == '{"id":"9"}\n',
           "a conflicting file is refused by name and left as it is", out)
    rc, out = run("unpack", os.path.join(d, "nothing"))
    expect(rc != 0 and "shards.tar.gz is missing" in out, "no archive: refused by name", out)
print("5 passed, 0 failed")
