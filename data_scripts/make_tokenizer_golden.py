#!/usr/bin/env python3
"""Golden token ids for tests/model/test_tokenizer.cpp, from the Python `tokenizers` library.

Encodes a fixed text set (made-up strings covering English, contractions, Chinese and other
scripts, code, emoji, whitespace runs, numbers, special tokens, plus short snippets sliced from
../shared/data) with the SmolLM2 and Llama-2 tokenizer.json files and writes
tests/fixtures/tokenizer_golden/{smollm2,llama2}.json: per case the text, the ids without and
with the tokenizer's own special tokens (add_special_tokens), and decode() of the latter with
and without skip_special_tokens.

For Llama 2 each case without special-token strings also gets "ids_spm": the ids of the
`sentencepiece` library on tokenizer.model (kvlab reads that file itself and runs the
score-based SPM BPE of its GGUF "llama" path, as llama.cpp does).

Note: ../shared/tokenizers/llama2/tokenizer.json does not carry Llama 2's ids: its vocabulary
has "▁" = 28705 and "▁Hello" = 22557 (Mistral-7B's), while tokenizer.model beside it is Llama 2
("▁" = 29871). Both are SentencePiece BPE, so each checks its own path: "ids" come from the
.json, "ids_spm" from the .model.

Run: /opt/kvlab-py/bin/python data_scripts/make_tokenizer_golden.py [--shared ../shared]
"""
import argparse
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer

MADE_UP = {
    "english": "Hello world! How's it going? I'm fine, we'll see; they've done it, she'd say.",
    "contractions_upper": "DON'T YOU'LL I'M WE'VE 'sup 'twas",
    "numbers": "The year 2024 had 365 days; pi is 3.14159, 1,000,000 people paid $3,000 (12.5%) 0x1F 1e-9.",
    "long_number": "1234567890123456789 and 00042",
    "chinese": "你好，世界！这是一个测试。我们今天去公园散步吧。",
    "scripts": "नमस्ते दुनिया | مرحبا بالعالم | こんにちは世界 | 안녕하세요 | Привет, мир! | Γειά σου Κόσμε",
    "accents": "Ünïcödé façade naïve résumé — “quotes” and ‘single’ … ellipsis ½ ² ③",
    "emoji": "I love 🦙 and 🤗! 👩‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵, skin 👍🏽, keycap 1️⃣ ✨",
    "code": "def foo(x: int) -> int:\n    \"\"\"Square.\"\"\"\n    return x ** 2  # square\n\n\tif x != 0:\n\t\tpass\n",
    "code_cpp": "for (int i = 0; i < n; ++i) {\n  y[i] += a * x[i];  // axpy\n}\nstd::vector<int64_t> v{1, 2, 3};",
    "whitespace_runs": "a  b   c    d\n\n\n  e \t\t f   \n",
    "leading_trailing": "   leading and trailing   ",
    "single_space": " ",
    "newline_only": "\n",
    "crlf_controls": "tab\there\r\nCRLF line\u000bvtab\u000cff end",
    "nbsp_ideographic": "non\u00a0breaking\u3000space\u2009thin",
    "repeated": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!??????",
    "punct_mix": "Hello,world...(test)[x]{y}<z> @user #tag https://example.com/a?b=c&d=e",
    "special_chatml": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "special_llama2": "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhello [/INST] Hi!</s><s>[INST] again [/INST]",
    "special_adjacent": "x<|endoftext|>y</s>z<s> w",
    "rare_chars": "\u0000nul \u007f del \ufeffbom \U0001F600 \u200bzwsp \u0301combining e\u0301",
}


def read_jsonl(path, n=1):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if len(out) >= n:
                break
    return out


def snippets(shared):
    d = os.path.join(shared, "data")
    s = {}
    s["longbench_multi_news"] = read_jsonl(os.path.join(d, "longbench/multi_news.jsonl"))[0]["context"][:1500]
    s["longbench_multifieldqa_zh"] = read_jsonl(os.path.join(d, "longbench/multifieldqa_zh.jsonl"))[0]["context"][:800]
    s["longeval_lines"] = read_jsonl(os.path.join(d, "longeval/lines/200_lines.jsonl"))[0]["prompt"][:1200]
    s["xsum"] = read_jsonl(os.path.join(d, "summarization/xsum_0shot.jsonl"))[0]["article"][:1200]
    s["mt_bench"] = read_jsonl(os.path.join(d, "mt_bench/question.jsonl"))[0]["turns"][0]
    with open(os.path.join(d, "wikitext2/wiki.test.raw"), encoding="utf-8", newline="") as f:
        s["wikitext2_crlf"] = f.read(4000)[2000:3500]
    with open(os.path.join(d, "niah/PaulGrahamEssays/addiction.txt"), encoding="utf-8") as f:
        s["niah_essay"] = f.read()[:1200]
    return s


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap.add_argument("--shared", default=os.environ.get("KVLAB_SHARED", os.path.join(root, "..", "shared")))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer_golden"))
    args = ap.parse_args()
    texts = dict(MADE_UP)
    texts.update(snippets(args.shared))
    os.makedirs(args.out, exist_ok=True)
    for name in ["smollm2", "llama2"]:
        path = os.path.join(args.shared, "tokenizers", name, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        cases = []
        for key, text in texts.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_special = tok.encode(text, add_special_tokens=True).ids
            cases.append({
                "name": key, "text": text, "ids": ids, "ids_special": ids_special,
                "decoded": tok.decode(ids_special, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids_special, skip_special_tokens=True),
            })
        spm_path = os.path.join(args.shared, "tokenizers", name, "tokenizer.model")
        if name == "llama2" and os.path.exists(spm_path):
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
            for c in cases:
                if not any(t in c["text"] for t in ("<s>", "</s>", "<unk>")):
                    c["ids_spm"] = sp.encode(c["text"])
        doc = {
            "schema_version": 1,
            "tokenizer": f"tokenizers/{name}/tokenizer.json",
            "generator": "data_scripts/make_tokenizer_golden.py",
            "tokenizers_version": tokenizers.__version__,
            "cases": cases,
        }
        out = os.path.join(args.out, f"{name}.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{out}: {len(cases)} cases, {os.path.getsize(out)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
