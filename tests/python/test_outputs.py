#!/usr/bin/env python3
"""python/kvlab/outputs.py, the rule every Python writer of kvlab follows (a ctest, `outputs`): an
existing --out needs --overwrite; an input, or any file of an input directory (a model's weights,
config, tokenizer), is never written, with --overwrite or without; a directory is refused.
Issue 50: `kvlab_capture.py --out <model dir>/model.safetensors --overwrite` replaced the weights it
was reading (it compared --out with the directory only).

  tests/python/test_outputs.py [repo root]
"""
import os
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab.outputs import OutputError, check_output  # noqa: E402

passed = 0


def refused(out, overwrite, inputs, words):
    global passed
    try:
        check_output(out, overwrite, inputs)
    except OutputError as e:
        if words not in str(e) or "--out" not in str(e):
            sys.exit(f"FAIL: refusal of {out} does not say '{words}' and name --out: {e}")
        passed += 1
        return
    sys.exit(f"FAIL: {out} (overwrite={overwrite}) was allowed")


def allowed(out, overwrite, inputs):
    global passed
    try:
        check_output(out, overwrite, inputs)
    except OutputError as e:
        sys.exit(f"FAIL: {out} (overwrite={overwrite}) was refused: {e}")
    passed += 1


with tempfile.TemporaryDirectory() as d:
    model = os.path.join(d, "model")
    os.makedirs(model)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        with open(os.path.join(model, name), "w") as f:
            f.write("x")
    text = os.path.join(d, "prompt.txt")
    with open(text, "w") as f:
        f.write("a prompt")
    other = os.path.join(d, "old.h5")
    with open(other, "w") as f:
        f.write("an earlier capture")
    inputs = [model, text]
    refused(os.path.join(model, "model.safetensors"), True, inputs, "one of the inputs")
    refused(os.path.join(model, "config.json"), True, inputs, "one of the inputs")
    refused(os.path.join(d, "model", ".", "tokenizer.json"), True, inputs, "one of the inputs")
    refused(text, True, inputs, "one of the inputs")
    link = os.path.join(d, "link.safetensors")
    os.symlink(os.path.join(model, "model.safetensors"), link)
    refused(link, True, inputs, "one of the inputs")  # a link to an input is the input
    refused(other, False, inputs, "pass --overwrite")
    refused(model, True, inputs, "is a directory")
    allowed(other, True, inputs)
    allowed(os.path.join(d, "new.h5"), False, inputs)
    gguf = os.path.join(model, "m.gguf")
    with open(gguf, "w") as f:
        f.write("gguf")
    refused(gguf, True, [gguf], "one of the inputs")  # a model given as a file
    allowed(os.path.join(model, "capture.h5"), False, [gguf])  # beside a file model: its folder is not an input
print(f"{passed} passed, 0 failed")
