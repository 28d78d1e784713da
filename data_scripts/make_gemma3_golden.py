#!/usr/bin/env python3
"""Reference outputs of Gemma-3-270M (base, Q4_K_M GGUF) from Hugging Face transformers.

Writes tests/fixtures/gemma3_golden/{golden.json,golden.safetensors}, which
tests/model/test_forward.cpp compares kvlab's forward pass and tokenizer against:

  golden.json         the text, its token ids from transformers' tokenizer (read from the same GGUF,
                      BOS added), the prompt (its first N_TOKENS ids: longer than the 512-token
                      sliding window), argmax and top-k ids at every position, GREEDY greedy ids
                      after the prompt, the layers/positions sliced for q/k/v, versions, sha256
  golden.safetensors  float32:
                        logits_last   [vocab]                 full logits of the last position
                        topk_logits   [n_tokens, topk]        logits at the top-k ids, every position
                        layer_LL_q    [n_q_heads,  n_pos, head_dim]  post-RoPE (as transformers)
                        layer_LL_k    [n_kv_heads, n_pos, head_dim]  post-RoPE
                        layer_LL_v    [n_kv_heads, n_pos, head_dim]

transformers dequantizes the GGUF to float32 (gguf-py) and subtracts the 1 that llama.cpp's
converter adds to Gemma's norm weights; the model runs in float32 on CPU (eager attention). q/k
are recorded where the attention layer applies RoPE (modeling_gemma3.apply_rotary_pos_emb, wrapped),
after its q/k norms and with the layer's own cos/sin (local or global base); v by a hook on v_proj.
Layer 0 slides (window 512), layer 5 attends globally.

Usage (venv with torch, transformers, gguf, safetensors; model from data_scripts/get_gemma3_270m.sh):
  /opt/kvlab-py/bin/python data_scripts/make_gemma3_golden.py [--gguf PATH] [--out DIR]
"""
import argparse
import glob
import json
import os
import sys

import torch

from make_smollm2_golden import sha256  # the same file hash as the SmolLM2 golden (this folder)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVLAB_SHARED", os.path.join(REPO, "..", "shared"))
MODELS = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))

TEXT_FILE = "data/niah/PaulGrahamEssays/apple.txt"
N_CHARS = 4000      # the text the tokenizers must agree on
N_TOKENS = 640      # the prompt: BOS + the first 639 ids of the text (past the 512-token window)
TOPK = 16           # top-k logits at every position
GREEDY = 16         # greedy ids after the prompt (decoded past the window)
LAYERS = [0, 5]     # q/k/v: a sliding layer and a global one
POS_STRIDE = 16     # q/k/v positions: 0, 16, 32, ... plus the last one


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/gemma3-270m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gemma3_golden"))
    args = ap.parse_args()

    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.gemma3 import modeling_gemma3

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "gemma3-270m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no Gemma-3-270M GGUF found; run data_scripts/get_gemma3_270m.sh or pass --gguf")
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)

    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    with open(os.path.join(SHARED, TEXT_FILE), encoding="utf-8") as fh:
        text = fh.read()[:N_CHARS]
    text_ids = tok(text).input_ids  # BOS first
    assert text_ids[0] == tok.bos_token_id, text_ids[:3]
    ids = text_ids[:N_TOKENS]
    assert len(ids) == N_TOKENS, len(ids)

    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    assert cfg.model_type == "gemma3_text", cfg.model_type
    assert [cfg.layer_types[l] for l in LAYERS] == ["sliding_attention", "full_attention"], cfg.layer_types

    # q/k post-RoPE, in call order (one call per layer per forward).
    roped = []
    orig = modeling_gemma3.apply_rotary_pos_emb

    def wrapped(q, k, cos, sin, *a, **kw):
        q2, k2 = orig(q, k, cos, sin, *a, **kw)
        roped.append((q2.detach().clone(), k2.detach().clone()))
        return q2, k2

    modeling_gemma3.apply_rotary_pos_emb = wrapped
    vals = {}
    hooks = [model.model.layers[l].self_attn.v_proj.register_forward_hook(
        lambda m, i, o, l=l: vals.__setitem__(l, o.detach().clone())) for l in LAYERS]
    input_ids = torch.tensor([ids], dtype=torch.long)  # [1, T]
    with torch.no_grad():
        logits = model(input_ids, use_cache=False).logits[0].float()  # [T, vocab]
    for h in hooks:
        h.remove()
    modeling_gemma3.apply_rotary_pos_emb = orig
    assert len(roped) == cfg.num_hidden_layers, len(roped)

    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY)
    greedy = out[0, N_TOKENS:].tolist()

    positions = list(range(0, N_TOKENS, POS_STRIDE))
    if positions[-1] != N_TOKENS - 1:
        positions.append(N_TOKENS - 1)
    pos_t = torch.tensor(positions)
    hd, n_kv = cfg.head_dim, cfg.num_key_value_heads
    tensors = {}
    for l in LAYERS:
        q, k = roped[l]  # [1, H, T, d]
        v = vals[l].view(1, N_TOKENS, n_kv, hd).transpose(1, 2)
        tensors[f"layer_{l:02d}_q"] = q[0][:, pos_t].contiguous()
        tensors[f"layer_{l:02d}_k"] = k[0][:, pos_t].contiguous()
        tensors[f"layer_{l:02d}_v"] = v[0][:, pos_t].contiguous()
    top = logits.topk(TOPK, dim=-1)
    tensors["logits_last"] = logits[-1].contiguous()
    tensors["topk_logits"] = top.values.contiguous()

    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "golden.safetensors"))
    meta = {
        "version": 1,
        "generator": "data_scripts/make_gemma3_golden.py",
        "gguf_file": f,
        "gguf_sha256": sha256(gguf),
        "text_file": TEXT_FILE,
        "text": text,
        "text_ids": text_ids,
        "token_ids": ids,
        "topk": TOPK,
        "topk_ids": top.indices.tolist(),
        "argmax": logits.argmax(-1).tolist(),
        "greedy_ids": greedy,
        "layers": LAYERS,
        "positions": positions,
        "sliding_window": cfg.sliding_window,
        "layer_types": cfg.layer_types,
        "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(args.out, "golden.json"), "w") as fh:
        json.dump(meta, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    for n in os.listdir(args.out):
        os.chmod(os.path.join(args.out, n), 0o644)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"wrote {args.out} ({total / 1e6:.2f} MB), argmax[-1]={meta['argmax'][-1]}, greedy={greedy}")


if __name__ == "__main__":
    main()
