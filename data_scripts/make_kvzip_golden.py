#!/usr/bin/env python3
"""Golden KVzip decisions of NVIDIA kvpress (`KVzipPress`) on SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes tests/fixtures/kvpress_golden/kvzip_smollm2.json, which test_kvpress_golden compares kvlab's
`kvzip` against: per config and prompt, the token ids of the reconstruction prompts kvpress built,
the raw reconstruction scores (KVzipPress.score_val before its sinks are raised) of layers 0, 14 and
29, per layer and KV head the kept positions (the complement of module.masked_key_indices), the
near-tie positions at the cut, and the greedy continuation through the compressed cache.

Same pinned environment, model, float32 CPU one-thread set-up, prompt sources and file conventions as
make_kvpress_golden.py (whose helpers this imports; see its docstring), with two differences:
  - the prompts are cut to 316 and 420 tokens, so that kvpress's global cut (int(L*H*n*ratio) entries
    pruned over the whole model) keeps exactly `(1 - ratio) * n` entries per KV head on average, a
    budget kvlab's whole-number per-head budget can name;
  - kvpress's KVzipPress loads a tokenizer with AutoTokenizer.from_pretrained(model.config.name_or_path)
    to build its repeat prompts; here it gets ../shared/tokenizers/smollm2/tokenizer.json, without a
    chat template for the raw prompts (prefix "", prefix_length 0, suffix "\\n") and with the GGUF's
    tokenizer.chat_template for one config ("KVzipPress(chat template)") on the first passage as a
    user turn of that template (prefix = the system turn and the user header, not reconstructed;
    suffix = the end of turn and the assistant header).

Usage:
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_kvzip_golden.py [--gguf PATH] [--out FILE]

kept / tie_band: as make_kvpress_golden.py (hex bit masks; the band of positions within 1e-5 relative
of the cut, listed when it straddles it). KVzip's cut is one over every layer's and KV head's scores
together (layerwise=False: the sinks raised to max + 1, the int(numel * ratio) lowest pruned), or one
per layer over its KV heads (layerwise=True); the band is taken at that cut.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kvpress_golden as base  # noqa: E402  (sets the offline environment, imports torch)

import torch  # noqa: E402

N_TOKENS = {"wikitext2_test_head": 316, "longbench_multi_news_2": 420}
CONFIGS = [  # (name, KVzipPress keyword arguments, chat template)
    ("KVzipPress", {"compression_ratio": 0.5}, False),
    ("KVzipPress", {"compression_ratio": 0.75}, False),
    ("KVzipPress(chunk_size=128)", {"compression_ratio": 0.5, "chunk_size": 128}, False),
    ("KVzipPress(layerwise=True)", {"compression_ratio": 0.5, "layerwise": True}, False),
    ("KVzipPress(chat template)", {"compression_ratio": 0.5}, True),
]
TEMPLATED = "wikitext2_test_head"  # the prompt also given with the chat template (its first 316 tokens)


class _Tokenizers:
    """Stands in for AutoTokenizer inside kvpress.presses.kvzip_press: the SmolLM2 tokenizer file,
    with the GGUF's chat template (tokenizer.chat_template) when `template` is set."""

    path = None
    template = None

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        from transformers import PreTrainedTokenizerFast
        t = PreTrainedTokenizerFast(tokenizer_file=cls.path)
        t.chat_template = cls.template
        return t


def gguf_chat_template(path):
    from gguf import GGUFReader
    field = GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def record_kvzip(press, n_layers, n_kv):
    """Wraps compress_post: keeps the raw scores, then reads each layer's masked_key_indices."""
    rec = {}
    orig = press.compress_post
    orig_prepare = press.prepare

    def prepare(model, tokenizer, *args, **kwargs):
        pairs = orig_prepare(model, tokenizer, *args, **kwargs)
        rec["repeat_ids"] = [r[0].tolist() for _, r in pairs]
        rec["suffix_ids"] = press._suffix_ids[0].tolist()
        rec["prefix_length"] = int(press.prefix_length)
        return pairs

    def compress_post(model):
        raw = press.score_val.detach().clone()  # [L, 1, Hkv, n]
        orig(model)
        n = raw.shape[-1]
        sel = raw.clone()
        sel[..., : press.n_sink] = raw.amax() + 1.0
        kept = []
        for layer in model.model.layers:
            b_idx, h_idx, p_idx = layer.self_attn.masked_key_indices
            mask = torch.ones(n_kv, n, dtype=torch.bool)
            mask[h_idx, p_idx] = False
            kept.append(mask)
        kept = torch.stack(kept)  # [L, Hkv, n]
        s64 = sel[:, 0].double()
        bands = [[[] for _ in range(n_kv)] for _ in range(n_layers)]
        groups = [list(range(n_layers))] if not press.layerwise else [[i] for i in range(n_layers)]
        for g in groups:
            flat = s64[g].flatten()
            k = int(kept[g].sum())
            band = base.kth_band(flat, kept[g].flatten(), k)
            for f in band:
                li, rest = divmod(f, n_kv * n)
                h, p = divmod(rest, n)
                bands[g[li]][h].append(p)
        rec["raw"] = raw[:, 0]
        rec["kept"] = kept
        rec["tie_band"] = bands

    press.compress_post = compress_post
    press.prepare = prepare
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(base.REPO, "tests", "fixtures", "kvpress_golden",
                                                  "kvzip_smollm2.json"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)

    import kvpress  # noqa: F401  (patches the attention functions on import)
    import kvpress.presses.kvzip_press as kvzip_press
    import transformers
    from importlib.metadata import version as pkg_version
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    tok_path = os.path.join(base.SHARED, "tokenizers", "smollm2", "tokenizer.json")
    _Tokenizers.path = tok_path
    kvzip_press.AutoTokenizer = _Tokenizers

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(base.MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")

    tok = Tokenizer.from_file(tok_path)
    prompts = []
    for p in base.PROMPTS:
        n = N_TOKENS[p["name"]]
        ids = tok.encode(base.prompt_text(p), add_special_tokens=True).ids[:n]
        assert len(ids) == n, (p["name"], len(ids))
        prompts.append({"name": p["name"], "source": p["source"], "n_tokens": n,
                        "text": tok.decode(ids, skip_special_tokens=False), "ids": ids})
    # The same passage as a user turn of the GGUF's chat template (rendered by transformers' Jinja),
    # cut to 316 tokens: what kvlab's --protocol context prefills (template prefix + context).
    template = gguf_chat_template(gguf)
    _Tokenizers.template = template
    rendered = _Tokenizers.from_pretrained().apply_chat_template(
        [{"role": "user", "content": base.prompt_text(base.PROMPTS[0])}], tokenize=False)
    ids = tok.encode(rendered, add_special_tokens=True).ids[:N_TOKENS[TEMPLATED]]
    templated = {"name": TEMPLATED + "+chat_template", "source": base.PROMPTS[0]["source"] + " as the user "
                 "message of the GGUF's tokenizer.chat_template (transformers' apply_chat_template)",
                 "n_tokens": len(ids), "text": tok.decode(ids, skip_special_tokens=False), "ids": ids}
    _Tokenizers.template = None

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
        dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]

    configs_out = []
    for name, kw, with_template in CONFIGS:
        results = []
        _Tokenizers.template = template if with_template else None
        for p in [templated] if with_template else prompts:
            press = kvpress.KVzipPress(**kw)
            rec = record_kvzip(press, n_layers, n_kv)
            ids = torch.tensor([p["ids"]], dtype=torch.long)
            with torch.no_grad():
                greedy, _ = base.greedy_pipeline_style(model, press, ids, eos_ids)
            n = len(p["ids"])
            kept = rec["kept"]
            res = {
                "prompt": p["name"],
                "n": n,
                "prefix_length": rec["prefix_length"],
                "suffix_ids": rec["suffix_ids"],
                "repeat_ids": rec["repeat_ids"],
                "n_kept_total": int(kept.sum()),
                "n_kept": [[int(kept[l, h].sum()) for h in range(n_kv)] for l in range(n_layers)],
                "n_ambiguous_heads": sum(len(b) > 0 for row in rec["tie_band"] for b in row),
                "kept": [[base.mask_hex(kept[l, h].nonzero().flatten().tolist(), n) for h in range(n_kv)]
                         for l in range(n_layers)],
                "tie_band": rec["tie_band"],
                "scores": {str(i): [[base.F32(v) for v in row.tolist()] for row in rec["raw"][i]]
                           for i in base.SCORE_LAYERS},
                "greedy_ids": greedy,
            }
            results.append(res)
            print(f"{name:28s} {kw} {p['name']:24s} kept {res['n_kept_total']} "
                  f"ties={res['n_ambiguous_heads']} greedy={greedy[:6]}", flush=True)
        full = {"compression_ratio": 0.0, "layerwise": False, "n_sink": 4, "kvzip_plus_normalization": False,
                "chunk_size": 2048}
        full.update(kw)
        configs_out.append({"name": f"{name}@{kw['compression_ratio']}", "press": "KVzipPress",
                            "chat_template": with_template,
                            "compression_ratio": kw["compression_ratio"], "attn_implementation": "sdpa",
                            "params": full, "results": results})

    out = {
        "version": 1,
        "generator": "data_scripts/make_kvzip_golden.py",
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
        "tokenizer": "../shared/tokenizers/smollm2/tokenizer.json, add_special_tokens=True (adds no BOS), "
                     "no chat template; ids truncated to n_tokens. KVzipPress's own tokenizer: the same file "
                     "(no chat template: prefix '' and suffix '\\n')",
        "reconstruction": "KVzipPress.prepare: per chunk of chunk_size context tokens, the ids "
                          "repeat_ids[i] = tokenize('\\n\\nRepeat the previous context exactly.') (chunk 0) or "
                          "tokenize('\\n\\nRepeat the part of the previous context exactly, starting with') + "
                          "the previous chunk's last 8 ids, then suffix_ids, then the chunk's ids; fed after the "
                          "prefilled cache at positions n, n+1, ...",
        "scores_layers": base.SCORE_LAYERS,
        "scores_note": "KVzipPress.score_val[layer][0] (float32) as compress_post receives it, before the "
                       "first n_sink positions are raised to max + 1: per KV head and position, the max over "
                       "the head's query group and every reconstruction query of the softmax attention over "
                       "(the sinks, the chunk, the reconstruction tokens so far)",
        "tie_band_definition": "positions whose selection score s (sinks raised) satisfies |s - s_k| <= %g * "
                               "|s_k| at the cut (s_k = k-th largest of all layers' and heads' scores, k = the "
                               "number kept; per layer when layerwise), listed when the band holds both kept and "
                               "dropped positions" % base.TIE_RTOL,
        "generation": "as make_kvpress_golden.py (pipeline-style, no question): the prefill inside `with "
                      "press(model)`, KVzip's reconstruction at the context's exit, first token = argmax of the "
                      "uncompressed prefill logits, then greedy decoding through the masked cache, up to %d "
                      "tokens" % base.MAX_NEW_TOKENS,
        "prompts": prompts + [templated],
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
