#!/usr/bin/env python3
"""Golden KVCompose decisions of NVIDIA kvpress (`KVComposePress`) on SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes tests/fixtures/kvpress_golden/kvcompose_smollm2.json, which test_kvpress_golden compares kvlab's
`kvcompose` against. KVCompose (Akulov et al. 2025, arXiv:2509.05165) feeds the context to the model a
second time after itself (eager attention over the first pass's cache and the repeat so far) and
scores each context entry per query head by the most attention any repeat query gives it; the scores
are averaged over each KV group, the mean over the layer's KV heads is added, and one cut over every
layer's "composite" scores (per layer: the mean over its KV heads of their scores sorted descending;
layer 0's row raised to the maximum over layers) decides how many tokens each layer keeps
(structured: the same count for every KV head of a layer, each head keeping its own best; unstructured:
one count per head).

Per config and prompt it records:
  scores         KVComposePress.scores after enhance_scores, [L][Hkv][n] for layers 0, 14 and 29
                 (float32, as prepare_important_masks ranks them);
  n_kept_target  compute_n_kept(L * n, compression_ratio) (structured) or (L * Hkv * n, ...) (unstructured);
  n_kept         per layer and KV head, the count kept; kept: per layer and KV head, hex bit masks
                 (important_mask_per_kv_head; make_kvpress_golden.py's format);
  count_tie      whether the cross-layer cut falls on a near-tie (within 1e-5 relative) that spans
                 two layers (or heads): then a count may move by one between them and the test
                 compares counts up to that;
  tie_band       per layer and KV head, the positions within 1e-5 (relative) of the head's own cut
                 when that band straddles it (kth_band);
  greedy_ids     the continuation through the compressed cache (make_kvpress_golden.py's
                 greedy_pipeline_style: no question; first token from the uncompressed prefill).

Same pinned environment (/opt/kvpress-py: kvpress 0.5.5), model (float32 CPU, one thread), prompt
sources and conventions as make_kvpress_golden.py and make_kvzip_golden.py (whose 316- and 420-token
prompts are reused: int(L * n * (1 - ratio)) is a whole number of tokens per layer at ratios 0.5 and 0.75).

Unstructured (structured=False), kvpress masks the pruned context entries (compress_unstructured sets
masked_key_indices) but leaves the second pass's n tokens in the cache: decoding then attends to the
whole repeated context at positions n .. 2n-1 as well (cache_lengths_after_prefill = 2n on every
layer; structured runs cut the cache to the context's kept entries). Its greedy ids are those of
that cache, not of the compressed one: "greedy_comparable" is false there, and kvlab's test compares
the kept sets and counts only.

kvpress leaves an unstructured run's masked_key_indices on the attention modules and KVCompose's
eager passes do not reset them (the patched attention does so at a prefill, and eager attention is
not patched): the script clears them before every run, or the run after an unstructured one decodes
with its masks.

Usage:
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_kvcompose_golden.py [--gguf PATH] [--out FILE]
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kvpress_golden as base  # noqa: E402  (sets the offline environment, imports torch)
import make_kvzip_golden as kvzip_golden  # noqa: E402

import torch  # noqa: E402

CONFIGS = [  # (name, KVComposePress keyword arguments)
    ("KVComposePress", {"compression_ratio": 0.5}),
    ("KVComposePress", {"compression_ratio": 0.75}),
    ("KVComposePress(structured=False)", {"compression_ratio": 0.5, "structured": False}),
    ("KVComposePress(add_mean_across_heads=False)", {"compression_ratio": 0.5, "add_mean_across_heads": False}),
    ("KVComposePress(keep_token_lower_bound=64)", {"compression_ratio": 0.75, "keep_token_lower_bound": 64}),
]


def record_kvcompose(press):
    """Wraps compute_important_per_layer and prepare_important_masks to copy what they decide."""
    rec = {}
    orig_important = press.compute_important_per_layer
    orig_prepare = press.prepare_important_masks

    def compute_important_per_layer():
        rec["scores"] = press.scores.detach().clone()  # [L, Hkv, n] after enhance_scores
        orig_important()
        rec["composite_per_layer"] = press.composite_scores_per_layer.detach().clone()  # [L, n]
        rec["composite_per_head"] = press.composite_scores_per_head.detach().clone()  # [L, Hkv, n]
        rec["per_layer"] = [int(x) for x in press.important_per_layer]
        rec["per_head"] = press.important_per_head.tolist()

    def prepare_important_masks():
        orig_prepare()
        rec["kept"] = torch.stack([torch.stack(row) for row in press.important_mask_per_kv_head])  # [L, Hkv, n]

    press.compute_important_per_layer = compute_important_per_layer
    press.prepare_important_masks = prepare_important_masks
    return rec


def count_tie(composite, n_kept):
    """Whether the top-n_kept cut of the flattened composite falls among near-equal values lying in
    more than one row (layer or head): then top-k's tie-breaking decides which row gets the token."""
    flat = composite.double().flatten()
    if n_kept <= 0 or n_kept >= flat.numel():
        return False
    s = torch.sort(flat, descending=True).values
    kth, nxt = float(s[n_kept - 1]), float(s[n_kept])
    tol = base.TIE_RTOL * abs(kth) if kth != 0 else 1e-30
    if abs(kth - nxt) > tol:
        return False
    band = ((flat - kth).abs() <= tol).nonzero().flatten() // composite.shape[-1]
    return bool(band.unique().numel() > 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(base.REPO, "tests", "fixtures", "kvpress_golden",
                                                  "kvcompose_smollm2.json"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)

    import kvpress
    import transformers
    from importlib.metadata import version as pkg_version
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(base.MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")

    tok = Tokenizer.from_file(os.path.join(base.SHARED, "tokenizers", "smollm2", "tokenizer.json"))
    prompts = []
    for p in base.PROMPTS:
        n = kvzip_golden.N_TOKENS[p["name"]]
        ids = tok.encode(base.prompt_text(p), add_special_tokens=True).ids[:n]
        assert len(ids) == n, (p["name"], len(ids))
        prompts.append({"name": p["name"], "source": p["source"], "n_tokens": n,
                        "text": tok.decode(ids, skip_special_tokens=False), "ids": ids})

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
        dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]

    configs_out = []
    for name, kw in CONFIGS:
        results = []
        for p in prompts:
            press = kvpress.KVComposePress(**kw)
            rec = record_kvcompose(press)
            # kvpress leaves an unstructured run's masked_key_indices on the attention modules, and
            # KVCompose's eager passes do not go through the patched attention that resets them at a
            # prefill: the next run would decode with the previous run's masks. Clear them.
            for layer in model.model.layers:
                layer.self_attn.masked_key_indices = None
            ids = torch.tensor([p["ids"]], dtype=torch.long)
            with torch.no_grad():
                greedy, prefill_lens = base.greedy_pipeline_style(model, press, ids, eos_ids)
            n = len(p["ids"])
            kept = rec["kept"]
            structured = kw.get("structured", True)
            counts = [[int(kept[l, h].sum()) for h in range(n_kv)] for l in range(n_layers)]
            want = rec["per_layer"] if structured else rec["per_head"]
            for l in range(n_layers):
                for h in range(n_kv):
                    assert counts[l][h] == (want[l] if structured else want[l][h]), (l, h)
            if structured:  # the cache itself holds each layer's count
                assert prefill_lens == [c[0] for c in counts], (prefill_lens, counts)
            else:  # masks over the context, and the repeat left in the cache after it (see the docstring)
                assert prefill_lens == [2 * len(p["ids"])] * n_layers, prefill_lens
            n_target = (n_layers if structured else n_layers * n_kv) * n
            composite = rec["composite_per_layer"] if structured else rec["composite_per_head"]
            scores = rec["scores"]
            bands = [[base.kth_band(scores[l, h].double(), kept[l, h], counts[l][h]) for h in range(n_kv)]
                     for l in range(n_layers)]
            res = {
                "prompt": p["name"],
                "n": n,
                "n_kept_target": max(1, int(n_target * (1 - kw["compression_ratio"]))),
                "n_kept": counts,
                "count_tie": count_tie(composite, max(1, int(n_target * (1 - kw["compression_ratio"])))),
                "n_ambiguous_heads": sum(len(b) > 0 for row in bands for b in row),
                "kept": [[base.mask_hex(kept[l, h].nonzero().flatten().tolist(), n) for h in range(n_kv)]
                         for l in range(n_layers)],
                "tie_band": bands,
                "scores": {str(i): [[base.F32(v) for v in row.tolist()] for row in scores[i]]
                           for i in base.SCORE_LAYERS},
                "greedy_ids": greedy,
                "greedy_comparable": structured,
                "cache_lengths_after_prefill": prefill_lens,
            }
            results.append(res)
            per_layer = [sum(c) // n_kv for c in counts]
            print(f"{name:44s} {kw} {p['name']:24s} per-layer {per_layer[:6]}... total {sum(map(sum, counts))} "
                  f"count_tie={res['count_tie']} ties={res['n_ambiguous_heads']} greedy={greedy[:6]}", flush=True)
        full = {"structured": True, "compression_ratio": 0.0, "agg_task": "max", "agg_group": "mean",
                "agg_head": "mean", "add_v_norm": False, "add_mean_across_heads": True, "keep_token_lower_bound": 0}
        full.update(kw)
        configs_out.append({"name": f"{name}@{kw['compression_ratio']}", "press": "KVComposePress",
                            "compression_ratio": kw["compression_ratio"], "params": full, "results": results})

    out = {
        "version": 1,
        "generator": "data_scripts/make_kvcompose_golden.py",
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
            "dtype": "float32 (dequantized by transformers/gguf-py), CPU, 1 thread; KVComposePress switches "
                     "to eager attention for its two passes",
            "n_layers": n_layers, "n_q_heads": cfg.num_attention_heads, "n_kv_heads": n_kv,
            "eos_token_id": eos_ids,
        },
        "tokenizer": "../shared/tokenizers/smollm2/tokenizer.json, add_special_tokens=True (adds no BOS), "
                     "no chat template; ids truncated to n_tokens",
        "scores_layers": base.SCORE_LAYERS,
        "scores_note": "KVComposePress.scores after enhance_scores (float32): per KV head and position, the "
                       "mean over the head's query group of the max over the repeat's queries of the softmax "
                       "attention (over the n cached entries and the repeat so far), plus (add_mean_across_heads) "
                       "the mean of that over the layer's KV heads",
        "tie_band_definition": "per layer and KV head, positions whose score s satisfies |s - s_k| <= %g * |s_k| "
                               "(s_k = the head's k-th largest score, k = its count), listed when the band holds "
                               "both kept and dropped positions" % base.TIE_RTOL,
        "generation": "as make_kvpress_golden.py (pipeline-style, no question): the prefill inside `with "
                      "press(model)` (KVCompose's second pass runs inside it), the cache compressed at the "
                      "context's exit, first token = argmax of the uncompressed prefill logits, then greedy "
                      "decoding at positions n, n+1, ... up to %d tokens" % base.MAX_NEW_TOKENS,
        "prompts": prompts,
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
