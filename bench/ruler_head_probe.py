#!/usr/bin/env python3
"""Are particular heads behind adakv's loss to snapkv under `--protocol whole`? An intervention test.

results/ruler_whole_extra/README.md found that the head-adaptive split (adakv, kvlab's paper preset:
Ada-SnapKV, window 32, max-pool kernel 7, safeguard 0.2) answers fewer needle samples than the even
split (snapkv, same scorer) under `whole`, and that on the samples where snapkv answers and adakv
does not, two (layer, KV head) pairs tend to lose the needle sentence under adakv while keeping some
of it under snapkv. This script moves those entries by hand, at the same budget, and looks at the
answers:

  snapkv:drop:19.2       snapkv, with the needle sentence's scores set to -inf in layer 19 KV head 2
                         (the head keeps its b entries: the next best take their place)
  adakv:keep:19.2+9.1    adakv, with the sentence's scores set to +inf in those heads (the layer's
                         H·b entries: the sentence displaces the lowest-ranked ones across heads)
  adakv:keep:0-14.*      every KV head of layers 0 to 14
  snapkv:drop:all        the sentence out of every head (a check that the edit reaches the answer)
  snapkv, adakv          no edit: their outputs must equal kvlab's committed ones (the check that
                         this re-run is the same computation; the script says how often they do)

It runs the model through transformers (the SmolLM2-135M-Instruct GGUF kvlab runs, dequantized to
float32) and drops entries with kvpress 0.5.5's masked-key decoding (`module.masked_key_indices`, the
mechanism of its AdaKVPress), on kvlab's own samples and whole-protocol prompt (the chat template
applied to the input, then the answer prefix; greedy; the first token from the exact prefill). The
scores are written here from SnapKV's definition as kvlab's snapkv.cpp states it (the last 32 prompt
queries' softmax over every key they see, averaged over a KV group's query heads, summed over the
window, max-pooled with kernel 7 and padding 3, the window's own keys always kept; ties to the lower
index), and the adaptive split from Ada-KV's (each head's ⌊α·b⌋ best, then the layer's best across
heads). Budget: b = round(ratio · n) entries per head, as kvlab's Budget::entries_for.

Needle positions: the tokens (by the tokenizer's character offsets) covering the sentence that holds
the value, from RULER's "One of the special magic ..." opening to its final "." (or only the value's
tokens with --span value), as scripts/ruler_needle_heads.py finds them.

Usage (the environment of bench/ruler_kvpress.py):
  /opt/kvpress-py/bin/python bench/ruler_head_probe.py results/ruler_whole \\
      --datasets niah_single_1_1024,niah_single_2_1024 --ratio 0.75 \\
      --conditions snapkv,adakv,snapkv:drop:19.2,adakv:keep:19.2 --out /tmp/probe
Writes <out>/<condition>.jsonl ({"dataset", "id", "output", "score"}; ":" and "+" as "_", "*" as "all") and
<out>/probe.json (versions, every call's arguments and table), and prints the table: per condition,
samples answered, and (no edit) how many outputs equal kvlab's. Resumable per condition file.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from kvpress.presses.base_press import BasePress  # noqa: E402  (importing kvpress patches attention: masked_key_indices)
from kvpress.presses.snapkv_press import SnapKVPress  # noqa: E402

from ruler_kvpress import MODELS, REPO, TOKENS, read_lines  # noqa: E402  (bench/, this script's folder)

sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "python"))
from ruler_needle_heads import span_positions  # noqa: E402
from kvlab import results  # noqa: E402
WINDOW, KERNEL = 32, 7  # kvlab's snapkv / adakv paper preset


def read_data(folder):
    """The samples of a results folder (data.jsonl.gz) or of a run folder (data/*.jsonl, with their dataset)."""
    if results.is_results_dir(folder):
        return results.read_data(folder)
    return [{"dataset": os.path.basename(p)[: -len(".jsonl")], **s}
            for p in sorted(glob.glob(os.path.join(folder, "data", "*.jsonl"))) for s in read_lines(p)]


def read_json(path):
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def parse_condition(text, n_layers=None, n_kv_heads=None):
    """'adakv:keep:19.2+9.1' -> ('adakv', 'keep', [(19, 2), (9, 1)]); 'snapkv' -> ('snapkv', None, []).
    Heads: LAYER.KVHEAD items joined by '+'; a layer may be a range A-B and a head '*' (every KV
    head), e.g. 0-14.*; 'all' is every head. Without n_layers / n_kv_heads only the syntax is checked."""
    parts = text.split(":")
    if parts[0] not in ("snapkv", "adakv") or len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] not in ("keep", "drop")):
        sys.exit(f"--conditions: '{text}' is not snapkv|adakv[:keep|drop:HEADS] (HEADS e.g. 19.2+9.1, 0-14.*, all)")
    if len(parts) == 1:
        return parts[0], None, []
    heads = []
    for item in ["0-{}.*".format((n_layers or 1) - 1)] if parts[2] == "all" else parts[2].split("+"):
        try:
            layers, head = item.split(".")
            lo, _, hi = layers.partition("-")
            ls = range(int(lo), int(hi or lo) + 1)
            hs = range(n_kv_heads or 1) if head == "*" else [int(head)]
        except ValueError:
            sys.exit(f"--conditions: '{text}': '{item}' is not LAYER.KVHEAD (a layer may be A-B, a head '*')")
        if n_layers is not None and (ls[0] < 0 or ls[-1] >= n_layers or any(not 0 <= h < n_kv_heads for h in hs)):
            sys.exit(f"--conditions: '{text}': '{item}' is outside the model's {n_layers} layers x {n_kv_heads} KV heads")
        heads += [(l, h) for l in ls for h in hs]
    return parts[0], parts[1], heads


def top_first(scores):
    """Indices of a 1-D score tensor, best first, ties to the lower index (a stable descending sort)."""
    return torch.sort(scores, descending=True, stable=True).indices


def kept_mask(scores, b, adaptive, alpha):
    """scores [Hkv, n] float64 -> bool [Hkv, n]: b per head (even), or Ada-KV's H·b across heads."""
    h, n = scores.shape
    kept = torch.zeros(h, n, dtype=torch.bool)
    if not adaptive:
        for i in range(h):
            kept[i, top_first(scores[i])[:b]] = True
        return kept
    n_safe = max(1, int(alpha * b)) if alpha > 0 and b > 0 else 0
    for i in range(h):
        kept[i, top_first(scores[i])[:n_safe]] = True
    rest = (~kept).flatten().nonzero().squeeze(1)                 # flat (head, position), head-major
    order = rest[top_first(scores.flatten()[rest])[: h * b - h * n_safe]]
    kept.view(-1)[order] = True
    return kept


class ProbePress(BasePress):
    """A kvpress press that keeps per head what kept_mask says, after the edits, and masks the rest
    with kvpress's fake keys while decoding (its AdaKV mechanism)."""

    def __init__(self, ratio, adaptive, alpha, edits):
        self.ratio, self.adaptive, self.alpha = ratio, adaptive, alpha
        self.edits = edits  # layer -> [(kv head, positions LongTensor, value)]

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        _, h_kv, n, _ = keys.shape  # keys [1, Hkv, n, d] post-RoPE
        g = module.config.num_attention_heads // h_kv
        probs = SnapKVPress.compute_window_attention(module, hidden_states, keys, WINDOW,
                                                     kwargs["position_embeddings"])  # [1, Hq, w, n-w]
        vote = probs.view(1, h_kv, g, WINDOW, n - WINDOW).mean(2).double().sum(2)  # [1, Hkv, n-w]
        vote = F.max_pool1d(vote, KERNEL, stride=1, padding=KERNEL // 2)           # [1, Hkv, n-w]
        scores = F.pad(vote, (0, WINDOW), value=math.inf)[0]                      # [Hkv, n]
        for head, pos, value in self.edits.get(module.layer_idx, []):
            scores[head, pos[pos < n - WINDOW]] = value
        b = min(n, max(1, math.floor(self.ratio * n + 0.5)))
        dropped = (~kept_mask(scores, b, self.adaptive, self.alpha)).nonzero()     # [m, 2] (head, position)
        module.masked_key_indices = (torch.zeros(len(dropped), dtype=torch.long), dropped[:, 0], dropped[:, 1])
        return keys, values


def needle_positions(tok, text, value, span):
    """Token positions of the prompt `text` covering the value (span "value") or its needle sentence
    (scripts/ruler_needle_heads.py's span_positions on the tokenizer's backend), None if absent."""
    pos = span_positions(tok.backend_tokenizer, text, value, 0, span)
    return None if pos is None else torch.tensor(sorted(pos))


def generate(model, ids, press, max_new, eos):
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad():
        with press(model):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
        out = []
        for _ in range(max_new):
            nxt = int(logits.argmax())
            if nxt in eos:
                break
            out.append(nxt)
            logits = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return out


def score(output, refs):
    """RULER's string_match_all on one sample (lib/kvlab/tasks/ruler.cpp ruler_score)."""
    pred = output.strip().lower()
    return sum(r.lower() in pred for r in refs) / len(refs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shards", nargs="+", help="a results folder (docs/results.md) or kvlab ruler run folders (--protocol whole)")
    ap.add_argument("--datasets", default="niah_single_1_1024,niah_single_2_1024")
    ap.add_argument("--ratio", type=float, default=0.75, help="kept fraction, as kvlab's --ratio")
    ap.add_argument("--alpha", type=float, default=0.2, help="adakv's safeguard (its paper preset: 0.2)")
    ap.add_argument("--conditions", default="snapkv,adakv")
    ap.add_argument("--span", choices=["sentence", "value"], default="sentence")
    ap.add_argument("--ids", default="", help="only these samples, DATASET:ID comma-separated (default: every one)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    for c in conditions:
        parse_condition(c)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    gguf = args.gguf or next(iter(sorted(glob.glob(os.path.join(MODELS, "smollm2-135m", "*.gguf")))), None)
    if not gguf:
        sys.exit("--gguf: no SmolLM2 GGUF under models/smollm2-135m (data_scripts/get_smollm2.sh)")
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    eos = {model.generation_config.eos_token_id} if isinstance(model.generation_config.eos_token_id, int) \
        else set(model.generation_config.eos_token_id or [])
    eos.add(tok.eos_token_id)

    samples = []  # (dataset, sample, {branch: kvlab's output})
    records = [r for folder in args.shards for r in results.load(folder)]
    for ds in args.datasets.split(","):
        # a results folder (docs/results.md) or the shards of a run: each its own share of the predictions
        kv = {br: {r["sample"]: r for r in records if r["method"] == br and r.get("kept") == args.ratio
                   and f"{r['task']}_{r['length']}" == ds} for br in ("snapkv", "adakv")}
        data = {s["index"]: s for folder in args.shards for s in read_data(folder) if s.get("dataset", ds) == ds}
        for _, s in sorted(data.items()):
            samples.append((ds, s, {br: kv[br].get(str(s["index"])) for br in kv}))
    if args.ids:
        want = {tuple(x.rsplit(":", 1)) for x in args.ids.split(",")}
        missing = want - {(ds, str(s["index"])) for ds, s, _ in samples}
        if missing:
            sys.exit(f"--ids: {sorted(missing)} not among the samples of --datasets {args.datasets}")
        samples = [x for x in samples if (x[0], str(x[1]["index"])) in want]
    if not samples:
        sys.exit(f"no samples of {args.datasets} under {args.shards}")
    os.makedirs(args.out, exist_ok=True)

    table = []
    for cond in conditions:
        method, action, heads = parse_condition(cond, model.config.num_hidden_layers, model.config.num_key_value_heads)
        path = os.path.join(args.out, cond.replace(":", "_").replace("+", "_").replace("*", "all") + ".jsonl")
        done = {(r["dataset"], r["id"]): r for r in read_lines(path)}
        t0, fresh = time.perf_counter(), 0
        with open(path, "a", encoding="utf-8") as fo:
            for ds, s, kvlab in samples:
                sid = str(s["index"])
                if (ds, sid) in done:
                    continue
                text = tok.apply_chat_template([{"role": "user", "content": s["input"]}], add_generation_prompt=True,
                                               tokenize=False) + s["answer_prefix"]
                ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
                theirs = next((p for p in kvlab.values() if p), None)
                if theirs and theirs["prompt_tokens"] != ids.shape[1]:
                    sys.exit(f"{ds} sample {sid}: {ids.shape[1]} prompt tokens here, kvlab's run has {theirs['prompt_tokens']}")
                edits = {}
                if action:
                    if len(s["outputs"]) != 1:
                        sys.exit(f"{ds} sample {sid}: {len(s['outputs'])} values; edits need one needle")
                    pos = needle_positions(tok, text, s["outputs"][0], args.span)
                    if pos is None:
                        sys.exit(f"{ds} sample {sid}: its value's {args.span} is not in the prompt")
                    for layer, head in heads:
                        edits.setdefault(layer, []).append((head, pos, math.inf if action == "keep" else -math.inf))
                press = ProbePress(args.ratio, method == "adakv", args.alpha, edits)
                family = next(k for k in TOKENS if ds.startswith(k))
                out_ids = generate(model, ids, press, TOKENS[family], eos)
                output = tok.decode(out_ids, skip_special_tokens=True)
                r = {"dataset": ds, "id": sid, "output": output, "score": score(output, s["outputs"]),
                     "prompt_tokens": ids.shape[1]}
                if not action and kvlab[method] is not None:
                    r["same_as_kvlab"] = output.strip() == kvlab[method]["output"].strip()
                fo.write(json.dumps(r, ensure_ascii=False) + "\n")
                fo.flush()
                done[(ds, sid)] = r
                fresh += 1
        rows = list(done.values())
        same = [r["same_as_kvlab"] for r in rows if "same_as_kvlab" in r]
        table.append((cond, sum(r["score"] for r in rows), len(rows),
                      f"{sum(same)}/{len(same)}" if same else "-", time.perf_counter() - t0, fresh))
        print(f"{cond}: {table[-1][1]:g} of {len(rows)} answered", flush=True)
    print(f"\n| condition | answered | of | outputs = kvlab's |\n|---|---|---|---|")
    for cond, answered, n, same, _, _ in table:
        print(f"| {cond} | {answered:g} | {n} | {same} |")
    # What made the folder: versions, the arguments of every call, and the table of this call.
    from importlib.metadata import version as pkg_version
    meta_path = os.path.join(args.out, "probe.json")
    calls = read_json(meta_path).get("calls", [])
    calls.append({"argv": sys.argv[1:], "table": [{"condition": c, "answered": a, "samples": n, "same_as_kvlab": same,
                                                   "seconds": round(sec, 1), "decoded_now": fresh}
                                                  for c, a, n, same, sec, fresh in table]})
    meta = {"tool": "bench/ruler_head_probe.py", "gguf": os.path.basename(gguf),
            "versions": {p: pkg_version(p) for p in ("kvpress", "transformers", "torch")}, "calls": calls}
    with open(meta_path, "w", encoding="utf-8") as fo:
        json.dump(meta, fo, indent=1)
        fo.write("\n")


if __name__ == "__main__":
    main()
