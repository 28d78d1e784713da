#!/usr/bin/env python3
"""kvpress's rows on kvlab's RULER samples: the same model, the same samples, kvpress's own pipeline.

Reads the samples `kvlab ruler` wrote (<run>/data/<task>_<length>.jsonl: RULER's fields plus the
context / question split) and runs NVIDIA kvpress's KVPressTextGenerationPipeline on each, as its
leaderboard does (context compressed by the press during the prefill, then the question and answer
prefix through the compressed cache, greedy decoding of the task's tokens_to_generate), for a few
presses kvlab also has, at the given compression ratios. Writes kvlab's prediction format, one
folder per (press, ratio):

  <out>/pred/kvpress_<method>_ratio<kept>/<task>_<length>.jsonl   {"id", "output", "outputs", "seconds"}
  <out>/kvpress.json                                               versions, every call's arguments, timings

`kvlab ruler eval <run> <out>` then scores kvlab's branches and these with RULER's string_match_all
and says, for each kvpress folder, how often its output equals kvlab's branch of the same name.
Folder names use kvlab's convention (the kept fraction: compression_ratio 0.5 -> ratio0.5,
0.75 -> ratio0.25).

Presses (kvpress 0.5.5) and the kvlab method with the same definition (tests/generate/
test_kvpress_golden.cpp checks them on SmolLM2):
  streaming_llm       StreamingLLMPress(n_sink=4)        kvlab streaming_llm (paper preset: 4 sinks)
  knorm               KnormPress()                        kvlab knorm
  expected_attention  ExpectedAttentionPress()            kvlab expected_attention (its paper preset)
  snapkv              SnapKVPress(window 32, kernel 5)    kvlab snapkv window=32 kernel=5 pooling=avg
                                                          (its paper preset is max-pool kernel 7: the
                                                          rows differ by that definition)
  tova                TOVAPress()                         kvlab tova

Model: the SmolLM2-135M-Instruct Q4_1 GGUF that kvlab runs (models/smollm2-135m/*.gguf), dequantized
to float32 by transformers, CPU, --threads threads; its chat template from the GGUF.

Environment: the venv of data_scripts/make_kvpress_golden.py (kvpress==0.5.5, which pins
transformers 5.2.0; torch 2.15.0; gguf):
  python3 -m venv /opt/kvpress-py && /opt/kvpress-py/bin/pip install kvpress==0.5.5 gguf
Usage:
  /opt/kvpress-py/bin/python bench/ruler_kvpress.py RUN --presses streaming_llm,knorm,expected_attention \
      --compression-ratio 0.5 --out RUN/kvpress
Resumable: a (press, dataset) file already complete is skipped; a partial one is continued.
"""
import argparse
import glob
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))
# tokens_to_generate of RULER's constants.py, by task family (lib/kvlab/tasks/ruler.cpp)
TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}


def make_press(kvpress, name, ratio):
    if name == "streaming_llm":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    if name == "expected_attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=ratio)
    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5)
    if name == "tova":
        return kvpress.TOVAPress(compression_ratio=ratio)
    sys.exit(f"--presses: unknown press '{name}' (streaming_llm, knorm, expected_attention, snapkv, tova)")


def kept_label(ratio):
    kept = round(1.0 - ratio, 6)
    return f"ratio{kept:g}"


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a kvlab ruler run folder (its data/<task>_<length>.jsonl)")
    ap.add_argument("--presses", default="streaming_llm,knorm,expected_attention")
    ap.add_argument("--compression-ratio", default="0.5", help="kvpress compression ratios (fraction removed), comma-separated")
    ap.add_argument("--out", default=None, help="default <run>/kvpress")
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="the first N samples of each file (0 = all)")
    ap.add_argument("--lengths", default="", help="only these lengths, comma-separated (default: every data file)")
    args = ap.parse_args()

    data_files = sorted(glob.glob(os.path.join(args.run, "data", "*.jsonl")))
    if args.lengths:  # each sample says its length (max_seq_length); no file name is parsed
        keep = {int(x) for x in args.lengths.split(",")}
        data_files = [p for p in data_files if read_lines(p) and read_lines(p)[0]["max_seq_length"] in keep]
    if not data_files:
        sys.exit(f"{args.run}/data: no <task>_<length>.jsonl (run kvlab ruler first)")
    out = args.out or os.path.join(args.run, "kvpress")
    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf:
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")
    torch.set_num_threads(args.threads)

    import kvpress  # noqa: F401  (registers the pipeline, patches attention)
    import transformers
    from importlib.metadata import version as pkg_version
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device="cpu")

    for ratio in [float(r) for r in args.compression_ratio.split(",")]:
        for name in args.presses.split(","):
            branch = f"kvpress_{name}_{kept_label(ratio)}"
            os.makedirs(os.path.join(out, "pred", branch), exist_ok=True)
            n = 0
            for path in data_files:
                dataset = os.path.basename(path)[: -len(".jsonl")]
                samples = read_lines(path)
                if args.limit:
                    samples = samples[: args.limit]
                pred_path = os.path.join(out, "pred", branch, dataset + ".jsonl")
                done = {p["id"] for p in read_lines(pred_path)}
                if not samples:
                    continue
                family = next(k for k in TOKENS if samples[0]["task"].startswith(k))  # the sample's task
                with open(pred_path, "a", encoding="utf-8") as fo:
                    for s in samples:
                        sid = str(s["index"])
                        if sid in done:
                            continue
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            answer = pipe(s["context"], question=s["question"], answer_prefix=s["answer_prefix"],
                                          press=make_press(kvpress, name, ratio),
                                          max_new_tokens=TOKENS[family])["answer"]
                        dt = time.perf_counter() - t0
                        n += 1
                        fo.write(json.dumps({"id": sid, "output": answer, "outputs": s["outputs"], "seconds": round(dt, 4)},
                                            ensure_ascii=False) + "\n")
                        fo.flush()
                print(f"{branch} {dataset}: done ({n} samples decoded in this call)", flush=True)
    # Timings of every folder under <out>/pred from its lines (a resumed run's earlier calls
    # included), and every call's arguments: kvpress.json describes the folder, not the last call.
    timings = {}
    for branch in sorted(os.listdir(os.path.join(out, "pred"))):
        secs = [p["seconds"] for f in sorted(glob.glob(os.path.join(out, "pred", branch, "*.jsonl")))
                for p in read_lines(f)]
        timings[branch] = {"samples": len(secs), "seconds": round(sum(secs), 2),
                           "seconds_per_sample": round(sum(secs) / len(secs), 4) if secs else None}
    meta_path = os.path.join(out, "kvpress.json")
    calls = json.load(open(meta_path)).get("calls", []) if os.path.exists(meta_path) else []
    calls.append({"presses": args.presses.split(","),
                  "compression_ratios": [float(r) for r in args.compression_ratio.split(",")],
                  "lengths": args.lengths, "limit": args.limit, "run": os.path.relpath(os.path.abspath(args.run), REPO)})
    meta = {
        "tool": "bench/ruler_kvpress.py",
        "versions": {"kvpress": pkg_version("kvpress"), "transformers": transformers.__version__,
                     "torch": torch.__version__, "python": sys.version.split()[0]},
        "model": {"gguf": os.path.basename(gguf), "dtype": "float32", "threads": args.threads},
        "calls": calls,
        "timings": timings,
    }
    with open(meta_path, "w", encoding="utf-8") as fo:
        json.dump(meta, fo, indent=2)
        fo.write("\n")
    print(f"wrote {out}/pred and {out}/kvpress.json")


if __name__ == "__main__":
    main()
