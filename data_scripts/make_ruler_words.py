#!/usr/bin/env python3
"""The word lists NVIDIA RULER draws from, written to data/ruler/wonderwords.json for `kvlab ruler`.

RULER's generators (scripts/data/synthetic/niah.py, common_words_extraction.py) read the lists of
the PyPI package `wonderwords` through wonderwords.random_word._get_words_from_text_file(
"nounlist.txt" | "adjectivelist.txt" | "verblist.txt"). This script reads them the same way and
writes them unchanged (file order, duplicates kept: RULER itself de-duplicates and sorts), so kvlab
never carries a hand-typed list.

Pinned: wonderwords==3.0.1 (MIT licence; RULER's docker/requirements.txt leaves it unpinned).

Usage:
  python3 -m venv /tmp/ww && /tmp/ww/bin/pip install wonderwords==3.0.1
  /tmp/ww/bin/python data_scripts/make_ruler_words.py [--out data/ruler/wonderwords.json]
Deterministic: two runs give the same file.
"""
import argparse
import json
import os
from importlib.metadata import version

from wonderwords import random_word

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED = "3.0.1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "data", "ruler", "wonderwords.json"))
    args = ap.parse_args()
    got = version("wonderwords")
    if got != PINNED:
        raise SystemExit(f"wonderwords {got} installed; this script is pinned to {PINNED}")
    out = {
        "source": "PyPI wonderwords %s, wonderwords.random_word._get_words_from_text_file(<file>), "
                  "as NVIDIA RULER's scripts/data/synthetic/niah.py and common_words_extraction.py read "
                  "them; written by data_scripts/make_ruler_words.py" % got,
        "license": "MIT (wonderwords, Copyright (c) 2020 Maxim Rebguns)",
        "nouns": list(random_word._get_words_from_text_file("nounlist.txt")),
        "adjectives": list(random_word._get_words_from_text_file("adjectivelist.txt")),
        "verbs": list(random_word._get_words_from_text_file("verblist.txt")),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {args.out}: {len(out['nouns'])} nouns, {len(out['adjectives'])} adjectives, "
          f"{len(out['verbs'])} verbs")


if __name__ == "__main__":
    main()
