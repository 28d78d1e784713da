#!/usr/bin/env python3
"""A Llama checkpoint of a given config.json's shapes with seeded random weights, in the Hugging Face
layout kvlab reads (config.json, model.safetensors, tokenizer.json): a model of a real model's size
where its weights cannot travel (bench/cuda_check.sh, on a machine that reaches no hub).

    python3 bench/random_llama.py --config ../shared/tokenizers/smollm2/config.json \
        --tokenizer ../shared/tokenizers/smollm2/tokenizer.json --out /tmp/rand_smollm2

Weights: normal(0, initializer_range) as transformers' LlamaPreTrainedModel._init_weights draws
them (norm weights 1), float32, tied embeddings as the config says. numpy + safetensors only.
"""
import argparse
import json
import os
import shutil

import numpy as np
from safetensors.numpy import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a Llama config.json")
    ap.add_argument("--tokenizer", required=True, help="the tokenizer.json to ship beside the weights")
    ap.add_argument("--out", required=True, help="the checkpoint folder to write")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"--config {a.config}: model_type {cfg.get('model_type')!r}, expected 'llama'")
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    std = cfg.get("initializer_range", 0.02)
    rng = np.random.default_rng(a.seed)
    w = lambda *shape: rng.normal(0.0, std, size=shape).astype(np.float32)
    t = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(nh * hd, h)    # [Hq*d, hidden]
        t[p + "self_attn.k_proj.weight"] = w(nkv * hd, h)   # [Hkv*d, hidden]
        t[p + "self_attn.v_proj.weight"] = w(nkv * hd, h)   # [Hkv*d, hidden]
        t[p + "self_attn.o_proj.weight"] = w(h, nh * hd)    # [hidden, Hq*d]
        t[p + "mlp.gate_proj.weight"] = w(inter, h)
        t[p + "mlp.up_proj.weight"] = w(inter, h)
        t[p + "mlp.down_proj.weight"] = w(h, inter)
        t[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = w(v, h)
    os.makedirs(a.out, exist_ok=True)
    save_file(t, os.path.join(a.out, "model.safetensors"))
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
    shutil.copy(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
    print(f"random_llama: {a.out}: {sum(x.size for x in t.values()) / 1e6:.1f} M parameters, seed {a.seed}")


if __name__ == "__main__":
    main()
