#!/usr/bin/env python3
"""Golden KV-cache-compression decisions of NVIDIA kvpress on SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes tests/fixtures/kvpress_golden/smollm2.json (and, with --only, smollm2_added.json: the
presses added later, ADDED below), which a C++ test compares kvlab's compression
methods against: for a set of kvpress presses at compression_ratio 0.5 and 0.75 and two prompts it
records, per layer and KV head, which prompt positions kvpress keeps after the prefill, the raw
scores of layers 0, 14 and 29, the near-tie positions at the top-k boundary, and the greedy
continuation decoded through the compressed cache.

Pinned versions (a separate venv, so that kvpress's transformers pin does not touch /opt/kvlab-py):
  python3 -m venv /opt/kvpress-py
  /opt/kvpress-py/bin/pip install kvpress==0.5.5 gguf
    -> kvpress 0.5.5, transformers 5.2.0, torch 2.15.0, gguf 0.19.0 (recorded in the fixture)

Usage:
  nice -n 10 /opt/kvpress-py/bin/python data_scripts/make_kvpress_golden.py [--gguf PATH] [--out FILE]
  ... --only CURPress    (a press added later: run alone, added to smollm2_added.json, which has
                          the same header; CURPress, ChunkKVPress(...), ChunkPress(...),
                          CapPress, BlockPress(...), PerLayerCompressionPress(...) and
                          EntropyGatedChunkKVPress(...), MergingPress(...), SimLayerKVPress(...),
                          DMSPress(...), ThinKPress(...), ComposedPress(...) and
                          FinchPress(...) were added so)

ThinKPress (alone, and after SnapKVPress inside ComposedPress) also records, per layer and KV head,
the key channels it zeroes ("pruned_channels") and their tie band at the cut ("channel_tie_band").

FinchPress (SnapKV-style scores over a question window, normalized, no kernel; rerotate_keys=False:
the kept keys are gathered as they are) takes its window from a delimiter token between context and
question: its embed_tokens forward hook finds the delimiter id in the prefill's input ids, sets
window_size to the number of tokens after it and drops the delimiter's row from the embeddings, so
the model and the cache see the n real tokens only. Here the question is the prompt's last 24 tokens
(FINCH_WINDOW): FINCH runs on its own copy of the model (finch_model) whose embed_tokens has one more
row (zeros, id = vocab_size = the delimiter id; lm_head and the logits keep the original vocabulary,
the other configs' model is untouched), the prefill is ids[:n-24] + [delimiter] + ids[n-24:], and
decoding continues at positions n, n+1, ... of the n real tokens. Each result records "window": 24.
The model.generate cross-check runs on the prompt without the delimiter, with window_size preset to
24 (the hook finds no delimiter and leaves it): the same compression, noted in the config's
"generate_crosscheck_note".

Model: transformers dequantizes the GGUF to float32 (gguf-py), the model runs in float32 on CPU with
one thread (deterministic: two runs give a byte-identical file). attn_implementation is "sdpa" for
every press except ObservedAttentionPress, which needs the attention weights ("eager"); AdaKVPress
refuses "eager". With sdpa the attention-based presses (TOVA, SnapKV) recompute the attention of
their observation window themselves (SnapKVPress.compute_window_attention), as kvpress does by default.

CompactorPress runs with sketch_dimension = head_dim (64) and its random sketch replaced by the
identity (install_identity_sketch): kvpress draws the sketch from torch's global generator, which no
other implementation can replay; with the identity the leverage scores are exact (with kvpress's
1e-2 ridge) and kvlab's `compactor sketch_dimension=0` must equal them; LeverageScorePress (the
leverage half alone) likewise, against `compactor sink_start=0 sink_end=0 attention=false`.

Prompts: token ids of fixed passages from ../shared/data (first N tokens; SmolLM2 tokenizer from
../shared/tokenizers/smollm2/tokenizer.json with add_special_tokens=True, which adds no BOS for this
tokenizer; no chat template). The ids are recorded, so the C++ side needs no tokenizer.

How the kept positions were recovered: the press's `score` method is wrapped on the instance (the
inner press's for AdaKVPress) to keep a copy of the scores it returns, and `compress` is wrapped
to see its input keys and its output. For a ScorerPress the kept indices are recomputed exactly
as ScorerPress.compress does (scores.topk(n_kept, dim=-1), n_kept = max(1, int(n * (1 - ratio))))
and verified to reproduce the compressed cache bit for bit (keys.gather(2, idx) == returned keys);
they are then sorted. AdaKVPress (and CriticalAdaKVPress, AdaKV's budgets with CriticalKV's two stages per head) does not shrink the cache: it stores the pruned entries in
module.masked_key_indices = (batch_idx, kv_head_idx, position) and, while decoding, kvpress's
attention patch overwrites those keys with a fake key whose attention weight underflows to 0;
`kept` is the complement of that set per KV head, so n_kept differs between heads.

Generation ("greedy_ids"): as KVPressTextGenerationPipeline._forward/generate_answer do, without a
question: the whole prompt is prefilled inside `with press(model):` (hooks compress each layer's
cache after its attention, so the prefill logits are those of the uncompressed model), the first
token is the argmax of the last prefill logits, then up to 31 more greedy tokens are decoded outside
the press context through the compressed cache with explicit position_ids n, n+1, ... (original
positions; no attention mask), stopping after an EOS token like the pipeline. As a cross-check the
same is run through `with press(model): model.generate(do_sample=False, max_new_tokens=32)`; the
fixture's metadata says whether both gave the same tokens.

kept: per layer and KV head, a bit mask of the kept positions as a hex string (version 2; the
position lists of version 1 made the file 3.2 MB): character i stands for positions 4i .. 4i+3,
position 4i + b kept when bit b (value 1 << b) of its hex digit is set.

tie_band: per layer and KV head, the positions whose selection score is within 1e-5 (relative) of
the k-th largest score (k = n_kept), recorded only when that set holds both kept and dropped
positions (an ambiguous cut, where top-k's tie-breaking or float rounding decides); otherwise [].
A test should require equality of the kept sets outside tie_band (and equal counts).
For AdaKVPress the selection scores are the safeguarded scores, ranked across all KV heads of a
layer; its band is the union of that global cut's band and, where it matters (a position in it is
not clearly above the global cut by its raw score), the band of each head's safeguard cut.
CriticalAdaKVPress adds the band of each head's stage-1 cut (its max(int(B_h * first_stage_ratio),
n_safe) best raw scores) where that cut falls among tied scores, and every group of equal raw scores
(within 1e-6) holding both kept and dropped positions: stage 2's (s + eps) * |W_o v|_1 ties there
whenever the values are equal too (the same token on layer 0).

Scores are float32, written as the shortest decimal that reads back to the same float32. To keep the
file small, a result whose recorded scores are bitwise identical to those of the same press and
prompt at compression_ratio 0.5 (every press but StreamingLLMPress) has "scores_same_as": <config
name> instead of "scores". The configs in NO_SCORES (CriticalKVPress) have "scores_not_recorded".
"""
import argparse
import dataclasses
import glob
import hashlib
import json
import math
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVLAB_SHARED", os.path.join(REPO, "..", "shared"))
MODELS = os.environ.get("KVLAB_MODELS", os.path.join(REPO, "models"))

RATIOS = [0.5, 0.75]
SCORE_LAYERS = [0, 14, 29]
MAX_NEW_TOKENS = 32
TIE_RTOL = 1e-5
# CriticalAdaKV's stage 2: raw scores this close are one token's at two positions (float32 rounding
# of a rotated key's norm), whose equal values tie the reweighted scores too.
SAME_SCORE_RTOL = 1e-6
# Configs whose scores are not written (the file stays under 2 MiB; their kept sets are the check).
NO_SCORES = {"CriticalKVPress(KnormPress)", "CriticalKVPress(SnapKVPress)", "CriticalAdaKVPress(KnormPress)",
             "CriticalAdaKVPress(SnapKVPress)", "NonCausalAttnPress",
             "LeverageScorePress(sketch_dimension=64, identity sketch)", "CURPress",
             "ChunkKVPress(KnormPress)", "ChunkKVPress(SnapKVPress)", "ChunkPress(KnormPress, chunk_length=128)",
             "BlockPress(KeyDiffPress, block_size=64)", "EntropyGatedChunkKVPress(KnormPress)",
             "EntropyGatedChunkKVPress(SnapKVPress)", "MergingPress(KnormPress)",
             "MergingPress(SnapKVPress, similarity_threshold=0.2, merge_fraction=0.75)",
             "SimLayerKVPress(lazy_threshold=0.55, n_recent=64)",
             "DMSPress(KnormPress, threshold=-17, sliding_window_size=64)",
             "DMSPress(SnapKVPress, threshold=0.0005, sliding_window_size=64)",
             "ThinKPress(key_channel_compression_ratio=0.5)",
             "ComposedPress(SnapKVPress, ThinKPress(0.5))",
             "FinchPress(question=last 24, rerotate_keys=False)"}


# Configs added after the main fixture was made: they live in smollm2_added.json (--only), which
# keeps the main file under 2 MiB; a run without --only leaves them out.
ADDED = {"CURPress", "ChunkKVPress(KnormPress)", "ChunkKVPress(SnapKVPress)", "ChunkPress(KnormPress, chunk_length=128)",
         "CapPress", "BlockPress(KeyDiffPress, block_size=64)", "PerLayerCompressionPress(SnapKVPress, linear)",
         "EntropyGatedChunkKVPress(KnormPress)", "EntropyGatedChunkKVPress(SnapKVPress)", "MergingPress(KnormPress)",
         "MergingPress(SnapKVPress, similarity_threshold=0.2, merge_fraction=0.75)",
         "SimLayerKVPress(lazy_threshold=0.55, n_recent=64)",
         "DMSPress(KnormPress, threshold=-17, sliding_window_size=64)",
         "DMSPress(SnapKVPress, threshold=0.0005, sliding_window_size=64)",
         "ThinKPress(key_channel_compression_ratio=0.5)",
         "ComposedPress(SnapKVPress, ThinKPress(0.5))",
         "FinchPress(question=last 24, rerotate_keys=False)"}

# FinchPress: the question window, the prompt's last FINCH_WINDOW tokens (after the delimiter).
FINCH_WINDOW = 24


# (name, source description, loader) -> first n_tokens token ids
PROMPTS = [
    {"name": "wikitext2_test_head", "source": "data/wikitext2/wiki.test.raw (from the start)",
     "n_tokens": 317},
    {"name": "longbench_multi_news_2", "source": "data/longbench/multi_news.jsonl record 2 "
     "(_id 82cafb9831bcafa681b45205a34677e2bf6b6c2fb992649f), field 'context'", "n_tokens": 421},
]


def prompt_text(p):
    if p["name"] == "wikitext2_test_head":
        with open(os.path.join(SHARED, "data", "wikitext2", "wiki.test.raw"), encoding="utf-8") as f:
            return f.read(20000)
    with open(os.path.join(SHARED, "data", "longbench", "multi_news.jsonl"), encoding="utf-8") as f:
        rec = json.loads(f.readlines()[2])
    assert rec["_id"] == "82cafb9831bcafa681b45205a34677e2bf6b6c2fb992649f", rec["_id"]
    return rec["context"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_configs(kvpress):
    """(config name, press factory(ratio), attn_implementation)"""
    cfgs = [
        ("StreamingLLMPress", lambda r: kvpress.StreamingLLMPress(compression_ratio=r, n_sink=4), "sdpa"),
        ("KnormPress", lambda r: kvpress.KnormPress(compression_ratio=r), "sdpa"),
        ("TOVAPress", lambda r: kvpress.TOVAPress(compression_ratio=r), "sdpa"),
        ("SnapKVPress", lambda r: kvpress.SnapKVPress(compression_ratio=r, window_size=32, kernel_size=5),
         "sdpa"),
        ("ObservedAttentionPress", lambda r: kvpress.ObservedAttentionPress(compression_ratio=r), "eager"),
        ("ExpectedAttentionPress", lambda r: kvpress.ExpectedAttentionPress(compression_ratio=r), "sdpa"),
        ("KeyDiffPress", lambda r: kvpress.KeyDiffPress(compression_ratio=r), "sdpa"),
    ]
    if hasattr(kvpress, "LagKVPress"):
        cfgs.append(("LagKVPress", lambda r: kvpress.LagKVPress(compression_ratio=r), "sdpa"))
    if hasattr(kvpress, "AdaKVPress"):
        cfgs.append(("AdaKVPress(KnormPress)",
                     lambda r: kvpress.AdaKVPress(press=kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("AdaKVPress(SnapKVPress)",
                     lambda r: kvpress.AdaKVPress(press=kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5)), "sdpa"))
    # No sinks: the recent window alone (kvlab's `local`).
    cfgs.append(("StreamingLLMPress(n_sink=0)",
                 lambda r: kvpress.StreamingLLMPress(compression_ratio=r, n_sink=0), "sdpa"))
    if hasattr(kvpress, "CriticalKVPress"):
        cfgs.append(("CriticalKVPress(KnormPress)",
                     lambda r: kvpress.CriticalKVPress(kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("CriticalKVPress(SnapKVPress)",
                     lambda r: kvpress.CriticalKVPress(kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5)), "sdpa"))
    if hasattr(kvpress, "CompactorPress"):
        # sketch_dimension = head_dim with the identity sketch (install_identity_sketch): kvpress
        # draws its Gaussian sketch from torch's global generator, which nothing else can replay.
        cfgs.append(("CompactorPress(sketch_dimension=64, identity sketch)",
                     lambda r: kvpress.CompactorPress(compression_ratio=r, sketch_dimension=64), "sdpa"))
    if hasattr(kvpress, "CriticalAdaKVPress"):
        cfgs.append(("CriticalAdaKVPress(KnormPress)",
                     lambda r: kvpress.CriticalAdaKVPress(press=kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("CriticalAdaKVPress(SnapKVPress)",
                     lambda r: kvpress.CriticalAdaKVPress(press=kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5)), "sdpa"))
    if hasattr(kvpress, "NonCausalAttnPress"):
        # Compactor's attention half on its own (no sinks; kvlab: compactor with sinks 0 and blending 0).
        cfgs.append(("NonCausalAttnPress", lambda r: kvpress.NonCausalAttnPress(compression_ratio=r), "sdpa"))
    if hasattr(kvpress, "LeverageScorePress"):
        # Compactor's leverage half on its own (no sinks; kvlab: compactor with sinks 0 and
        # attention=false), with the identity sketch as CompactorPress above.
        cfgs.append(("LeverageScorePress(sketch_dimension=64, identity sketch)",
                     lambda r: kvpress.LeverageScorePress(compression_ratio=r, sketch_dimension=64), "sdpa"))
    if hasattr(kvpress, "CURPress"):
        # kvpress's defaults (4 sinks, kv_product, local windows of 16), no random projection.
        cfgs.append(("CURPress", lambda r: kvpress.CURPress(compression_ratio=r), "sdpa"))
    if hasattr(kvpress, "ChunkPress"):
        # chunks of 128 (kvpress's default 1024 exceeds both prompts: one chunk, plain Knorm)
        cfgs.append(("ChunkPress(KnormPress, chunk_length=128)",
                     lambda r: kvpress.ChunkPress(press=kvpress.KnormPress(compression_ratio=r), chunk_length=128),
                     "sdpa"))
    if hasattr(kvpress, "ChunkKVPress"):
        # chunk_length 20 (kvpress's default) around KnormPress and SnapKVPress (window 32, kernel 5).
        cfgs.append(("ChunkKVPress(KnormPress)",
                     lambda r: kvpress.ChunkKVPress(press=kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("ChunkKVPress(SnapKVPress)",
                     lambda r: kvpress.ChunkKVPress(press=kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5)), "sdpa"))
    if hasattr(kvpress, "CapPress"):
        # kvpress's defaults (tau 5, 512 future positions, 4 sinks, epsilon 1e-6); kvlab: capkv.
        cfgs.append(("CapPress", lambda r: kvpress.CapPress(compression_ratio=r), "sdpa"))
    if hasattr(kvpress, "BlockPress"):
        # blocks of 64 (the default 128 gives one or two blocks on these prompts) around KeyDiffPress,
        # whose scores depend on the set scored (its anchor is the mean key of the candidates).
        cfgs.append(("BlockPress(KeyDiffPress, block_size=64)",
                     lambda r: kvpress.BlockPress(press=kvpress.KeyDiffPress(compression_ratio=r), block_size=64),
                     "sdpa"))
    if hasattr(kvpress, "PerLayerCompressionPress"):
        # layer l of 30 removes r - 0.1 + 0.2 l / 29 (mean r; at least 47 kept, past the window of 32)
        # around SnapKVPress (window 32, kernel 5).
        cfgs.append(("PerLayerCompressionPress(SnapKVPress, linear)",
                     lambda r: kvpress.PerLayerCompressionPress(
                         press=kvpress.SnapKVPress(compression_ratio=r, window_size=32, kernel_size=5),
                         compression_ratios=[r - 0.1 + 0.2 * l / 29 for l in range(30)]), "sdpa"))
    if hasattr(kvpress, "EntropyGatedChunkKVPress"):
        # its defaults (chunks of 10, 4 tokens of a spiky chunk) around KnormPress (negative scores:
        # the entropy's shift) and SnapKVPress (window 32, kernel 5).
        cfgs.append(("EntropyGatedChunkKVPress(KnormPress)",
                     lambda r: kvpress.EntropyGatedChunkKVPress(press=kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("EntropyGatedChunkKVPress(SnapKVPress)",
                     lambda r: kvpress.EntropyGatedChunkKVPress(press=kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5)), "sdpa"))
    if hasattr(kvpress, "MergingPress"):
        # its defaults around KnormPress; both gates (threshold, fraction) around SnapKVPress (32, 5).
        # The kept sets are the scorer's: the greedy ids are the check of the merged values.
        cfgs.append(("MergingPress(KnormPress)",
                     lambda r: kvpress.MergingPress(press=kvpress.KnormPress(compression_ratio=r)), "sdpa"))
        cfgs.append(("MergingPress(SnapKVPress, similarity_threshold=0.2, merge_fraction=0.75)",
                     lambda r: kvpress.MergingPress(press=kvpress.SnapKVPress(
                         compression_ratio=r, window_size=32, kernel_size=5), similarity_threshold=0.2,
                         merge_fraction=0.75), "sdpa"))
    if hasattr(kvpress, "SimLayerKVPress"):
        # a threshold that splits both prompts' layers with a margin of 3e-4 or more (lazy scores
        # 0.24-0.87 here), and a recent window of 64 (the default 1024 exceeds both prompts); the
        # press ignores the compression ratio (its threshold sets the memory).
        cfgs.append(("SimLayerKVPress(lazy_threshold=0.55, n_recent=64)",
                     lambda r: kvpress.SimLayerKVPress(lazy_threshold=0.55, n_recent=64), "sdpa"))
    if hasattr(kvpress, "DMSPress"):
        # thresholds near the median score of the prompts' positions (knorm's -|k|: -17.07; SnapKV's mean
        # window attention: 3e-4 to 6e-4), a window of 64; prefill only (decoding=False, its default);
        # the press ignores the compression ratio (its threshold sets the memory).
        cfgs.append(("DMSPress(KnormPress, threshold=-17, sliding_window_size=64)",
                     lambda r: kvpress.DMSPress(press=kvpress.KnormPress(), threshold=-17.0, sliding_window_size=64),
                     "sdpa"))
        cfgs.append(("DMSPress(SnapKVPress, threshold=0.0005, sliding_window_size=64)",
                     lambda r: kvpress.DMSPress(press=kvpress.SnapKVPress(window_size=32, kernel_size=5),
                                                threshold=0.0005, sliding_window_size=64), "sdpa"))
    if hasattr(kvpress, "ThinKPress") and hasattr(kvpress, "ComposedPress"):
        # key channels: half of each KV head's 64 pruned by its window of 32 (kvpress's README value), on
        # its own (every position kept) and after SnapKVPress (32, 5) at the ratio, as kvpress composes them.
        cfgs.append(("ThinKPress(key_channel_compression_ratio=0.5)",
                     lambda r: kvpress.ThinKPress(key_channel_compression_ratio=0.5, window_size=32), "sdpa"))
        cfgs.append(("ComposedPress(SnapKVPress, ThinKPress(0.5))",
                     lambda r: kvpress.ComposedPress([kvpress.SnapKVPress(compression_ratio=r, window_size=32, kernel_size=5),
                                                      kvpress.ThinKPress(key_channel_compression_ratio=0.5, window_size=32)]),
                     "sdpa"))
    if hasattr(kvpress, "FinchPress"):
        # normalized SnapKV-style scores over the question window (the last FINCH_WINDOW tokens, set by
        # the delimiter, see finch_model), no chunks, keys gathered without rerotation.
        cfgs.append(("FinchPress(question=last 24, rerotate_keys=False)",
                     lambda r: kvpress.FinchPress(compression_ratio=r, normalize_scores=True, rerotate_keys=False),
                     "sdpa"))
    return cfgs


def finch_model(model):
    """A copy of `model` for FinchPress, with its delimiter token: embed_tokens gets one more row
    (zeros; FinchPress's hook drops the delimiter's row from the embeddings' output, so its value is
    never used), id = vocab_size. lm_head keeps the original vocabulary (the copy's tied weight stays
    the old one), so the logits are those of `model`; `model` itself is not touched. -> (copy, id)"""
    import copy

    m = copy.deepcopy(model)
    old = m.model.embed_tokens
    vocab, dim = old.weight.shape
    assert vocab == m.config.vocab_size, (vocab, m.config.vocab_size)
    emb = torch.nn.Embedding(vocab + 1, dim, padding_idx=old.padding_idx, dtype=old.weight.dtype)
    with torch.no_grad():
        emb.weight[:vocab] = old.weight
        emb.weight[vocab:] = 0
    m.model.embed_tokens = emb
    assert m.lm_head.weight.shape[0] == vocab and m.lm_head.weight.data_ptr() != emb.weight.data_ptr()
    m.eval()
    return m, vocab


class _IdentitySketchTorch:
    """Stands in for the `torch` module inside kvpress.presses.leverage_press: `randn`, which only
    draws LeverageScorePress's sketch Phi (B, H, d, k), returns identity matrices (d == k), so Phi =
    I / sqrt(k); every other attribute is torch's own. kvpress's leverage code runs unchanged."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def randn(*shape, device=None, dtype=None):
        b, h, d, k = shape
        assert d == k, f"identity sketch needs sketch_dimension == head_dim, got {d} x {k}"
        return torch.eye(d, device=device, dtype=dtype).expand(b, h, d, k).clone()


def install_identity_sketch():
    import kvpress.presses.leverage_press as leverage_press
    leverage_press.torch = _IdentitySketchTorch()


def press_params(press):
    """Every dataclass field (constructor parameter) with its value; nested presses recursively."""
    out = {}
    for f in dataclasses.fields(press):
        if f.name.startswith("_"):  # CompactorPress's child presses, built from the public fields
            continue
        v = getattr(press, f.name)
        if dataclasses.is_dataclass(v):
            v = {"press": type(v).__name__, "params": press_params(v)}
        elif isinstance(v, list) and v and all(dataclasses.is_dataclass(x) for x in v):  # ComposedPress
            v = [{"press": type(x).__name__, "params": press_params(x)} for x in v]
        out[f.name] = v
    # CriticalKVPress is a plain class over ScorerPress: its own parameters are attributes.
    for name in ("press", "epsilon", "first_stage_ratio"):
        if name not in out and hasattr(press, name):
            v = getattr(press, name)
            out[name] = {"press": type(v).__name__, "params": press_params(v)} if dataclasses.is_dataclass(v) else v
    return out


class F32(float):
    """A float32 value; written as the shortest decimal that reads back to the same float32
    (at most 9 significant digits), e.g. 0.0012345679, -15.123457, 1e-05."""


def fmt_float(x):
    assert math.isfinite(x), x
    if isinstance(x, F32):
        return str(np.float32(x))
    return repr(float(x))


def mask_hex(positions, n):
    """Sorted kept positions of n -> the hex bit mask described in the module docstring."""
    digits = [0] * ((n + 3) // 4)
    for p in positions:
        digits[p // 4] |= 1 << (p % 4)
    return "".join("0123456789abcdef"[d] for d in digits)


def to_json(obj, indent=0):
    """Deterministic JSON: objects indented, lists of scalars on one line, F32 floats shortest."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {to_json(v, indent + 1)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(to_json(v) for v in obj) + "]"
        items = [pad + " " + to_json(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, float):
        return fmt_float(obj)
    raise TypeError(type(obj))


def kth_band(scores, keep_mask, k):
    """scores, keep_mask: 1-D float64 / bool tensors. Positions within TIE_RTOL of the k-th largest
    score, or [] when that band does not straddle the kept/dropped cut."""
    if k <= 0 or k >= scores.numel():
        return []
    kth = torch.sort(scores, descending=True).values[k - 1]
    tol = TIE_RTOL * abs(float(kth)) if kth != 0 else 1e-30
    band = (scores - kth).abs() <= tol
    if bool((band & keep_mask).any()) and bool((band & ~keep_mask).any()):
        return band.nonzero().flatten().tolist()
    return []


def gathered_positions(keys, out_k):
    """The ascending positions a press gathered, the same on every KV head (EntropyGatedChunkKVPress):
    each output row matched to the first later position whose keys equal it on every head."""
    n, pos, p = keys.shape[2], [], 0
    for j in range(out_k.shape[2]):
        while p < n and not torch.equal(keys[0, :, p], out_k[0, :, j]):
            p += 1
        assert p < n, f"output row {j} matches no later position"
        pos.append(p)
        p += 1
    return pos


class ThinkRecorder:
    """ThinKPress: the key channels it zeroes per (layer, KV head), from its own channel scores
    (queries_norm * keys_norm, recomputed as ThinKPress.compress does and checked against the zeroed
    columns), and the channels within TIE_RTOL of the n_pruned-th smallest score when that band holds
    both pruned and kept channels."""

    def __init__(self, press, n_kv):
        self.press, self.n_kv, self.layers = press, n_kv, {}
        orig = press.compress

        def compress(module, hidden_states, keys, values, attentions, kwargs):
            k_in = keys.clone()  # ThinK scatters zeros into its input
            out_k, out_v = orig(module, hidden_states, keys, values, attentions, kwargs)
            self.record(module, k_in, out_k, kwargs)
            return out_k, out_v

        press.compress = compress

    def record(self, module, keys, out_k, kwargs):
        layer, (bsz, h_kv, n, d) = module.layer_idx, keys.shape
        g = module.config.num_attention_heads // h_kv
        q = self.press.compute_window_queries(module, kwargs["hidden_states"], kwargs["position_embeddings"])
        qn = torch.pow(q, 2).mean(dim=2).view(bsz, h_kv, g, d).mean(2)
        score = (qn * torch.pow(keys, 2).mean(dim=2))[0]  # [Hkv, d], as ThinKPress.compress
        n_pruned = int(d * self.press.key_channel_compression_ratio)
        pruned, bands = [], []
        for h in range(h_kv):
            idx = sorted(score[h].topk(n_pruned, largest=False).indices.tolist())
            zero = [c for c in range(d) if bool((out_k[0, h, :, c] == 0).all())]
            assert zero == idx, (layer, h, zero, idx)
            pruned.append(idx)
            mask = torch.zeros(d, dtype=torch.bool)
            mask[idx] = True
            bands.append(kth_band(-score[h].double(), mask, n_pruned))
        self.layers[layer] = {"pruned_channels": pruned, "channel_tie_band": bands, "n_seen": n}


class Recorder:
    """Wraps a press instance's score/compress to record scores and kept positions per layer."""

    def __init__(self, press, n_kv_heads):
        self.press = press
        self.n_kv = n_kv_heads
        # AdaKVPress and CriticalAdaKVPress mask pruned entries instead of shrinking the cache.
        self.is_ada = type(press).__name__ in ("AdaKVPress", "CriticalAdaKVPress")
        # ChunkKVPress keeps whole chunks chosen from its scorer's scores summed over the heads.
        self.is_chunk = type(press).__name__ == "ChunkKVPress"
        # EntropyGatedChunkKVPress keeps the same positions on every head, chosen by a greedy pass.
        self.is_entropy = type(press).__name__ == "EntropyGatedChunkKVPress"
        # MergingPress keeps its ScorerPress's top-k (keys unchanged, values merged).
        self.is_merging = type(press).__name__ == "MergingPress"
        # ChunkPress scores and cuts each chunk on its own: every chunk's scores are kept.
        self.is_chunked = type(press).__name__ == "ChunkPress"
        # BlockPress scores the kept set and each next block, in turn: every call's scores are kept.
        self.is_block = type(press).__name__ == "BlockPress"
        # PerLayerCompressionPress sets its ScorerPress's ratio per layer and runs its hook: recorded
        # as that ScorerPress (its compression_ratio read while the layer is compressed).
        # SimLayerKVPress has no scorer: a layer keeps all or its lazy set, by a score of the layer
        # (recorded from is_lazy, recomputed as it does and checked against its decision).
        self.is_simlayer = type(press).__name__ == "SimLayerKVPress"
        if self.is_simlayer:
            self._lazy = None
            orig_lazy, orig_sl_compress = press.is_lazy, press.compress

            def is_lazy(module, hidden_states, keys, position_embeddings):
                from kvpress.presses.snapkv_press import SnapKVPress
                aw = SnapKVPress.compute_window_attention(module, hidden_states, keys, press.n_last,
                                                          position_embeddings).mean((0, 1, 2))
                s = (aw[: press.n_initial].sum() + aw[-press.n_recent:].sum()).item()
                lazy = orig_lazy(module, hidden_states, keys, position_embeddings)
                assert lazy == (s > press.lazy_threshold)
                self._lazy = s
                return lazy

            def sl_compress(module, hidden_states, keys, values, attentions, kwargs):
                self._lazy = None
                out_k, out_v = orig_sl_compress(module, hidden_states, keys, values, attentions, kwargs)
                self.record_simlayer(module, keys, out_k)
                return out_k, out_v

            press.is_lazy = is_lazy
            press.compress = sl_compress
            self.layers = {}
            return
        # DMSPress masks (module.masked_key_indices, as AdaKV) from its hook, not compress: the hook is
        # wrapped to record the prefill's masked positions, the inner scorer's score to keep its scores.
        if type(press).__name__ == "DMSPress":
            self._last_scores = None
            inner = press.press
            orig_inner_score, orig_hook = inner.score, press.forward_hook

            def dms_score(*args, **kwargs):
                s = orig_inner_score(*args, **kwargs)
                self._last_scores = s.detach().clone()
                return s

            def dms_hook(module, input, kwargs, output):
                out = orig_hook(module, input, kwargs, output)
                if module.layer_idx not in self.layers:  # the prefill's call
                    self.record_dms(module)
                return out

            inner.score = dms_score
            press.forward_hook = dms_hook
            self.layers = {}
            return
        if type(press).__name__ == "PerLayerCompressionPress":
            press = press.press
            self.press = press
        self.scorer = press.press if (self.is_ada or self.is_chunk or self.is_chunked or self.is_block
                                      or self.is_entropy or self.is_merging) else press
        self._chunk_scores = []
        self.layers = {}
        self._last_scores = None
        orig_score = self.scorer.score
        orig_compress = press.compress

        def score(*args, **kwargs):
            s = orig_score(*args, **kwargs)
            self._last_scores = s.detach().clone()  # AdaKV scatters into the returned tensor
            self._chunk_scores.append(self._last_scores)
            return s

        def compress(module, hidden_states, keys, values, attentions, kwargs):
            self._last_scores = None
            self._chunk_scores = []
            k_in = keys
            out_k, out_v = orig_compress(module, hidden_states, keys, values, attentions, kwargs)
            self.record(module, k_in, out_k)
            return out_k, out_v

        self.scorer.score = score
        press.compress = compress

    def record_dms(self, module):
        """DMSPress: kept = the complement of the masked positions per KV head (heads differ); the tie
        band of a head is its positions outside the window whose score is within TIE_RTOL of the
        threshold."""
        s, thr, w = self._last_scores, self.press.threshold, self.press.sliding_window_size
        n = s.shape[-1]
        mask = torch.ones(self.n_kv, n, dtype=torch.bool)
        if module.masked_key_indices is not None:
            b_idx, h_idx, p_idx = module.masked_key_indices
            assert int(b_idx.max()) == 0
            mask[h_idx, p_idx] = False
        s64 = s[0].double()
        for h in range(self.n_kv):  # the rule, recomputed: evicted = outside the window and below
            want = (s64[h] >= thr) | (torch.arange(n) >= n - w)
            assert torch.equal(want, mask[h]) or n <= w, f"layer {module.layer_idx} head {h}"
        kept = [mask[h].nonzero().flatten().tolist() for h in range(self.n_kv)]
        tol = TIE_RTOL * abs(thr)
        bands = [[p for p in range(max(0, n - w)) if abs(float(s64[h, p]) - thr) <= tol] for h in range(self.n_kv)]
        self.layers[module.layer_idx] = {"n": n, "n_kept": [len(k) for k in kept], "kept": kept,
                                         "tie_band": bands, "scores": s[0].clone()}

    def record_simlayer(self, module, keys, out_k):
        """SimLayerKVPress: the kept positions (all, or its lazy set gathered from the cache); a layer
        whose lazy score is within TIE_RTOL of the threshold has every position it could drop in its
        tie band (kvlab's float64 sum may decide it the other way)."""
        layer, n = module.layer_idx, keys.shape[2]
        assert layer not in self.layers, layer
        pos = gathered_positions(keys, out_k) if out_k.shape[2] < n else list(range(n))
        s = self._lazy
        near = s is not None and abs(s - self.press.lazy_threshold) <= TIE_RTOL * self.press.lazy_threshold
        lazy_set = set(range(self.press.n_initial)) | set(range(n - self.press.n_recent + self.press.n_last, n))
        band = sorted(set(range(n)) - lazy_set) if near else []
        self.layers[layer] = {"n": n, "n_kept": [len(pos)] * self.n_kv, "kept": [pos] * self.n_kv,
                              "tie_band": [band] * self.n_kv, "scores": torch.full((self.n_kv, 1), float("nan")),
                              "lazy_score": s}

    def chunked_selection(self, keys, out_k, layer):
        """ChunkPress.compress's selection from the scores of each chunk (recorded in call order),
        recomputed as it does (topk per chunk, offsets, concatenation) and verified against the
        compressed cache; kept sets sorted; each chunk's tie band at its own cut."""
        cl, n, r = self.press.chunk_length, keys.shape[2], self.press.compression_ratio
        starts = list(range(0, n, cl))
        assert len(self._chunk_scores) == len(starts), (len(self._chunk_scores), len(starts))
        idx, bands = [], [[] for _ in range(self.n_kv)]
        for i, s in zip(starts, self._chunk_scores):
            length = min(cl, n - i)
            assert s.shape[-1] == length
            n_kept = max(1, int(length * (1 - r)))
            top = s.topk(n_kept, dim=-1).indices
            idx.append(i + top)
            for h in range(self.n_kv):
                mask = torch.zeros(length, dtype=torch.bool)
                mask[top[0, h]] = True
                bands[h] += [i + p for p in kth_band(s[0, h].double(), mask, n_kept)]
        idx = torch.cat(idx, dim=-1)
        gathered = keys.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        assert torch.equal(gathered, out_k), f"layer {layer}: recovered chunk positions do not match cache"
        kept = [sorted(idx[0, h].tolist()) for h in range(self.n_kv)]
        return kept, bands, torch.cat(self._chunk_scores, dim=-1)

    def block_selection(self, keys, out_k, layer):
        """BlockPress.compress's selection from the scores of each call (recorded in call order),
        recomputed as it does (the first n_kept positions, then per block the top n_kept of kept +
        block, kept in topk order) and verified against the compressed cache; kept sets sorted; the
        tie band of every step's cut, as positions of the prompt."""
        from kvpress.utils import compute_n_kept

        n = keys.shape[2]
        bs = min(self.press.block_size, n)
        n_kept = compute_n_kept(n, self.press.compression_ratio)
        kept = torch.arange(n_kept).expand(1, self.n_kv, -1)
        starts = list(range(n_kept, n, bs))
        assert len(self._chunk_scores) == len(starts), (len(self._chunk_scores), len(starts))
        bands = [set() for _ in range(self.n_kv)]
        for i, s in zip(starts, self._chunk_scores):
            cur = torch.cat([kept, torch.arange(i, min(i + bs, n)).expand(1, self.n_kv, -1)], dim=-1)
            assert s.shape[-1] == cur.shape[-1]
            top = s.topk(n_kept, dim=-1).indices
            for h in range(self.n_kv):
                mask = torch.zeros(cur.shape[-1], dtype=torch.bool)
                mask[top[0, h]] = True
                bands[h] |= {int(cur[0, h, j]) for j in kth_band(s[0, h].double(), mask, n_kept)}
            kept = cur.gather(-1, top)
        gathered = keys.gather(2, kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        assert torch.equal(gathered, out_k), f"layer {layer}: recovered block positions do not match cache"
        return ([sorted(kept[0, h].tolist()) for h in range(self.n_kv)], [sorted(b) for b in bands],
                torch.cat(self._chunk_scores, dim=-1))

    def chunk_selection(self, scores, keys, out_k, layer):
        """ChunkKVPress.compress's selection recomputed with its own operations (float32 sums over
        the heads, chunk means, topk), verified against the compressed cache; the tie band is the
        positions of every chunk whose mean is within TIE_RTOL of the cut's when the band straddles it."""
        cl, n = self.press.chunk_length, keys.shape[2]
        full, rest = n // cl, n % cl
        assert full > 0, "prompts shorter than a chunk go to the scorer's own compress"
        chunk_scores = scores[..., : full * cl].sum(dim=1).view(-1, full, cl).mean(dim=-1)
        if rest > 0:
            chunk_scores = torch.cat([chunk_scores, scores[..., -rest:].sum(dim=1).mean(dim=-1, keepdim=True)], dim=-1)
        c = full + (rest > 0)
        n_chunks = max(1, int(c * (1 - self.press.compression_ratio)))
        top = chunk_scores.topk(n_chunks, dim=-1).indices[0].tolist()
        pos = sorted(p for ch in top for p in range(ch * cl, min(n, (ch + 1) * cl)))
        idx = torch.tensor(pos).view(1, 1, -1, 1).expand(keys.shape[0], keys.shape[1], -1, keys.shape[-1])
        assert torch.equal(keys.gather(2, idx), out_k), f"layer {layer}: recovered chunks do not match cache"
        mask = torch.zeros(c, dtype=torch.bool)
        mask[top] = True
        band_chunks = kth_band(chunk_scores[0].double(), mask, n_chunks)
        band = sorted(p for ch in band_chunks for p in range(ch * cl, min(n, (ch + 1) * cl)))
        return [pos] * self.n_kv, [band] * self.n_kv, len(pos)

    def record(self, module, keys, out_k):
        from kvpress.utils import compute_n_kept

        layer = module.layer_idx
        assert layer not in self.layers, layer
        if self.is_chunked or self.is_block:
            select = self.block_selection if self.is_block else self.chunked_selection
            kept, bands, scores = select(keys, out_k, layer)
            self.layers[layer] = {"n": keys.shape[2], "n_kept": [len(k) for k in kept], "kept": kept,
                                  "tie_band": bands, "scores": scores[0].clone()}
            return
        scores = self._last_scores
        assert scores is not None and scores.shape[0] == 1 and scores.shape[1] == self.n_kv
        n = keys.shape[2]
        assert scores.shape[2] == n
        ratio = self.press.compression_ratio
        n_kept = compute_n_kept(n, ratio)
        s64 = scores[0].double()
        if self.is_chunk:
            kept, bands, n_kept = self.chunk_selection(scores, keys, out_k, layer)
        elif self.is_entropy:
            pos = gathered_positions(keys, out_k)
            assert len(pos) == n_kept, (len(pos), n_kept)
            kept, bands = [pos] * self.n_kv, [[] for _ in range(self.n_kv)]
        elif not self.is_ada:
            idx = scores.topk(n_kept, dim=-1).indices  # exactly ScorerPress.compress
            gathered = keys.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
            assert torch.equal(gathered, out_k), f"layer {layer}: recovered positions do not match cache"
            kept = [sorted(idx[0, h].tolist()) for h in range(self.n_kv)]
            bands = []
            for h in range(self.n_kv):
                mask = torch.zeros(n, dtype=torch.bool)
                mask[kept[h]] = True
                bands.append(kth_band(s64[h], mask, n_kept))
        else:
            assert out_k is keys or torch.equal(out_k, keys)  # AdaKV keeps the cache, masks entries
            b_idx, h_idx, p_idx = module.masked_key_indices
            assert int(b_idx.max()) == 0 and h_idx.numel() == self.n_kv * (n - n_kept)
            mask = torch.ones(self.n_kv, n, dtype=torch.bool)
            mask[h_idx, p_idx] = False
            kept = [mask[h].nonzero().flatten().tolist() for h in range(self.n_kv)]
            # Reproduce AdaKVPress.compress's selection scores for the tie band.
            alpha = self.press.alpha_safeguard
            n_safe = int(n_kept * alpha)
            if alpha > 0:
                n_safe = max(1, n_safe) if n_kept > 0 else 0
            safe_mask = torch.zeros(self.n_kv, n, dtype=torch.bool)
            sel = scores.clone()
            top = torch.topk(sel, n_safe, dim=-1).indices
            sel.scatter_(-1, top, torch.finfo(sel.dtype).max)
            safe_mask[torch.arange(self.n_kv).unsqueeze(1), top[0]] = True
            sel64 = sel[0].double().flatten()
            flat_band = set(kth_band(sel64, mask.flatten(), self.n_kv * n_kept))
            # The safeguard cut only matters where a position in its band would not be kept without
            # the safeguard, i.e. its raw score is not clearly above the global cut.
            thr = float(torch.sort(sel64, descending=True).values[self.n_kv * n_kept - 1])
            thr_hi = thr + TIE_RTOL * abs(thr)
            bands = []
            for h in range(self.n_kv):
                hb = {p - h * n for p in flat_band if h * n <= p < (h + 1) * n}
                sb = kth_band(s64[h], safe_mask[h], n_safe)
                if any(float(s64[h, p]) <= thr_hi for p in sb):
                    hb |= set(sb)
                if type(self.press).__name__ == "CriticalAdaKVPress":
                    # CriticalKV's stage 1 on this head's budget B_h: its max(int(B_h * first_stage_ratio),
                    # n_safe) best raw scores. Ties there (knorm: a token's keys at two positions have
                    # the same norm on layer 0) leave the cut ambiguous.
                    first = max(int(len(kept[h]) * self.press.first_stage_ratio), n_safe)
                    if 0 < first < n:
                        kth = float(torch.sort(s64[h], descending=True).values[first - 1])
                        tol = TIE_RTOL * abs(kth) if kth != 0 else 1e-30
                        band = ((s64[h] - kth).abs() <= tol)
                        if int((s64[h] > kth + tol).sum()) + int(band.sum()) > first:
                            hb |= set(band.nonzero().flatten().tolist())
                    # Stage 2 ranks (s + eps) * |W_o v|_1: equal raw scores with equal values (the same
                    # token on layer 0, whose values carry no position) tie there too. Any group of raw
                    # scores within SAME_SCORE_RTOL holding both kept and dropped positions is ambiguous.
                    order = torch.sort(s64[h], descending=True).indices.tolist()
                    i = 0
                    while i < n:
                        j = i + 1
                        while j < n and abs(float(s64[h, order[j]]) - float(s64[h, order[i]])) <= \
                                SAME_SCORE_RTOL * abs(float(s64[h, order[i]])):
                            j += 1
                        group = order[i:j]
                        if len({bool(mask[h, q]) for q in group}) > 1:
                            hb |= set(group)
                        i = j
                bands.append(sorted(hb))
        self.layers[layer] = {
            "n": n,
            "n_kept": [len(k) for k in kept],
            "kept": kept,
            "tie_band": bands,
            "scores": scores[0].clone(),
        }


def greedy_pipeline_style(model, press, ids, eos_ids, prefill_ids=None):
    """KVPressTextGenerationPipeline._forward + generate_answer, with no question tokens.
    prefill_ids (FinchPress): the ids fed to the prefill instead of `ids` (`ids` with the delimiter,
    which the press's hook removes); decoding continues at positions len(ids), len(ids) + 1, ..."""
    from transformers import DynamicCache

    n = ids.shape[1]
    cache = DynamicCache()
    with press(model):
        out = model(input_ids=ids if prefill_ids is None else prefill_ids, past_key_values=cache, logits_to_keep=1)
    prefill_lens = [cache.get_seq_length(layer) for layer in range(len(cache))]
    generated = [out.logits[0, -1].argmax()]
    position_ids = torch.tensor([[n]])
    for i in range(MAX_NEW_TOKENS - 1):
        out = model(input_ids=generated[-1].view(1, 1), past_key_values=cache, position_ids=position_ids + i)
        new_id = out.logits[0, -1].argmax()
        generated.append(new_id)
        if new_id.item() in eos_ids:
            break
    return [int(t) for t in generated], prefill_lens


def greedy_generate(model, press, ids):
    from transformers import DynamicCache

    with press(model):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=DynamicCache(),
                             do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    return [int(t) for t in out[0, ids.shape[1]:]]


def split_top_level(text):
    """'A(x, y),B' -> ['A(x, y)', 'B']: commas inside parentheses belong to a config's name."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if cur.strip() else parts


def merged_into_existing(path, new):
    """--only: the existing fixture at `path` with `new`'s configs appended, its generate
    cross-check counts summed. Refused when the two were made by other versions, model or prompts
    (the configs would not be comparable), or when `path` already holds one of `new`'s configs."""
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    for key in ("versions", "model", "prompts", "compression_ratios"):
        if old[key] != new[key]:
            sys.exit(f"--only: {path} has other {key} ({json.dumps(old[key])[:200]}) than this run "
                     f"({json.dumps(new[key])[:200]}): regenerate the whole file instead")
    have = {c["name"] for c in old["configs"]}
    again = [c["name"] for c in new["configs"] if c["name"] in have]
    if again:
        sys.exit(f"--only: {path} already holds {again}: regenerate the whole file to change them")
    old["configs"] += new["configs"]
    if old.get("generate_crosscheck") and new.get("generate_crosscheck"):
        for k in ("n_checked", "n_equal"):
            old["generate_crosscheck"][k] += new["generate_crosscheck"][k]
        old["generate_crosscheck"]["mismatches"] += new["generate_crosscheck"]["mismatches"]
    return old


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: models/smollm2-135m/*.gguf)")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "kvpress_golden", "smollm2.json"))
    ap.add_argument("--no-generate-check", action="store_true", help="skip the model.generate cross-check")
    ap.add_argument("--only", default=None,
                    help="comma-separated config names (e.g. CURPress): run only these and add them to --added "
                         "(made with this run's header when missing; the configs already there stay as they are); "
                         "refused when --added was made by other versions, model or prompts, or when it or --out "
                         "already holds one of them")
    ap.add_argument("--added", default=os.path.join(REPO, "tests", "fixtures", "kvpress_golden", "smollm2_added.json"),
                    help="the fixture of presses added with --only (the main one stays under 2 MiB)")
    args = ap.parse_args()
    only = set(split_top_level(args.only)) if args.only else None

    torch.set_num_threads(1)
    torch.manual_seed(0)

    import kvpress  # noqa: F401  (patches the attention functions on import)
    install_identity_sketch()
    import transformers
    from importlib.metadata import version as pkg_version
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf or not os.path.exists(gguf):
        sys.exit("no SmolLM2 GGUF found; run data_scripts/get_smollm2.sh or pass --gguf")

    tok = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", "smollm2", "tokenizer.json"))
    prompts = []
    for p in PROMPTS:
        ids = tok.encode(prompt_text(p), add_special_tokens=True).ids[: p["n_tokens"]]
        assert len(ids) == p["n_tokens"], (p["name"], len(ids))
        prompts.append({"name": p["name"], "source": p["source"], "n_tokens": len(ids),
                        "text": tok.decode(ids, skip_special_tokens=False), "ids": ids})

    models = {}
    for impl in ("sdpa", "eager"):
        m = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
            dtype=torch.float32, attn_implementation=impl)
        m.eval()
        assert m.config._attn_implementation == impl
        models[impl] = m
    cfg = models["sdpa"].config
    n_kv = cfg.num_key_value_heads
    eos = models["sdpa"].generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]

    finch = None  # (model copy with the delimiter row, delimiter id), made when a FinchPress config runs
    configs_out = []
    mismatches = []
    first_scores = {}  # (press config, prompt) -> (config name, scores) of its first ratio
    n_checked = 0
    all_configs = make_configs(kvpress)
    if only:
        unknown = only - {name for name, _, _ in all_configs}
        if unknown:
            sys.exit(f"--only: unknown config(s) {sorted(unknown)}; known: {[n for n, _, _ in all_configs]}")
    for name, factory, impl in all_configs:
        if (only and name not in only) or (not only and name in ADDED):
            continue
        model = models[impl]
        is_finch = type(factory(RATIOS[0])).__name__ == "FinchPress"
        if is_finch:
            if finch is None:
                finch = finch_model(models[impl])
            model, delim = finch
        for ratio in RATIOS:
            params = press_params(factory(ratio))
            if is_finch:  # set at run time (the delimiter's id; the window, by its hook)
                params.update(delimiter_token_id=delim, window_size=FINCH_WINDOW)
            results = []
            for p in prompts:
                ids = torch.tensor([p["ids"]], dtype=torch.long)
                press = factory(ratio)
                prefill_ids = None
                if is_finch:  # context + delimiter + question (the last FINCH_WINDOW tokens)
                    press.delimiter_token_id = delim
                    cut = len(p["ids"]) - FINCH_WINDOW
                    prefill_ids = torch.tensor([p["ids"][:cut] + [delim] + p["ids"][cut:]], dtype=torch.long)
                # ThinKPress alone or inside ComposedPress: its channels recorded apart; the sequence
                # press before it (if any) recorded as usual, else every position kept.
                parts = press.presses if type(press).__name__ == "ComposedPress" else [press]
                think = [x for x in parts if type(x).__name__ == "ThinKPress"]
                seq = [x for x in parts if type(x).__name__ != "ThinKPress"]
                assert len(think) <= 1 and len(seq) <= 1, name
                trec = ThinkRecorder(think[0], n_kv) if think else None
                rec = Recorder(seq[0], n_kv) if seq else None
                with torch.no_grad():
                    greedy, cache_lens = greedy_pipeline_style(model, press, ids, eos_ids, prefill_ids)
                n_layers = cfg.num_hidden_layers
                n = len(p["ids"])
                if is_finch:  # the hook found the delimiter, and dropped it: every layer saw the n real tokens
                    assert press.window_size == FINCH_WINDOW, press.window_size
                    assert all(rec.layers[i]["n"] == n for i in range(n_layers))
                if rec is None:
                    rec = types.SimpleNamespace(layers={i: {
                        "n": n, "n_kept": [n] * n_kv, "kept": [list(range(n))] * n_kv, "tie_band": [[]] * n_kv,
                        "scores": torch.full((n_kv, 1), float("nan"))} for i in range(n_layers)})
                assert sorted(rec.layers) == list(range(n_layers)), sorted(rec.layers)
                L = [rec.layers[i] for i in range(n_layers)]
                if not args.no_generate_check:
                    gen_press = factory(ratio)
                    if is_finch:  # no delimiter in the ids: the hook leaves the preset window
                        gen_press.delimiter_token_id, gen_press.window_size = delim, FINCH_WINDOW
                    with torch.no_grad():
                        gen = greedy_generate(model, gen_press, ids)
                    n_checked += 1
                    if gen != greedy:
                        mismatches.append({"config": name, "compression_ratio": ratio,
                                           "prompt": p["name"], "generate_ids": gen})
                scores = {str(i): L[i]["scores"] for i in SCORE_LAYERS}
                key = (name, p["name"])
                same = key in first_scores and all(
                    torch.equal(first_scores[key][1][i], scores[i]) for i in scores)
                if key not in first_scores:
                    first_scores[key] = (f"{name}@{ratio}", scores)
                res = {
                    "prompt": p["name"],
                    "n": len(p["ids"]),
                    **({"window": FINCH_WINDOW} if is_finch else {}),
                    "cache_len_after_prefill": cache_lens[0] if len(set(cache_lens)) == 1 else cache_lens,
                    "n_kept": [x["n_kept"] for x in L],
                    "n_ambiguous_heads": sum(len(b) > 0 for x in L for b in x["tie_band"]),
                    "kept": [[mask_hex(k, len(p["ids"])) for k in x["kept"]] for x in L],
                    "tie_band": [x["tie_band"] for x in L],
                }
                if trec is not None:  # ThinK: pruned key channels per layer and KV head, and their tie band
                    res["pruned_channels"] = [trec.layers[i]["pruned_channels"] for i in range(n_layers)]
                    res["channel_tie_band"] = [trec.layers[i]["channel_tie_band"] for i in range(n_layers)]
                if "lazy_score" in L[0]:  # SimLayerKVPress: each layer's score (None: not scored)
                    res["lazy_score"] = [None if x["lazy_score"] is None else F32(x["lazy_score"]) for x in L]
                if name in NO_SCORES:
                    res["scores_not_recorded"] = True
                elif same:
                    res["scores_same_as"] = first_scores[key][0]
                else:
                    res["scores"] = {i: [[F32(v) for v in row.tolist()] for row in t]
                                     for i, t in scores.items()}
                res["greedy_ids"] = greedy
                results.append(res)
                print(f"{name:24s} r={ratio} {p['name']:24s} n_kept[0]={L[0]['n_kept']} "
                      f"ties={res['n_ambiguous_heads']} greedy={greedy[:6]}",
                      flush=True)
            configs_out.append({"name": f"{name}@{ratio}", "press": name.split("(")[0],
                                "compression_ratio": ratio, "attn_implementation": impl,
                                "params": params, "results": results})
            if is_finch:
                configs_out[-1]["finch_input"] = (
                    "prefill ids = prompt ids[:n-%d] + [delimiter_token_id] + ids[n-%d:] on a copy of the model "
                    "whose embed_tokens has one more row (zeros) for the delimiter (lm_head unchanged); "
                    "FinchPress's hook sets window_size = %d and drops the delimiter's embedding, so the "
                    "model and cache see the n prompt tokens; decoding at positions n, n+1, ..."
                    % (FINCH_WINDOW, FINCH_WINDOW, FINCH_WINDOW))
                if not args.no_generate_check:
                    configs_out[-1]["generate_crosscheck_note"] = (
                        "model.generate on the prompt ids without the delimiter, with press.window_size "
                        "preset to %d and delimiter_token_id set (the hook finds no delimiter and keeps "
                        "the window)" % FINCH_WINDOW)

    out = {
        "version": 2,
        "generator": "data_scripts/make_kvpress_golden.py",
        "versions": {
            "kvpress": pkg_version("kvpress"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": pkg_version("gguf"),
            "python": sys.version.split()[0],
        },
        "model": {
            "gguf_file": os.path.basename(gguf),
            "gguf_sha256": sha256(gguf),
            "dtype": "float32 (dequantized by transformers/gguf-py), CPU, 1 thread",
            "n_layers": cfg.num_hidden_layers, "n_q_heads": cfg.num_attention_heads,
            "n_kv_heads": n_kv, "head_dim": getattr(cfg, "head_dim", None),
            "rope_theta": getattr(cfg, "rope_theta", None)
            or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta"),
            "eos_token_id": eos_ids,
        },
        "tokenizer": "../shared/tokenizers/smollm2/tokenizer.json, add_special_tokens=True "
                     "(adds no BOS), no chat template; ids truncated to n_tokens",
        "compression_ratios": RATIOS,
        "n_kept_rule": "ScorerPress: n_kept = max(1, int(n * (1 - compression_ratio))) per KV head "
                       "(kvpress.utils.compute_n_kept), top-k of scores over positions per KV head. "
                       "AdaKVPress: n_kept * n_kv_heads kept in total per layer, per-head counts vary.",
        "kept_recovery": "score/compress wrapped on the press instance; ScorerPress: topk indices "
                         "recomputed as ScorerPress.compress and verified to reproduce the compressed "
                         "cache exactly, then sorted. AdaKVPress: cache not shrunk; kept = complement "
                         "of module.masked_key_indices (batch, kv_head, position), which kvpress's "
                         "attention patch replaces with a fake key (attention weight 0) while decoding.",
        "scores_layers": SCORE_LAYERS,
        "scores_note": "raw float32 scores returned by the press's score() (the inner press's for "
                       "AdaKVPress, before its safeguard scatter): scores[layer][kv_head][position], "
                       "written as the shortest decimal that reads back to the same float32; higher = "
                       "keep. Where a result's scores are bitwise identical to those of the same press "
                       "and prompt at the first compression ratio, the result has 'scores_same_as': "
                       "<config name> instead of 'scores'.",
        "tie_band_definition": "per layer and KV head: positions whose selection score s satisfies "
                               "|s - s_k| <= %g * |s_k| (s_k = k-th largest, k = n_kept), listed only "
                               "when that band holds both kept and dropped positions, else []. AdaKV: "
                               "global cut over all heads' safeguarded scores plus each head's "
                               "safeguard cut." % TIE_RTOL,
        "generation": "pipeline-style (KVPressTextGenerationPipeline._forward/generate_answer, no "
                      "question): prefill the whole prompt inside `with press(model)`, first token = "
                      "argmax of the (uncompressed) prefill logits, then greedy decoding outside the "
                      "press context with position_ids n, n+1, ..., up to %d tokens, stopping after "
                      "EOS" % MAX_NEW_TOKENS,
        "generate_crosscheck": None if args.no_generate_check else {
            "method": "with press(model): model.generate(ids, do_sample=False, max_new_tokens=%d)"
                      % MAX_NEW_TOKENS,
            "n_checked": n_checked, "n_equal": n_checked - len(mismatches), "mismatches": mismatches},
        "sketch": "CompactorPress's leverage sketch Phi is the identity / sqrt(k) (k = head_dim = 64): "
                  "torch.randn inside kvpress.presses.leverage_press returns identity matrices "
                  "(_IdentitySketchTorch); everything else in kvpress runs unchanged",
        "prompts": prompts,
        "configs": configs_out,
    }
    path = args.out
    if only:
        with open(args.out, encoding="utf-8") as f:
            main_names = {c["name"] for c in json.load(f)["configs"]}
        again = sorted(c["name"] for c in out["configs"] if c["name"] in main_names)
        if again:
            sys.exit(f"--only: {args.out} already holds {again}: regenerate the whole file to change them")
        path = args.added
        if os.path.exists(path):
            out = merged_into_existing(path, out)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = to_json(out) + "\n"
    json.loads(text)  # valid JSON
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path} ({len(text.encode()) / 1e6:.2f} MB), generate cross-check "
          f"{n_checked - len(mismatches)}/{n_checked} equal")


if __name__ == "__main__":
    main()
