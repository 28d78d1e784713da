#!/usr/bin/env python3
"""Reference outputs of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) from Hugging Face transformers.

Writes tests/fixtures/qwen25_golden/<prompt>/{golden.json,golden.safetensors} for three prompts,
which tests/model/test_forward.cpp ("Qwen2.5-Coder-0.5B GGUF matches transformers") compares
kvlab's forward pass, tokenizer, chat template and greedy decoding against:

  long   the first N_LONG tokens of a Paul Graham essay no other golden uses (gap.txt), raw text
  chat   a system + user conversation rendered by the model's own chat template (the GGUF's
         tokenizer.chat_template, Jinja, through transformers) with the generation prompt
  code   a short Python snippet (indentation, digits, non-ASCII), raw text

Each prompt's golden.json holds the text, its token ids from transformers' tokenizer (read from the
same GGUF; Qwen adds no BOS), argmax and top-k ids at every position, GREEDY greedy ids after the
prompt (plain argmax through transformers' KV cache, no logits processors, EOS not special), the
layers/positions sliced for q/k/v, versions and the GGUF sha256. golden.safetensors, float32:
  logits_last   [vocab]                         full logits of the last position (long, chat)
  topk_logits   [n_tokens, topk]                logits at the top-k ids, every position
  layer_LL_q    [n_q_heads,  n_pos, head_dim]   post-RoPE (as transformers)
  layer_LL_k    [n_kv_heads, n_pos, head_dim]   post-RoPE
  layer_LL_v    [n_kv_heads, n_pos, head_dim]

transformers dequantizes the GGUF to float32 (gguf-py; qwen2's q/k rows are not permuted); the
model runs in float32 on CPU (eager attention). q/k are recorded where the attention layer applies
RoPE (modeling_qwen2.apply_rotary_pos_emb, wrapped), after the q/k/v biases; v by a hook on v_proj.

Usage (venv with torch, transformers, gguf, accelerate, safetensors; model from
data_scripts/get_qwen25_coder.sh 0.5b):
  /tmp/qvenv/bin/python data_scripts/make_qwen25_golden.py [--gguf PATH] [--out DIR]
"""
import argparse
import glob
import json
import os
import sys

import torch

from make_smollm2_golden import sha256  # the same file hash as the other goldens (this folder)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVLAB_SHARED", os.path.join(REPO, "..", "shared"))
MODELS = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))

LONG_TEXT_FILE = "data/niah/PaulGrahamEssays/gap.txt"
LONG_CHARS = 4000   # the text the tokenizers must agree on
N_LONG = 768        # the long prompt: its first N_LONG ids
CHAT_SYSTEM = "You are a careful senior Python developer. Answer with code first, then one sentence."
CHAT_USER = ("Write a Python function `moving_average(xs, k)` that returns the list of the means of "
             "every window of k consecutive numbers in xs, and raise ValueError when k <= 0.")
CODE_TEXT = '''def parse_price(s: str) -> float:
    """Parses "€1.299,50" or "$1,299.50" into 1299.5."""
    s = s.strip().lstrip("€$£")
    if s.count(",") == 1 and s.rfind(",") > s.rfind("."):
        s = s.replace(".", "").replace(",", ".")
    return float(s.replace(",", ""))


assert parse_price(" $1,299.50 ") == 1299.5  # 2024-05-17: café prices ✓
for i in range(10):
    print(i, parse_price(f"{i * 1000 + 0.25:,.2f}"))
'''
TOPK = 16           # top-k logits at every position
GREEDY = 16         # greedy ids after each prompt
LAYERS = [0, 23]    # q/k/v: the first and the last layer
POS_STRIDE = {"long": 48, "chat": 8, "code": 16}  # q/k/v positions: 0, stride, ... plus the last one
FULL_LAST = {"long": True, "chat": True, "code": False}  # logits_last (600 kB each) or not


def greedy_ids(model, ids, n):
    """Plain argmax decoding through the model's KV cache (no generation config, no EOS stop)."""
    out_ids, margins = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=True)
        for step in range(n):
            last = out.logits[0, -1].float()
            top2 = last.topk(2)
            nxt = int(top2.indices[0])
            out_ids.append(nxt)
            margins.append(float(top2.values[0] - top2.values[1]))
            if step + 1 < n:
                out = model(torch.tensor([[nxt]], dtype=torch.long), past_key_values=out.past_key_values,
                            use_cache=True)
    return out_ids, margins


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/qwen2.5-coder-0.5b/*.gguf)")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "qwen25_golden"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.qwen2 import modeling_qwen2

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "qwen2.5-coder-0.5b", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no Qwen2.5-Coder-0.5B GGUF found; run data_scripts/get_qwen25_coder.sh 0.5b or pass --gguf")
    if args.threads:
        torch.set_num_threads(args.threads)
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)

    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    assert tok.chat_template, "the GGUF carries no chat template"
    with open(os.path.join(SHARED, LONG_TEXT_FILE), encoding="utf-8") as fh:
        long_text = fh.read()[:LONG_CHARS]
    chat_messages = [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": CHAT_USER}]
    chat_text = tok.apply_chat_template(chat_messages, tokenize=False, add_generation_prompt=True)
    # The template's default system prompt (a conversation without one), for the record.
    chat_text_default_system = tok.apply_chat_template(chat_messages[1:], tokenize=False,
                                                       add_generation_prompt=True)
    prompts = {"long": long_text, "chat": chat_text, "code": CODE_TEXT}

    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    assert cfg.model_type == "qwen2", cfg.model_type
    assert cfg.num_hidden_layers == 24 and cfg.num_attention_heads == 14 and cfg.num_key_value_heads == 2
    assert not getattr(cfg, "use_sliding_window", False)
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    file_sha = sha256(gguf)

    summary = []
    for name, text in prompts.items():
        text_ids = tok(text).input_ids
        assert text_ids[0] != tok.bos_token_id or text.startswith("<|endoftext|>"), text_ids[:3]
        ids = text_ids[:N_LONG] if name == "long" else text_ids
        assert name != "long" or len(ids) == N_LONG, len(ids)
        T = len(ids)

        roped = []
        orig = modeling_qwen2.apply_rotary_pos_emb

        def wrapped(q, k, cos, sin, *a, **kw):
            q2, k2 = orig(q, k, cos, sin, *a, **kw)
            roped.append((q2.detach().clone(), k2.detach().clone()))
            return q2, k2

        modeling_qwen2.apply_rotary_pos_emb = wrapped
        vals = {}
        hooks = [model.model.layers[l].self_attn.v_proj.register_forward_hook(
            lambda m, i, o, l=l: vals.__setitem__(l, o.detach().clone())) for l in LAYERS]
        try:
            with torch.no_grad():
                logits = model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()
        finally:
            for h in hooks:
                h.remove()
            modeling_qwen2.apply_rotary_pos_emb = orig
        assert len(roped) == cfg.num_hidden_layers, len(roped)
        greedy, margins = greedy_ids(model, ids, GREEDY)

        positions = list(range(0, T, POS_STRIDE[name]))
        if positions[-1] != T - 1:
            positions.append(T - 1)
        pos_t = torch.tensor(positions)
        tensors = {}
        for l in LAYERS:
            q, k = roped[l]  # [1, H, T, d]
            v = vals[l].view(1, T, n_kv, hd).transpose(1, 2)
            tensors[f"layer_{l:02d}_q"] = q[0][:, pos_t].contiguous()
            tensors[f"layer_{l:02d}_k"] = k[0][:, pos_t].contiguous()
            tensors[f"layer_{l:02d}_v"] = v[0][:, pos_t].contiguous()
        top = logits.topk(TOPK, dim=-1)
        if FULL_LAST[name]:
            tensors["logits_last"] = logits[-1].contiguous()
        tensors["topk_logits"] = top.values.contiguous()
        top2 = logits.topk(2, dim=-1).values
        argmax_margin = float((top2[:, 0] - top2[:, 1]).min())

        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        save_file(tensors, os.path.join(out, "golden.safetensors"))
        meta = {
            "version": 1,
            "generator": "data_scripts/make_qwen25_golden.py",
            "prompt": name,
            "gguf_file": f,
            "gguf_sha256": file_sha,
            "text_file": LONG_TEXT_FILE if name == "long" else None,
            "text": text,
            "text_ids": text_ids,
            "token_ids": ids,
            "topk": TOPK,
            "topk_ids": top.indices.tolist(),
            "argmax": logits.argmax(-1).tolist(),
            "argmax_min_margin": argmax_margin,
            "greedy_ids": greedy,
            "greedy_margins": margins,
            "greedy_text": tok.decode(greedy),
            "layers": LAYERS,
            "positions": positions,
            "n_q_heads": n_q, "n_kv_heads": n_kv, "head_dim": hd,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": getattr(cfg, "rope_theta", None),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
        }
        if name == "chat":
            meta["messages"] = chat_messages
            meta["text_default_system"] = chat_text_default_system
        with open(os.path.join(out, "golden.json"), "w") as fh:
            json.dump(meta, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        for n in os.listdir(out):
            os.chmod(os.path.join(out, n), 0o644)
        summary.append(f"{name}: T={T} argmax[-1]={meta['argmax'][-1]} min margin={argmax_margin:.4g} "
                       f"greedy={greedy} ({meta['greedy_text']!r}, min margin {min(margins):.4g})")

    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(args.out, "*", "*")))
    print(f"wrote {args.out} ({total / 1e6:.2f} MB)")
    for s in summary:
        print("  " + s)


if __name__ == "__main__":
    main()
