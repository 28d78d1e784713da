#!/usr/bin/env python3
"""Greedy continuations of NVIDIA kvpress's KeyRerotationPress on SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes tests/fixtures/kvpress_golden/rerotation_smollm2.json, which the C++ test compares kvlab's
re-rotation after compression (cache/rerotation.h rerotate_kept; generate --rerotate) against:
KeyRerotationPress(SnapKVPress(window 32, kernel 5)) and KeyRerotationPress(KnormPress) at
compression_ratio 0.5 and 0.75 on the two prompts of make_kvpress_golden.py. The wrapped press keeps
the same positions as the press alone (that file's `kept`); the kept keys are then rotated to
positions 0 .. m-1 and, as KVPressTextGenerationPipeline does for this press (its context_length is
the cache's length), decoding continues at positions m, m+1, ...: the greedy ids are what re-rotation
changes, and what this golden records.

Same pinned environment, model, prompts and generation loop as make_kvpress_golden.py (imported):
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_kvpress_rerotation_golden.py [--gguf PATH]
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kvpress_golden as base  # noqa: E402  (sets the offline environment first)
import torch  # noqa: E402

RATIOS = [0.5, 0.75]


def greedy_rerotated(model, press, ids, eos_ids):
    """KVPressTextGenerationPipeline with a KeyRerotationPress and no question: prefill inside the
    press, first token from the prefill logits, then greedy decoding from position = the cache's length."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with press(model):
        out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
    m = cache.get_seq_length()
    generated = [out.logits[0, -1].argmax()]
    for i in range(base.MAX_NEW_TOKENS - 1):
        out = model(input_ids=generated[-1].view(1, 1), past_key_values=cache, position_ids=torch.tensor([[m + i]]))
        generated.append(out.logits[0, -1].argmax())
        if generated[-1].item() in eos_ids:
            break
    return [int(t) for t in generated], m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(base.REPO, "tests", "fixtures", "kvpress_golden",
                                                  "rerotation_smollm2.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import kvpress
    import transformers
    from importlib.metadata import version as pkg_version
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(base.MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")
    tok = Tokenizer.from_file(os.path.join(base.SHARED, "tokenizers", "smollm2", "tokenizer.json"))
    prompts = []
    for p in base.PROMPTS:
        ids = tok.encode(base.prompt_text(p), add_special_tokens=True).ids[: p["n_tokens"]]
        assert len(ids) == p["n_tokens"], (p["name"], len(ids))
        prompts.append({"name": p["name"], "ids": ids})
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf)),
                                                 gguf_file=os.path.basename(gguf), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    inner = {
        "SnapKVPress": lambda r: kvpress.SnapKVPress(compression_ratio=r, window_size=32, kernel_size=5),
        "KnormPress": lambda r: kvpress.KnormPress(compression_ratio=r),
    }
    configs = []
    for name, make in inner.items():
        for ratio in RATIOS:
            results = []
            for p in prompts:
                ids = torch.tensor([p["ids"]], dtype=torch.long)
                with torch.no_grad():
                    greedy, m = greedy_rerotated(model, kvpress.KeyRerotationPress(press=make(ratio)), ids, eos_ids)
                results.append({"prompt": p["name"], "n": len(p["ids"]), "cache_len_after_prefill": m,
                                "greedy_ids": greedy})
                print(f"KeyRerotationPress({name}) r={ratio} {p['name']:24s} m={m} greedy={greedy[:6]}", flush=True)
            configs.append({"name": f"KeyRerotationPress({name})@{ratio}", "inner": f"{name}@{ratio}",
                            "compression_ratio": ratio, "results": results})
    out = {
        "version": 1,
        "generator": "data_scripts/make_kvpress_rerotation_golden.py",
        "versions": {"kvpress": pkg_version("kvpress"), "transformers": transformers.__version__,
                     "torch": torch.__version__},
        "model": {"gguf_file": os.path.basename(gguf), "gguf_sha256": base.sha256(gguf)},
        "kept": "the inner press's kept positions, as in smollm2.json's config named by 'inner'",
        "generation": "prefill inside `with press(model)`; first token = argmax of the prefill logits; then greedy "
                      "decoding with position_ids m, m+1, ... (m = the compressed cache's length, as the pipeline "
                      "sets context_length for KeyRerotationPress), up to %d tokens, stopping after EOS"
                      % base.MAX_NEW_TOKENS,
        "configs": configs,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
