#!/usr/bin/env python3
"""Compression while decoding, as NVIDIA kvpress's decoding presses do it, on SmolLM2-135M-Instruct.

Writes tests/fixtures/kvpress_golden/decoding_smollm2.json, which the C++ test compares kvlab's
`--decode-rule compress` (compress/decoding_stream.h) against: a long greedy generation through
PrefillDecodingPress(prefilling_press=KeyDiffPress(r), decoding_press=D) with
  D = DecodingPress(KeyDiffPress(), compression_interval=16, target_size=n_kept after the prefill)
  D = CompressionRatioDecodingPress(KeyDiffPress(), compression_interval=16, target_compression_ratio=r)
at r = 0.75 (a quarter kept) on the two prompts of make_kvpress_golden.py, NEW_TOKENS greedy tokens
with EOS ignored, so that the cache is compressed again every 16 decoded tokens (6 times); and
DecodingPress(SnapKVPress(window 16, kernel 5), compression_interval=32) over 256 greedy tokens (7
times). Recorded: the greedy ids and, per layer and KV head, the positions the cache holds at the end.

One change to kvpress, made here and recorded in the fixture ("cache_order"): the entries a
compression keeps are stored in position order. kvpress stores them in top-k order (descending
score; ScorerPress.compress gathers scores.topk(...).indices), so at the next compression SnapKV's
avg_pool1d over the key axis smooths each score with its neighbours in the previous compression's
ranking rather than in the text, unlike at the prefill; attention itself and KeyDiff's scores do not
depend on the order. kvlab holds entries in position order, and SnapKV pools over positions, as its
paper and kvpress's prefill do.

SnapKV while decoding scores with the last 16 of the hidden states buffered since the last
compression, turned into queries with the RoPE of the step that compresses (its position_embeddings
hold that one position): kvlab's DecodingRule::queries_at_newest reproduces that convention.

Why KeyDiff and not Knorm: RoPE keeps a key's norm, so at layer 0 a token repeated at two positions
ties exactly under Knorm; once top-k breaks such a tie otherwise than kvpress (float rounding), layer
0 holds another token, every later hidden state moves a little, and near-ties deeper flip in turn.
KeyDiff scores a key's direction against the mean direction held, which RoPE does change.

How the held positions are known: the scorer press's `compress` is wrapped on the instance; before
it runs, the positions of the cache it is given are the positions held after the last compression
followed by the tokens decoded since (the cache appends them in order); after it, each returned key
is found bit for bit among the keys it was given (ScorerPress.compress gathers them), which carries
the positions over. Nothing of kvpress's choice is recomputed here. `score` is wrapped too, to record
the near-ties at each cut (tie_band).

Same pinned environment, model, prompts and loop as make_kvpress_golden.py (imported):
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_kvpress_decoding_golden.py [--gguf PATH]
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kvpress_golden as base  # noqa: E402  (sets the offline environment first)
import torch  # noqa: E402

RATIO = 0.75          # kvpress's compression_ratio: the fraction removed
INTERVAL = 16         # decoded tokens between compressions
NEW_TOKENS = 100      # greedy tokens: the first from the prefill, then 99 decode steps (6 compressions)
SNAPKV = {"window_size": 16, "kernel_size": 5}  # its window must be below the 32 buffered hidden states
SNAPKV_INTERVAL = 32  # SnapKV: every 32 decoded tokens ...
SNAPKV_TOKENS = 256   # ... over 256 greedy tokens (7 compressions while decoding)
TIE_RTOL = 1e-5       # scores this close (relative) to the cut's are ties that rounding decides


class Tracker:
    """Per layer, per KV head: the positions of the entries the cache holds, in cache order."""

    def __init__(self):
        self.held = {}    # layer -> per KV head, the positions held after the last compression
        self.newest = {}  # layer -> the newest position the cache held at that compression
        self.band = {}    # layer -> per KV head, positions in an ambiguous cut at some compression

    def wrap(self, press):
        inner = press.compress
        inner_score = press.score
        seen = {}

        def score(module, hidden_states, keys, values, attentions, kwargs):
            seen["scores"] = inner_score(module, hidden_states, keys, values, attentions, kwargs)
            return seen["scores"]

        press.score = score

        def compress(module, hidden_states, keys, values, attentions, kwargs):
            layer = module.layer_idx
            k_len = keys.shape[2]
            pos = kwargs.get("position_ids")
            newest = int(pos.max()) if pos is not None else int(kwargs["cache_position"].max())
            before = self.held.get(layer)
            if before is None:  # the prefill: positions 0 .. k_len - 1
                before = [list(range(k_len)) for _ in range(keys.shape[1])]
            else:  # the held entries, then the tokens decoded since, in order
                extra = k_len - len(before[0])
                before = [b + list(range(newest - extra + 1, newest + 1)) for b in before]
            assert all(len(b) == k_len for b in before), (layer, k_len)
            k2, v2 = inner(module, hidden_states, keys, values, attentions, kwargs)
            k2, v2 = k2.clone(), v2.clone()
            after = []
            band = self.band.setdefault(layer, [set() for _ in range(keys.shape[1])])
            for h in range(keys.shape[1]):
                eq = (k2[0, h][:, None, :] == keys[0, h][None, :, :]).all(-1)  # [m', k_len]
                assert bool((eq.sum(1) == 1).all()), f"layer {layer} head {h}: a kept key not found once"
                idx = eq.int().argmax(1).tolist()
                # Position order (see the module's docstring): the kept entries of this head sorted by position.
                order = sorted(range(len(idx)), key=lambda j: before[h][idx[j]])
                perm = torch.tensor(order, dtype=torch.long)
                k2[0, h], v2[0, h] = k2[0, h][perm].clone(), v2[0, h][perm].clone()
                after.append([before[h][idx[j]] for j in order])
                if k2.shape[2] < k_len:  # the near-ties at the cut, where rounding or top-k's order decides
                    sc = seen["scores"][0, h].double()
                    kth = sc.topk(k2.shape[2]).values[-1]
                    near = ((sc - kth).abs() <= TIE_RTOL * kth.abs()).nonzero().flatten().tolist()
                    if set(near) - set(idx) and set(near) & set(idx):
                        band[h].update(before[h][i] for i in near)
            self.held[layer] = after
            self.newest[layer] = newest
            return k2, v2

        press.compress = compress
        return press

    def positions(self, n_layers, n_heads, total):
        """Held positions at the end: the tracked ones and every token decoded after the last compression."""
        out = []
        for layer in range(n_layers):
            since = list(range(self.newest[layer] + 1, total))  # decoded after the last compression
            out.append([sorted(h + since) for h in self.held[layer]][:n_heads])
        return out


def greedy(model, press, ids, n_new):
    """Prefill inside the press, the first token from the prefill logits, then n_new - 1 decode steps
    inside it too (the decoding press compresses there), positions n, n+1, ...; EOS ignored."""
    from transformers import DynamicCache

    n = ids.shape[1]
    cache = DynamicCache()
    with press(model):
        out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
        generated = [out.logits[0, -1].argmax()]
        for i in range(n_new - 1):
            out = model(input_ids=generated[-1].view(1, 1), past_key_values=cache, position_ids=torch.tensor([[n + i]]))
            generated.append(out.logits[0, -1].argmax())
    return [int(t) for t in generated], [cache.get_seq_length(layer) for layer in range(len(cache))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(base.REPO, "tests", "fixtures", "kvpress_golden",
                                                  "decoding_smollm2.json"))
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
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf)),
                                                 gguf_file=os.path.basename(gguf), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    # (decoding press, scorer, its kwargs, compression interval, greedy tokens)
    runs = [("DecodingPress", "KeyDiffPress", {}, INTERVAL, NEW_TOKENS),
            ("CompressionRatioDecodingPress", "KeyDiffPress", {}, INTERVAL, NEW_TOKENS),
            ("DecodingPress", "SnapKVPress", SNAPKV, SNAPKV_INTERVAL, SNAPKV_TOKENS)]
    configs = []
    for rule, scorer_name, kw, interval, n_new in runs:
        results = []
        for p in base.PROMPTS:
            ids = tok.encode(base.prompt_text(p), add_special_tokens=True).ids[: p["n_tokens"]]
            n = len(ids)
            n_kept = max(1, int(n * (1 - RATIO)))
            tracker = Tracker()
            make = getattr(kvpress, scorer_name)
            prefill = tracker.wrap(make(compression_ratio=RATIO, **kw))
            scorer = tracker.wrap(make(**kw))
            if rule == "DecodingPress":
                dec = kvpress.DecodingPress(base_press=scorer, compression_interval=interval, target_size=n_kept)
            else:
                dec = kvpress.CompressionRatioDecodingPress(base_press=scorer, compression_interval=interval,
                                                            target_compression_ratio=RATIO)
            press = kvpress.PrefillDecodingPress(prefilling_press=prefill, decoding_press=dec)
            with torch.no_grad():
                ids_out, lens = greedy(model, press, torch.tensor([ids], dtype=torch.long), n_new)
            total = n + n_new - 1  # positions the cache has seen
            held = tracker.positions(n_layers, n_heads, total)
            assert all(len(h) == lens[l] for l in range(n_layers) for h in held[l]), "held counts"
            band = [[sorted(tracker.band.get(l, [set()] * n_heads)[h]) for h in range(n_heads)] for l in range(n_layers)]
            results.append({"prompt": p["name"], "ids": ids, "n": n, "prefill_kept": n_kept,
                            "greedy_ids": ids_out, "cache_len_end": lens[0], "held_end": held, "tie_band": band})
            print(f"{rule:30s} {scorer_name:13s} {p['name']:24s} n={n} kept={n_kept} end={lens[0]} ids={ids_out[:6]}",
                  flush=True)
        configs.append({"name": rule, "scorer": scorer_name, "scorer_params": kw, "prefill_compression_ratio": RATIO,
                        "compression_interval": interval, "new_tokens": n_new,
                        "target": "target_size = prefill_kept" if rule == "DecodingPress"
                        else f"max(1, int(tokens seen * (1 - {RATIO})))",
                        "results": results})
    out = {
        "version": 2,
        "generator": "data_scripts/make_kvpress_decoding_golden.py",
        "versions": {"kvpress": pkg_version("kvpress"), "transformers": transformers.__version__,
                     "torch": torch.__version__},
        "model": {"gguf_file": os.path.basename(gguf), "gguf_sha256": base.sha256(gguf)},
        "generation": f"prefill inside the press, first token = argmax of the prefill logits, then {NEW_TOKENS - 1} "
                      "greedy decode steps inside the press at positions n, n+1, ...; EOS ignored",
        "held_end": "per layer, per KV head: the sorted positions the cache holds after the last token",
        "cache_order": "the entries each compression keeps are stored in position order (kvpress: top-k order); "
                       "see the generator's docstring",
        "tie_band": "per layer, per KV head: the positions whose score was within %g (relative) of the cut's at a "
                    "compression (prefill or decoding) where that set held kept and dropped entries: rounding or "
                    "top-k's order decides them" % TIE_RTOL,
        "configs": configs,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(out) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
