#!/usr/bin/env python3
"""Golden DuoAttention decisions of NVIDIA kvpress (`DuoAttentionPress(on_the_fly_scoring=True)`) on
SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes tests/fixtures/kvpress_golden/duo_smollm2.json, which test_kvpress_golden compares kvlab's
`duo_attention` (and the scores `kvlab calibrate duo` makes) against: the calibration windows' token
ids, kvpress's on-the-fly head scores over them [L, Hkv], and per head_compression_ratio the
streaming heads, per layer and KV head the kept positions of one prompt (the complement of
module.masked_key_indices), and the greedy continuation through the masked cache.

Same pinned environment, model, float32 CPU one-thread set-up and file conventions as
make_kvpress_golden.py (whose helpers this imports; see its docstring), with two substitutions:
  - kvpress's duo_attention_on_the_fly draws 50 BookSum chapters with `datasets.load_dataset`
    (Hugging Face, not reachable here); `load_dataset` is replaced by 50 windows of 256 tokens of
    ../shared/data/wikitext2/wiki.test.raw (after the text the prompts use), each given to kvpress's
    tokenizer call as the ids themselves (its `AutoTokenizer` is replaced by one that returns them);
    the windows are in the golden, so kvlab scores the very same ids;
  - pandas' .sample(50, random_state=42) of the 50 windows only reorders them (the mean is the same up
    to float32 summation order).

Usage:
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_duo_golden.py [--gguf PATH] [--out FILE]
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kvpress_golden as base  # noqa: E402  (sets the offline environment, imports torch)

import torch  # noqa: E402

N_WINDOWS, WINDOW_TOKENS, WINDOW_START_CHAR = 50, 256, 20000
PROMPT = "longbench_multi_news_2"
PROMPT_TOKENS = 1000
RATIOS = [0.25, 0.5, 0.75]  # head_compression_ratio


class _Windows:
    """Stands in for load_dataset(...).to_pandas() and AutoTokenizer inside duo_attention_press:
    the 'chapters' are keys of the calibration windows, the tokenizer returns their ids."""

    ids = {}

    @classmethod
    def load_dataset(cls, *args, **kwargs):
        import pandas as pd

        class _D:
            def to_pandas(self):
                return pd.DataFrame({"chapter": list(cls.ids.keys())})
        return _D()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        def call(text, return_tensors=None, **kw):
            return _Batch({"input_ids": torch.tensor([cls.ids[text]], dtype=torch.long),
                    "attention_mask": torch.ones(1, len(cls.ids[text]), dtype=torch.long)})

        class _T:
            def __call__(self, text, **kw):
                return call(text, **kw)
        return _T()


class _Batch(dict):
    def to(self, device):
        return self


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(base.REPO, "tests", "fixtures", "kvpress_golden",
                                                  "duo_smollm2.json"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)

    import kvpress  # noqa: F401  (patches the attention functions on import)
    import kvpress.presses.duo_attention_press as duo_press
    import transformers
    from importlib.metadata import version as pkg_version
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    tok = Tokenizer.from_file(os.path.join(base.SHARED, "tokenizers", "smollm2", "tokenizer.json"))

    # Calibration windows: consecutive 256-token windows of WikiText-2's test split after the
    # prompts' first 20,000 characters.
    with open(os.path.join(base.SHARED, "data", "wikitext2", "wiki.test.raw"), encoding="utf-8") as f:
        text = f.read()[WINDOW_START_CHAR:WINDOW_START_CHAR + 400000]
    all_ids = tok.encode(text, add_special_tokens=True).ids
    assert len(all_ids) >= N_WINDOWS * WINDOW_TOKENS
    windows = [all_ids[i * WINDOW_TOKENS:(i + 1) * WINDOW_TOKENS] for i in range(N_WINDOWS)]
    _Windows.ids = {f"window {i}": w for i, w in enumerate(windows)}
    duo_press.load_dataset = _Windows.load_dataset
    duo_press.AutoTokenizer = _Windows

    p = next(q for q in base.PROMPTS if q["name"] == PROMPT)
    ids = tok.encode(base.prompt_text(p), add_special_tokens=True).ids[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS
    prompt = {"name": p["name"], "source": p["source"], "n_tokens": len(ids),
              "text": tok.decode(ids, skip_special_tokens=False), "ids": ids}

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(base.MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
        dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]

    head_scores = duo_press.duo_attention_on_the_fly(model)  # [L, Hkv] numpy float32
    print("head scores", head_scores.shape, float(head_scores.min()), float(head_scores.max()), flush=True)
    configs_out = []
    n = len(ids)
    for hcr in RATIOS:
        press = kvpress.DuoAttentionPress(head_compression_ratio=hcr, on_the_fly_scoring=True)
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            greedy, _ = base.greedy_pipeline_style(model, press, x, eos_ids)
        kept_sets, n_kept = [], 0
        for layer in model.model.layers:
            mask = torch.ones(n_kv, n, dtype=torch.bool)
            mk = getattr(layer.self_attn, "masked_key_indices", None)
            if mk is not None:
                _, h_idx, p_idx = mk
                mask[h_idx, p_idx] = False
            kept_sets.append([base.mask_hex(mask[h].nonzero().flatten().tolist(), n) for h in range(n_kv)])
            n_kept += int(mask.sum())
        streaming = press.streaming_mask.nonzero().tolist()
        print(f"DuoAttentionPress(head_compression_ratio={hcr}) streaming {len(streaming)} kept {n_kept} "
              f"greedy={greedy[:6]}", flush=True)
        configs_out.append({
            "name": f"DuoAttentionPress(on_the_fly_scoring=True)@{hcr}", "press": "DuoAttentionPress",
            "head_compression_ratio": hcr, "sink_size": press.sink_size, "recent_size": press.recent_size,
            "n_streaming": len(streaming), "streaming_heads": streaming,
            "compression_ratio_": press.compression_ratio_, "n_kept_total": n_kept,
            "kept": kept_sets, "greedy_ids": greedy})

    out = {
        "version": 1,
        "generator": "data_scripts/make_duo_golden.py",
        "versions": {
            "kvpress": pkg_version("kvpress"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": pkg_version("gguf"),
            "python": sys.version.split()[0],
        },
        "model": {
            "gguf_file": os.path.basename(gguf),
            "gguf_sha256": base.sha256(gguf),
            "dtype": "float32 (dequantized by transformers/gguf-py), CPU, 1 thread",
            "n_layers": n_layers, "n_q_heads": cfg.num_attention_heads, "n_kv_heads": n_kv,
            "eos_token_id": eos_ids,
        },
        "calibration": "kvpress duo_attention_on_the_fly(model, num_samples=50, q_len=500) over the windows "
                       "below instead of 50 BookSum chapters: %d consecutive windows of %d token ids of "
                       "wiki.test.raw from character %d (../shared/tokenizers/smollm2/tokenizer.json, no BOS)"
                       % (N_WINDOWS, WINDOW_TOKENS, WINDOW_START_CHAR),
        "q_len": 500,
        "windows": windows,
        "head_scores": [[base.F32(v) for v in row] for row in head_scores.tolist()],
        "generation": "as make_kvpress_golden.py (pipeline-style, no question): the prefill inside `with "
                      "press(model)`, first token = argmax of the uncompressed prefill logits, then greedy "
                      "decoding through the masked cache, up to %d tokens" % base.MAX_NEW_TOKENS,
        "prompt": prompt,
        "configs": configs_out,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    text = base.to_json(out) + "\n"
    json.loads(text)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text.encode()) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
