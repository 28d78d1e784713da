#!/usr/bin/env python3
"""Tiny random Hugging Face models of each supported architecture, with transformers' logits and
post-RoPE q/k/v, for tests/model/test_forward.cpp ("tiny HF architectures match transformers").

For each case writes tests/fixtures/tiny_models/<name>/:
  config.json, model.safetensors   the model (float32, HF tensor names)
  expected.safetensors             logits [T, vocab] and layer_01_{q,k,v} ([H, T, head_dim], post-RoPE)
  expected.json                    the token ids
Cases cover what SmolLM2 and stories260K do not: qwen2 (q/k/v bias, untied lm_head), llama with
attention_bias, an explicit head_dim != hidden/heads and llama3 rope scaling, llama with linear
rope scaling, mistral; and sliding-window attention (issue 24) with prompts longer than the window:
mistral with sliding_window 8 on 40 tokens, qwen2 with use_sliding_window (window 8, layer 1
slides, layer 0 does not: max_window_layers 1); qwen3 (q/k norms, explicit head_dim); phi3 (fused
qkv_proj and gate_up_proj), without and with a sliding window of 8 on 40 tokens; gemma3 (three
layers: two sliding through a window of 8 with their own RoPE base, then a global one with linear
rope scaling; query_pre_attn_scalar != head_dim, sandwich norms, gelu-tanh, scaled embeddings)
on 40 tokens, whose q is saved as transformers computes it, before kvlab folds
sqrt(head_dim / query_pre_attn_scalar) into it (`query_scale` in expected.json). The cases
with their own seed also write `greedy_ids`: 8 greedy tokens after the prompt, each chosen by a
full forward over everything so far (no cache).

Usage: /opt/kvlab-py/bin/python data_scripts/make_tiny_model_fixtures.py [CASE ...]
  (no CASE: every case; the first four draw from one seed in order, the later ones seed their own)
"""
import json
import os

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "tiny_models")
T = 37  # odd on purpose

BASE = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, vocab_size=97, max_position_embeddings=256, rms_norm_eps=1e-5,
            bos_token_id=1, eos_token_id=2)

CASES = {
    "qwen2": ("qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=False)),
    "llama3_bias_hd": ("llama", dict(head_dim=16, attention_bias=True, rope_theta=500000.0,
                                     tie_word_embeddings=False,
                                     rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})),
    "llama_linear": ("llama", dict(rope_theta=10000.0, tie_word_embeddings=True,
                                   rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral": ("mistral", dict(rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False)),
    # (model_type, config, prompt length, own seed)
    "mistral_sw8": ("mistral", dict(rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False),
                    40, 8),
    "qwen2_sw8": ("qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=True,
                                sliding_window=8, max_window_layers=1), 40, 9),
    # qwen3: per-head q/k RMSNorm before RoPE, explicit head_dim (16, not 48 / 6)
    "qwen3": ("qwen3", dict(head_dim=16, rope_theta=1000000.0, tie_word_embeddings=False), 37, 10),
    # phi3: fused qkv_proj and gate_up_proj; sliding_window set = every layer slides
    "phi3": ("phi3", dict(rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None,
                          pad_token_id=0), 37, 11),
    "phi3_sw8": ("phi3", dict(rope_theta=10000.0, tie_word_embeddings=False, sliding_window=8,
                              pad_token_id=0), 40, 12),
    "gemma3_sw8": ("gemma3_text", dict(
        num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
        tie_word_embeddings=True, pad_token_id=0), 40, 13),
}
GREEDY = 8
GGUF_CASES = {"qwen3", "phi3"}  # also written as model.gguf (F32, llama.cpp names) by gguf-py


def write_gguf(path, model_type, cfg, state):
    """The HF weights under llama.cpp's tensor names and <arch>.* keys (qwen3: no q/k permutation)."""
    import gguf
    w = gguf.GGUFWriter(str(path), model_type)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_uint32(f"{model_type}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{model_type}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{model_type}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{model_type}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_uint32(f"{model_type}.attention.key_length", hd)
    w.add_uint32(f"{model_type}.attention.value_length", hd)
    w.add_uint32(f"{model_type}.rope.dimension_count", hd)
    w.add_uint32(f"{model_type}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{model_type}.context_length", cfg.max_position_embeddings)
    w.add_float32(f"{model_type}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{model_type}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    if getattr(cfg, "sliding_window", None):
        w.add_uint32(f"{model_type}.attention.sliding_window", cfg.sliding_window)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                 "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
                 # phi3: fused, stored as they are (llama.cpp's converter does not reorder them)
                 "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            if f"model.layers.{i}.{hf}" in state:
                names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    for hf, gg in names.items():
        w.add_tensor(gg, state[hf].detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    import sys
    only = set(sys.argv[1:])
    torch.manual_seed(0)
    skipped_shared = False
    for name, (model_type, extra, *own) in CASES.items():
        t = own[0] if own else T
        if own:
            torch.manual_seed(own[1])
        if only and name not in only:
            skipped_shared |= not own
            continue
        if skipped_shared and not own:
            raise SystemExit(f"{name} draws from the shared seed after a skipped case: give every "
                             "case before it too")
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        cfg = AutoConfig.for_model(model_type, **{**BASE, **extra})
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        with torch.no_grad():  # larger weights than the init so errors show
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.2 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
        model.save_pretrained(d, safe_serialization=True)
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors", "model.gguf"):
                os.remove(os.path.join(d, f))
        ids = torch.randint(3, BASE["vocab_size"], (1, t))
        ids[0, 0] = 1
        # post-RoPE q/k/v of layer 1 by hooking the attention inputs and recomputing.
        got = {}
        attn = model.model.layers[1].self_attn
        hook = attn.register_forward_hook(
            lambda m, args, kwargs, out: got.update(h=kwargs["hidden_states"],
                                                    pe=kwargs["position_embeddings"]),
            with_kwargs=True)
        with torch.no_grad():
            logits = model(ids).logits[0]  # [T, vocab]
            hook.remove()
            hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            h = got["h"]
            if hasattr(attn, "qkv_proj"):  # phi3: fused rows q, k, v
                nq, nk = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
                qkv = attn.qkv_proj(h)
                q = qkv[..., :nq].view(1, t, -1, hd).transpose(1, 2)
                k = qkv[..., nq:nq + nk].view(1, t, -1, hd).transpose(1, 2)
                v = qkv[..., nq + nk:].view(1, t, -1, hd).transpose(1, 2)
            else:
                q = attn.q_proj(h).view(1, t, -1, hd).transpose(1, 2)
                k = attn.k_proj(h).view(1, t, -1, hd).transpose(1, 2)
                v = attn.v_proj(h).view(1, t, -1, hd).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # qwen3, gemma3: RMSNorm over head_dim before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
            cos, sin = got["pe"]
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        save_file({"logits": logits.contiguous(), "layer_01_q": q[0].contiguous(),
                   "layer_01_k": k[0].contiguous(), "layer_01_v": v[0].contiguous()},
                  os.path.join(d, "expected.safetensors"))
        expected = {"token_ids": ids[0].tolist(), "model_type": model_type}
        if getattr(cfg, "query_pre_attn_scalar", None):
            expected["query_scale"] = (hd / cfg.query_pre_attn_scalar) ** 0.5
        if own:  # greedy continuation by full recompute: the definition, no cache involved
            seq = ids.clone()
            with torch.no_grad():
                for _ in range(GREEDY):
                    nxt = model(seq, use_cache=False).logits[0, -1].argmax()
                    seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
            expected["greedy_ids"] = seq[0, t:].tolist()
            expected["sliding_window"] = extra.get("sliding_window")
        if name in GGUF_CASES:
            write_gguf(os.path.join(d, "model.gguf"), model_type, cfg, model.state_dict())
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected, f)
            f.write("\n")
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o644)
        print(name, sorted(os.listdir(d)), sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)))


if __name__ == "__main__":
    main()
