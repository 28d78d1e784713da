"""The one rule for every file kvlab's Python tools write: never over what kvlab did not make, and
never over an input. (The C++ commands follow the same rule: an existing --out is refused unless
--overwrite, and never replaces a file the command reads.)"""
import os


class OutputError(Exception):
    """An --out that may not be written; the message names the flag and the file."""


def input_files(paths):
    """Every file the given inputs stand for: a file itself, a directory's files (a model directory:
    its weights, config and tokenizer), as real paths; missing paths are left out."""
    out = set()
    for p in paths:
        if not p or not os.path.exists(p):
            continue
        if os.path.isdir(p):
            for name in os.listdir(p):
                f = os.path.join(p, name)
                if os.path.isfile(f):
                    out.add(os.path.realpath(f))
        else:
            out.add(os.path.realpath(p))
    return out


def check_output(out, overwrite, inputs, flag="--out"):
    """Refuses `out` when it is a directory, is (or, as a directory, holds) one of `inputs`, or exists
    without `overwrite`. The input check holds even with `overwrite`."""
    if os.path.isdir(out):
        raise OutputError(f"{flag} {out}: is a directory")
    if os.path.realpath(out) in input_files(inputs):
        raise OutputError(f"{flag} {out} is one of the inputs (the model or text it reads): choose another file")
    if os.path.exists(out) and not overwrite:
        raise OutputError(f"{flag} {out} exists; pass --overwrite to replace it")
