#!/usr/bin/env python3
"""Reference outputs of SmolLM2-135M-Instruct (Q4_1 GGUF) from Hugging Face transformers.

Writes tests/fixtures/smollm2_golden/{golden.json,golden.safetensors}, which
tests/model/test_forward.cpp compares kvlab's forward pass against:

  golden.json         token ids of the prompt, argmax and top-k ids at every position, the
                      positions/layers sliced for q/k/v, versions, GGUF sha256
  golden.safetensors  float32:
                        logits_tail   [n_tail, vocab]        full logits of the last n_tail positions
                        topk_logits   [n_tokens, topk]       logits at the top-k ids, every position
                        layer_LL_q    [n_q_heads,  n_pos, head_dim]  post-RoPE, positions `positions`
                        layer_LL_k    [n_kv_heads, n_pos, head_dim]  post-RoPE
                        layer_LL_v    [n_kv_heads, n_pos, head_dim]

transformers dequantizes the GGUF to float32 (gguf-py) and undoes llama.cpp's q/k row permutation;
the model then runs in float32 on CPU. q/k/v come from forward hooks on q_proj/k_proj/v_proj,
with RoPE applied by the model's own rotary embedding and apply_rotary_pos_emb.

Usage (venv with torch, transformers, gguf, tokenizers, safetensors):
  /opt/kvlab-py/bin/python data_scripts/make_smollm2_golden.py [--gguf PATH] [--out DIR]
"""
import argparse
import glob
import hashlib
import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVLAB_SHARED", os.path.join(REPO, "..", "shared"))
MODELS = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))

# The fixed prompt: the first N_TOKENS tokens of this essay, SmolLM2 tokenizer, no special tokens.
TEXT_FILE = "data/niah/PaulGrahamEssays/apple.txt"
N_TOKENS = 256
N_TAIL = 4          # positions with full logits
TOPK = 32           # top-k logits at every position
LAYERS = [0, 29]    # q/k/v captured for these layers
POS_STRIDE = 8      # q/k/v positions: 0, 8, 16, ... plus the last one


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_rope_fixture(out_dir):
    """inv_freq of transformers' rope init functions for a Llama-3.1-8B-like config (llama3) and a
    linear-scaled one -> tests/fixtures/rope/inv_freq.json (checked by test_forward.cpp)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cases = {
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "linear": {"rope_type": "linear", "factor": 4.0},
    }
    out = {"generator": "data_scripts/make_smollm2_golden.py", "cases": []}
    for kind, scaling in cases.items():
        c = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling=dict(scaling))
        inv, _ = ROPE_INIT_FUNCTIONS[kind](c, "cpu")
        out["cases"].append({"name": kind, "config": {
            "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": scaling}, "inv_freq": [float(x) for x in inv.float()]})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "inv_freq.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "smollm2_golden"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")
    if args.threads:
        torch.set_num_threads(args.threads)
    write_rope_fixture(os.path.join(os.path.dirname(args.out), "rope"))

    tok = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", "smollm2", "tokenizer.json"))
    with open(os.path.join(SHARED, TEXT_FILE), encoding="utf-8") as f:
        text = f.read()
    ids = tok.encode(text, add_special_tokens=False).ids[:N_TOKENS]
    assert len(ids) == N_TOKENS, len(ids)

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
        dtype=torch.float32)
    model.eval()
    cfg = model.config
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q

    # Pre-RoPE projections via hooks; RoPE applied below with the model's own functions.
    proj = {}
    hooks = []
    for layer in LAYERS:
        attn = model.model.layers[layer].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            def hook(mod, inp, out, layer=layer, name=name):
                proj[(layer, name)] = out.detach().clone()
            hooks.append(getattr(attn, name).register_forward_hook(hook))

    input_ids = torch.tensor([ids], dtype=torch.long)  # [1, T]
    with torch.no_grad():
        logits = model(input_ids).logits[0].float()  # [T, vocab]
        pos_ids = torch.arange(N_TOKENS).unsqueeze(0)  # [1, T]
        dummy = torch.zeros(1, N_TOKENS, head_dim)
        cos, sin = model.model.rotary_emb(dummy, pos_ids)  # [1, T, d]
    for h in hooks:
        h.remove()

    positions = list(range(0, N_TOKENS, POS_STRIDE))
    if positions[-1] != N_TOKENS - 1:
        positions.append(N_TOKENS - 1)
    pos_t = torch.tensor(positions)

    tensors = {}
    for layer in LAYERS:
        q = proj[(layer, "q_proj")].view(1, N_TOKENS, n_q, head_dim).transpose(1, 2)   # [1, Hq, T, d]
        k = proj[(layer, "k_proj")].view(1, N_TOKENS, n_kv, head_dim).transpose(1, 2)  # [1, Hkv, T, d]
        v = proj[(layer, "v_proj")].view(1, N_TOKENS, n_kv, head_dim).transpose(1, 2)  # [1, Hkv, T, d]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        tensors[f"layer_{layer:02d}_q"] = q[0][:, pos_t].contiguous()  # [Hq, n_pos, d]
        tensors[f"layer_{layer:02d}_k"] = k[0][:, pos_t].contiguous()  # [Hkv, n_pos, d]
        tensors[f"layer_{layer:02d}_v"] = v[0][:, pos_t].contiguous()  # [Hkv, n_pos, d]

    top = logits.topk(TOPK, dim=-1)
    tensors["logits_tail"] = logits[-N_TAIL:].contiguous()   # [N_TAIL, vocab]
    tensors["topk_logits"] = top.values.contiguous()         # [T, TOPK]

    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "golden.safetensors"))
    os.chmod(os.path.join(args.out, "golden.safetensors"), 0o644)
    meta = {
        "version": 1,
        "generator": "data_scripts/make_smollm2_golden.py",
        "gguf_file": os.path.basename(gguf),
        "gguf_sha256": sha256(gguf),
        "text_file": TEXT_FILE,
        "token_ids": ids,
        "n_tail": N_TAIL,
        "topk": TOPK,
        "topk_ids": top.indices.tolist(),
        "argmax": logits.argmax(-1).tolist(),
        "layers": LAYERS,
        "positions": positions,
        "n_q_heads": n_q, "n_kv_heads": n_kv, "head_dim": head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": getattr(cfg, "rope_theta", None),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"wrote {args.out} ({total / 1e6:.2f} MB), argmax[-1]={meta['argmax'][-1]}")


if __name__ == "__main__":
    main()
