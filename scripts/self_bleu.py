#!/usr/bin/env python3
"""Self-BLEU of each branch's outputs (BUZZ Fig. 7, issue 48): how alike a branch's summaries are to
one another, the diversity measure BUZZ compares with the full cache's.

  scripts/self_bleu.py --out results/xsum_self_bleu RESULTS_DIR [RESULTS_DIR ...]

For every branch (method, params, setting) of the given results folders and every record in it, the
record's self_bleu is the BLEU-4 of its output against the outputs of the branch's other records as
references (nltk's sentence_bleu, uniform weights over 1-4-grams, SmoothingFunction().method1, the
Penn Treebank tokenizer): the definition of Texygen's SelfBleu (Zhu et al. 2018) with each text
left out of its own references, as the BUZZ paper describes it ("the average BLEU score obtained
when considering other sentences as reference texts") and at the 4-grams of the work it cites for it
(Holtzman et al. 2020). A branch's Self-BLEU is the mean over its records.

The output is a results folder (docs/results.md) whose records keep the source records' identity
fields and carry `self_bleu` and `n_references` (no output text); a branch found in two folders
with the same identity must give the same outputs (e.g. the full cache of two runs on the same
articles), and is counted once. Needs nltk (data_scripts/requirements.txt: nltk==3.10.4; the
tokenizer needs no downloaded data).
"""
import argparse
import json
import os
import sys

from nltk.tokenize import TreebankWordTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvlab import results  # noqa: E402


def branch_key(r):
    return (r["benchmark"], r["task"], r["method"], json.dumps(r.get("params"), sort_keys=True), r.get("setting"))


def self_bleu(texts):
    """[BLEU-4 of texts[i] against every other text] (smoothing method1)."""
    tok = TreebankWordTokenizer()
    toks = [tok.tokenize(t) for t in texts]
    smooth = SmoothingFunction().method1
    out = []
    for i, hyp in enumerate(toks):
        refs = toks[:i] + toks[i + 1:]
        out.append(sentence_bleu(refs, hyp, smoothing_function=smooth) if hyp else 0.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="results folders with predictions (output per record)")
    ap.add_argument("--out", required=True, help="the results folder to write")
    a = ap.parse_args()
    branches = {}  # key -> {sample: record}
    for folder in a.folders:
        for r in results.load(folder):
            b = branches.setdefault(branch_key(r), {})
            old = b.get(r["sample"])
            if old is not None and old["output"] != r["output"]:
                sys.exit(f"self_bleu: {folder}: sample {r['sample']} of {r['method']} ({r.get('setting')}) "
                         "has another output in an earlier folder")
            b.setdefault(r["sample"], r)
    keep = set(results.IDENTITY) - {"shard"}
    out = []
    for key in sorted(branches):
        recs = [branches[key][s] for s in sorted(branches[key], key=results.sample_key)]
        for r, sb in zip(recs, self_bleu([r["output"] for r in recs])):
            rec = {k: r.get(k) for k in results.IDENTITY if k in keep}
            rec["self_bleu"] = sb
            rec["n_references"] = len(recs) - 1
            out.append(rec)
    run = {"format": 1, "converted_from": [os.path.normpath(f) for f in a.folders], "made_by": "scripts/self_bleu.py",
           "definition": "BLEU-4 of each output against the branch's other outputs (nltk sentence_bleu, "
                         "SmoothingFunction().method1, TreebankWordTokenizer)"}
    results.write_results(a.out, out, run=run)
    print(f"self_bleu: {len(out)} records, {len(branches)} branches -> {a.out}")


if __name__ == "__main__":
    main()
