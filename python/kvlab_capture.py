#!/usr/bin/env python3
"""Write a kvlab capture (post-RoPE q/k/v per layer and head, HDF5) from any Hugging Face
transformers causal LM with llama-style attention (llama, mistral, qwen2, qwen3, ...).

The file is what `kvlab dump` writes (docs/capture-format.md, version 2): the same root and sample
attributes (fixed-length UTF-8 strings, int64, float64), tokens int32 [n_tokens], and per captured
layer q [n_q_heads, n_q, head_dim] (the last n_q positions), k and v [n_kv_heads, n_tokens, head_dim],
chunked one head per chunk and filtered by shuffle, deflate (1) and Fletcher32; version-1 HDF5
object headers (what kvlab's reader checks); written to <out>.partial, marked `complete`, and
renamed to <out>. `kvlab inspect`, `kvlab replay` and the analyses read it as they read a dump.

How q/k/v are obtained: a forward hook on each captured layer's attention module receives its
hidden_states and position_embeddings (cos, sin); q_proj/k_proj/v_proj are applied again, then
q_norm/k_norm if the module has them (qwen3, gemma3), then the modeling file's own apply_rotary_pos_emb;
a score scale other than 1/sqrt(head_dim) (gemma3's query_pre_attn_scalar) is folded into q, as
`kvlab dump` does. A sliding layer is captured only for prompts within its window (the capture
records none): --layers all leaves such layers out when others attend globally (gemma3).
Each layer is written as soon as the model produces it and the forward pass stops after the last
captured layer (no logits). A self-check recomputes the module's output for the last 8 positions
from the captured q/k/v (softmax(q k^T / sqrt(head_dim)) v, causal, sliding window if the layer has one,
then o_proj) and refuses a module it does not reproduce (attention sinks, logit soft-capping,
partial RoPE, fused projections, ...), so a capture is either right or not written.

Usage:
  python kvlab_capture.py --model DIR|HUB_NAME|FILE.gguf [--gguf-file F]
      (--prompt TEXT | --prompt-ids 1,2,3 | --text-file F) [--chat-template auto|none]
      [--layers all|0,5,29] [--queries all|last:N] [--dtype float32|float16|bfloat16]
      [--compute-dtype float32|bfloat16|float16] [--device cpu|cuda|cuda:N] [--threads N]
      [--model-id ID] [--overwrite] --out cap.h5

  --prompt-ids takes the token ids as they are (no tokenizer, no BOS added); --prompt and
  --text-file are tokenized by the model's tokenizer, through its chat template (a single user
  message, generation prompt added) unless --chat-template none. Ids can differ from `kvlab dump`'s
  own tokenizer on the same text: to compare the two, give both the same ids (read them from a
  dump's /sample_0000/tokens). --compute-dtype is the forward pass's dtype; --dtype the storage.

  Example (CPU, the repository's SmolLM2 GGUF; transformers dequantizes it to float32):
    python python/kvlab_capture.py --model models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --prompt "The quick brown fox" --chat-template none --layers 0,29 --queries last:16 \\
        --threads 1 --out /tmp/smollm2.h5
    build/apps/kvlab inspect /tmp/smollm2.h5

GPU use case: capture a model kvlab cannot run itself (or a long prompt) on a GPU machine with any
HF checkpoint, then replay it on the machine that has kvlab:
  1. python kvlab_capture.py --model Qwen/Qwen3-8B --device cuda --compute-dtype bfloat16 \\
         --text-file prompt.txt --layers all --queries last:256 --dtype bfloat16 --out qwen3-8b.h5
  2. scp gpu-host:qwen3-8b.h5 captures/
  3. build/apps/kvlab replay --capture captures/qwen3-8b.h5 --method snapkv,streaming_llm --ratio 0.1,0.2

Needs numpy, h5py, torch and transformers (and gguf, accelerate for .gguf models). Exit status 0 on success, 1 with
one line "kvlab_capture.py: error: ..." on any failure; an existing --out is then never touched.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvlab.outputs import OutputError, check_output  # noqa: E402  (python/kvlab, beside this file)

PROG = "kvlab_capture.py"
CAPTURE_VERSION = 2  # kCaptureVersion in lib/kvlab/io/capture.h
# CaptureLimits (lib/kvlab/io/capture.h): the reader refuses more.
MAX_LAYERS, MAX_HEADS, MAX_HEAD_DIM = 4096, 4096, 16384
MAX_TOKENS, MAX_STRING_BYTES = 1 << 26, 1 << 16
CHECK_ROWS = 8  # query positions the self-check recomputes per captured layer


class CaptureError(Exception):
    """A failure reported as one line."""


# ================================== the capture file (h5py) ======================================

class CaptureWriter:
    """Streams one capture as lib/kvlab/io/capture.cpp's CaptureWriter does: attributes in the same
    order and types, a group per sample and per layer, q/k/v written layer by layer; finish() adds
    n_samples and `complete`, fsyncs and renames <path>.partial to <path>; abort() removes the
    partial file. Low-level h5py (h5f/h5g/h5a/h5d) so that every type and property is explicit."""

    def __init__(self, path, meta):
        import h5py
        from h5py import h5a, h5d, h5f, h5g, h5p, h5s, h5t
        self.h5py, self.h5a, self.h5d, self.h5g, self.h5p, self.h5s, self.h5t, self.h5f = (
            h5py, h5a, h5d, h5g, h5p, h5s, h5t, h5f)
        self.path, self.partial = path, path + ".partial"
        self.meta = meta
        self.dtype = meta["dtype"]
        self.ftype = self._float_type(self.dtype)
        self.n_samples = 0
        self.sample = None
        self.fid = None
        m = meta
        for key in ("n_q_heads", "n_kv_heads"):
            if not 0 < m[key] <= MAX_HEADS:
                raise CaptureError(f"capture '{path}': {key}={m[key]} outside [1, {MAX_HEADS}]")
        if not (0 < m["n_layers"] <= MAX_LAYERS and 0 < m["head_dim"] <= MAX_HEAD_DIM
                and m["n_q_heads"] % m["n_kv_heads"] == 0):
            raise CaptureError(f"capture '{path}': invalid architecture n_layers={m['n_layers']} "
                               f"n_q_heads={m['n_q_heads']} n_kv_heads={m['n_kv_heads']} head_dim={m['head_dim']}")
        if not (math.isfinite(m["rope_theta"]) and m["rope_theta"] > 0):
            raise CaptureError(f"capture '{path}': rope_theta must be positive, got {m['rope_theta']}")
        for key in ("model_id", "architecture", "rope_scaling", "queries", "source_dataset", "kvlab_version",
                    "git_sha"):
            self._check_string(key, m[key])
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        # Version-1 object headers, symbol-table groups, version-3 layouts: the 1.8 file format,
        # which kvlab's reader (HDF5 1.10) reads and checks (capture_headers.cpp refuses 'OHDR').
        fapl = h5p.create(h5p.FILE_ACCESS)
        fapl.set_libver_bounds(h5f.LIBVER_EARLIEST, h5f.LIBVER_V18)
        fapl.set_fclose_degree(h5f.CLOSE_STRONG)
        self.fid = h5f.create(self.partial.encode(), h5f.ACC_TRUNC, fapl=fapl)
        try:
            self.root = h5g.open(self.fid, b"/")
            self._put_root_attributes(m)
        except BaseException:
            self.abort()
            raise

    def _put_root_attributes(self, m):
        r = self.root
        self._put_int(r, "kvlab_capture_version", CAPTURE_VERSION)
        self._put_str(r, "model_id", m["model_id"])
        self._put_str(r, "architecture", m["architecture"])
        self._put_int(r, "n_layers", m["n_layers"])
        self._put_int(r, "n_q_heads", m["n_q_heads"])
        self._put_int(r, "n_kv_heads", m["n_kv_heads"])
        self._put_int(r, "head_dim", m["head_dim"])
        self._put_double(r, "rope_theta", m["rope_theta"])
        self._put_str(r, "rope_scaling", m["rope_scaling"])
        self._put_str(r, "dtype", m["dtype"])
        self._put_ints(r, "layers", m["layers"])
        self._put_str(r, "queries", m["queries"])
        self._put_str(r, "source_dataset", m["source_dataset"])
        self._put_str(r, "kvlab_version", m["kvlab_version"])
        self._put_str(r, "git_sha", m["git_sha"])
        self._put_int(r, "rope_applied", 1)

    # ---- types and attributes (capture_hdf5.cpp: float_file_type, fixed_string_type) ----
    def _float_type(self, dtype):
        t = self.h5t.IEEE_F32LE.copy()
        if dtype == "float16":    # IEEE half
            t.set_fields(15, 10, 5, 0, 10)
            t.set_size(2)
            t.set_ebias(15)
        elif dtype == "bfloat16":  # sign 15, exponent 7..14, mantissa 0..6, bias 127
            t.set_fields(15, 7, 8, 0, 7)
            t.set_size(2)
            t.set_ebias(127)
        elif dtype != "float32":
            raise CaptureError(f"--dtype: expected float32, float16 or bfloat16, got '{dtype}'")
        return t

    def _check_string(self, name, value):
        if len(value.encode("utf-8")) > MAX_STRING_BYTES:
            raise CaptureError(f"capture '{self.path}': {name} has more than the {MAX_STRING_BYTES} bytes a "
                               "capture allows")

    def _put_str(self, loc, name, value):
        data = value.encode("utf-8")
        n = max(len(data), 1)  # fixed-length, NUL-padded, UTF-8; at least 1 byte
        t = self.h5t.C_S1.copy()
        t.set_size(n)
        t.set_strpad(self.h5t.STR_NULLPAD)
        t.set_cset(self.h5t.CSET_UTF8)
        a = self.h5a.create(loc, name.encode(), t, self.h5s.create(self.h5s.SCALAR))
        a.write(np.array(data.ljust(n, b"\0"), dtype=f"S{n}"), mtype=t)

    def _put_int(self, loc, name, value):
        a = self.h5a.create(loc, name.encode(), self.h5t.STD_I64LE, self.h5s.create(self.h5s.SCALAR))
        a.write(np.array(int(value), dtype=np.int64), mtype=self.h5t.NATIVE_INT64)

    def _put_double(self, loc, name, value):
        a = self.h5a.create(loc, name.encode(), self.h5t.IEEE_F64LE, self.h5s.create(self.h5s.SCALAR))
        a.write(np.array(float(value), dtype=np.float64), mtype=self.h5t.NATIVE_DOUBLE)

    def _put_ints(self, loc, name, values):
        v = np.asarray(values, dtype=np.int64)
        a = self.h5a.create(loc, name.encode(), self.h5t.STD_I64LE, self.h5s.create_simple((len(v),)))
        if len(v):
            a.write(v, mtype=self.h5t.NATIVE_INT64)

    # ---- samples and layers ----
    def begin_sample(self, sample_id, tokens, n_q):
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if not 1 <= n <= MAX_TOKENS:
            raise CaptureError(f"capture '{self.path}': a sample needs 1 to {MAX_TOKENS} tokens, got {n}")
        if not 1 <= n_q <= n:
            raise CaptureError(f"capture: n_q must be in [1, n_tokens={n}], got {n_q}")
        if tokens.min() < np.iinfo(np.int32).min or tokens.max() > np.iinfo(np.int32).max:
            raise CaptureError("capture: token ids must fit int32")
        self._check_string("sample_id", sample_id)
        g = self.h5g.create(self.root, f"sample_{self.n_samples:04d}".encode())
        self._put_str(g, "sample_id", sample_id)
        self._put_int(g, "n_tokens", n)
        self._put_int(g, "n_q", n_q)
        self._put_int(g, "q_start", n - n_q)
        ds = self.h5d.create(g, b"tokens", self.h5t.STD_I32LE, self.h5s.create_simple((n,)))  # contiguous
        ds.write(self.h5s.ALL, self.h5s.ALL, np.ascontiguousarray(tokens.astype(np.int32)),
                 mtype=self.h5t.NATIVE_INT32)
        self.sample, self.n_tokens, self.n_q, self.written = g, n, n_q, set()

    def _storage_array(self, t):
        """A torch tensor in the storage dtype as a numpy array of the same bytes."""
        import torch
        c = t.detach().to("cpu")
        if self.dtype == "float32":
            return c.to(torch.float32).contiguous().numpy()
        if self.dtype == "float16":
            return c.to(torch.float16).contiguous().numpy()
        return c.to(torch.bfloat16).contiguous().view(torch.int16).numpy()  # bits, HDF5 type says bf16

    def _write_tensor(self, group, name, t):
        arr = self._storage_array(t)  # [heads, n, head_dim]
        heads, n, d = arr.shape
        dcpl = self.h5p.create(self.h5p.DATASET_CREATE)
        dcpl.set_chunk((1, min(n, 4096), max(d, 1)))  # one head per chunk
        dcpl.set_shuffle()
        dcpl.set_deflate(1)
        dcpl.set_fletcher32()  # last: checked first on read
        ds = self.h5d.create(group, name.encode(), self.ftype, self.h5s.create_simple(arr.shape), dcpl=dcpl)
        ds.write(self.h5s.ALL, self.h5s.ALL, np.ascontiguousarray(arr), mtype=self.ftype)  # no conversion

    def write_layer(self, layer, q, k, v):
        """q [n_q_heads, n_q or n_tokens, head_dim] (the last n_q rows are kept), k, v [n_kv_heads,
        n_tokens, head_dim]; torch tensors of any float dtype and device."""
        m, n = self.meta, self.n_tokens
        if layer not in m["layers"] or layer in self.written:
            raise CaptureError(f"capture '{self.path}': layer {layer} not captured or written twice")
        if q.shape[1] == n:
            q = q[:, n - self.n_q:]
        for name, t, heads, length in (("q", q, m["n_q_heads"], self.n_q), ("k", k, m["n_kv_heads"], n),
                                       ("v", v, m["n_kv_heads"], n)):
            if tuple(t.shape) != (heads, length, m["head_dim"]):
                raise CaptureError(f"capture '{self.path}': layer {layer} {name}: expected "
                                   f"[{heads}, {length}, {m['head_dim']}], got {list(t.shape)}")
        g = self.h5g.create(self.sample, f"layer_{layer:02d}".encode())
        for name, t in (("q", q), ("k", k), ("v", v)):
            self._write_tensor(g, name, t)
        self.written.add(layer)

    def end_sample(self):
        if len(self.written) != len(self.meta["layers"]):
            raise CaptureError(f"capture '{self.path}': sample {self.n_samples} has {len(self.written)} of "
                               f"{len(self.meta['layers'])} layers written")
        self.sample = None
        self.h5f.flush(self.fid)
        self.n_samples += 1

    def finish(self):
        if self.n_samples == 0:
            raise CaptureError(f"capture '{self.path}': no samples were written")
        self._put_int(self.root, "n_samples", self.n_samples)
        self._put_int(self.root, "complete", 1)  # last: a file without it was not finished
        self.root = None
        self.fid.close()
        self.fid = None
        _fsync(self.partial)  # on disk before the name points at it
        os.replace(self.partial, self.path)
        _fsync(os.path.dirname(os.path.abspath(self.path)))

    def abort(self):
        self.sample = self.root = None
        if self.fid is not None:
            try:
                self.fid.close()
            except Exception:  # noqa: BLE001 - the partial file goes anyway
                pass
            self.fid = None
        if os.path.exists(self.partial):
            os.remove(self.partial)


def _fsync(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != 22:  # EINVAL: not syncable (some directories)
            raise CaptureError(f"fsync of '{path}' failed: {e.strerror}") from e
    finally:
        os.close(fd)


# ================================== arguments ====================================================

def parse_layers(s, n_layers):
    if s == "all":
        return list(range(n_layers))
    out = set()
    for item in s.split(","):
        try:
            v = int(item)
        except ValueError:
            raise CaptureError(f"--layers '{s}': '{item}' is not an integer (expected 'all' or e.g. 0,1,4)") from None
        if not 0 <= v < n_layers:
            raise CaptureError(f"--layers '{s}': layer {v} out of range [0, {n_layers}) for this model")
        out.add(v)
    if not out:
        raise CaptureError(f"--layers '{s}': no layer given")
    return sorted(out)


def parse_queries(s):
    """'all' -> None, 'last:N' -> N."""
    if s == "all":
        return None
    if s.startswith("last:"):
        try:
            n = int(s[5:])
        except ValueError:
            n = 0
        if n >= 1 and s[5:].strip() == s[5:]:
            return n
    raise CaptureError(f"--queries '{s}': expected 'all' or 'last:N' with N >= 1")


def parse_ids(s):
    try:
        ids = [int(x) for x in s.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise CaptureError(f"--prompt-ids: expected comma-separated integers, got '{s[:60]}'") from None
    if not ids:
        raise CaptureError("--prompt-ids: no token ids")
    return ids


def resolve_model(model, gguf_file):
    """(path or hub name for from_pretrained, gguf file name or None)."""
    if gguf_file:
        return model, gguf_file
    if model.endswith(".gguf") and os.path.isfile(model):
        return os.path.dirname(os.path.abspath(model)), os.path.basename(model)
    return model, None


def git_sha():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ================================== the model ====================================================

def torch_dtype(name, flag):
    import torch
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise CaptureError(f"{flag}: expected float32, float16 or bfloat16, got '{name}'")
    return table[name]


def rope_metadata(config):
    """(rope_theta, rope_scaling JSON as kvlab's RopeScaling::to_json writes it). transformers 5 keeps
    both in config.rope_parameters (per layer type for some models), older versions in rope_theta and
    rope_scaling."""
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        rp = rp.get("full_attention") or next(iter(rp.values()))  # per layer type: the global layers'
    scaling = dict(rp) if isinstance(rp, dict) and rp else (getattr(config, "rope_scaling", None) or {})
    theta = scaling.get("rope_theta") or getattr(config, "rope_theta", None)
    if not theta:
        theta = 10000.0
        warn("the config gives no rope_theta; recording 10000")
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        js = None
    elif kind == "linear":
        js = {"rope_type": "linear", "factor": float(scaling["factor"])}
    elif kind == "llama3":
        js = {"rope_type": "llama3", "factor": float(scaling["factor"]),
              "low_freq_factor": float(scaling["low_freq_factor"]),
              "high_freq_factor": float(scaling["high_freq_factor"]),
              "original_max_position_embeddings": int(scaling["original_max_position_embeddings"])}
    else:
        js = {k: v for k, v in scaling.items() if k != "rope_theta"}
        warn(f"rope scaling '{kind}' is recorded as the config gives it; kvlab replay --rerotate supports only "
             "none, linear and llama3 (q/k themselves are the model's own post-RoPE values)")
    # nlohmann::json::dump(): keys sorted, no spaces.
    return float(theta), json.dumps(js, sort_keys=True, separators=(",", ":"))


def decoder_layers(model):
    base = None
    if hasattr(model, "get_decoder"):
        try:
            base = model.get_decoder()
        except Exception:  # noqa: BLE001 - fall back to .model
            base = None
    for cand in (base, getattr(model, "model", None), model):
        layers = getattr(cand, "layers", None) if cand is not None else None
        if layers is not None and len(layers) > 0:
            return layers
    raise CaptureError(f"{type(model).__name__}: no decoder layers at get_decoder().layers or model.layers; only "
                       "llama-style decoder models (llama, mistral, qwen2, qwen3, ...) are supported")


def rope_function(attn):
    mod = sys.modules.get(type(attn).__module__)
    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if fn is None:
        raise CaptureError(f"{type(attn).__name__}: its modeling file defines no apply_rotary_pos_emb; only "
                           "llama-style attention (q_proj/k_proj/v_proj, RoPE) is supported")
    return fn


def attention_geometry(attn, layer):
    """(n_q_heads, n_kv_heads, head_dim) of one attention module, or a one-line refusal."""
    import torch
    name = type(attn).__name__
    missing = [p for p in ("q_proj", "k_proj", "v_proj", "o_proj") if not isinstance(getattr(attn, p, None),
                                                                                     torch.nn.Module)]
    if missing:
        raise CaptureError(f"layer {layer}: {name} has no {', '.join(missing)}; only llama-style attention with "
                           "separate q_proj/k_proj/v_proj/o_proj (llama, mistral, qwen2, qwen3, ...) is supported")
    hd = getattr(attn, "head_dim", None)
    if not isinstance(hd, int) or hd <= 0:
        raise CaptureError(f"layer {layer}: {name} has no integer head_dim attribute")
    outs = [getattr(getattr(attn, p), "out_features", None) for p in ("q_proj", "k_proj", "v_proj")]
    if any(o is None or o % hd for o in outs) or outs[1] != outs[2]:
        raise CaptureError(f"layer {layer}: {name}: q/k/v projections of {outs} features are not heads of "
                           f"head_dim {hd}")
    for norm in ("q_norm", "k_norm"):
        w = getattr(getattr(attn, norm, None), "weight", None)
        if w is not None and tuple(w.shape) != (hd,):
            raise CaptureError(f"layer {layer}: {name}.{norm} normalises {tuple(w.shape)} features, not one "
                               f"head ({hd}); only per-head q/k norms (qwen3) are supported")
    return outs[0] // hd, outs[1] // hd, hd


def first_nonfinite(tensors):
    import torch
    for name, t in tensors:
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            idx = np.unravel_index(int(bad.flatten().to(torch.uint8).argmax()), tuple(t.shape))
            return int(bad.sum()), f"{name} = {t[idx].item()} at head {idx[0]}, position {idx[1]} (dim {idx[2]})"
    return 0, ""


class _Stop(Exception):
    """Raised by the hook after the last captured layer: the rest of the forward pass is not needed."""


def warn(msg):
    print(f"[{PROG}] warning: {msg}", file=sys.stderr)


def note(msg):
    print(f"[{PROG}] {msg}", file=sys.stderr)


def capture(args):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    queries_n = parse_queries(args.queries)
    storage = args.dtype
    torch_dtype(storage, "--dtype")
    compute = torch_dtype(args.compute_dtype, "--compute-dtype")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise CaptureError(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        raise CaptureError(f"--device: expected cpu, cuda or cuda:N, got '{args.device}'")
    out = args.out
    path, gguf = resolve_model(args.model, args.gguf_file)
    try:  # never over an input (every file of a model directory), even with --overwrite
        check_output(out, args.overwrite, [os.path.join(path, gguf) if gguf else path, args.model, args.text_file])
    except OutputError as e:
        raise CaptureError(str(e))
    if os.path.exists(out + ".partial"):
        os.remove(out + ".partial")
        note(f"removed {out}.partial, left by an interrupted run")

    # Prompt text first, so a bad --text-file fails before the model loads.
    text = None
    if args.prompt is not None:
        text, source = args.prompt, "prompt"
    elif args.text_file is not None:
        try:
            with open(args.text_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CaptureError(f"--text-file {args.text_file}: {e}") from None
        source = args.text_file
    else:
        ids, source = parse_ids(args.prompt_ids), "prompt-ids"
    if text is not None and not text.strip():
        raise CaptureError("the prompt is empty")
    if text is not None:
        # A folder without a tokenizer's files: transformers still returned one, and the prompt became
        # two tokens (issue 50). Refused, naming the files looked for.
        tok_files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
        if not gguf and os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in tok_files):
            raise CaptureError(f"--model {args.model}: no tokenizer files ({', '.join(tok_files)}) to tokenize "
                               f"--{source if source == 'prompt' else 'text-file'} with; add them, or give "
                               "--prompt-ids")

    t0 = time.time()
    kw = {"dtype": compute, "trust_remote_code": args.trust_remote_code}
    if gguf:
        kw["gguf_file"] = gguf
    if args.attn_implementation:
        kw["attn_implementation"] = args.attn_implementation
    if args.device != "cpu":
        kw["device_map"] = args.device  # weights go straight to the GPU, not through host memory
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    except Exception as e:  # noqa: BLE001 - one line naming the model
        raise CaptureError(f"--model {args.model}: cannot load it: {str(e).splitlines()[0] if str(e) else e!r}") \
            from None
    model.eval()
    model.to(args.device)
    config = model.config
    if text is not None:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf} if gguf else {}),
                                            trust_remote_code=args.trust_remote_code)
        if args.chat_template == "auto" and getattr(tok, "chat_template", None):
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                               add_generation_prompt=True)
            ids = tok(rendered, add_special_tokens=False)["input_ids"]
        else:
            if args.chat_template == "auto":
                note("the tokenizer has no chat template; the prompt is used as it is")
            ids = tok(text, add_special_tokens=True)["input_ids"]
    vocab = model.get_input_embeddings().num_embeddings
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise CaptureError(f"token id {bad[0]} outside the model's vocabulary [0, {vocab})")
    T = len(ids)
    if queries_n is not None and queries_n > T:
        warn(f"--queries {args.queries} asks for more positions than the prompt's {T} tokens; all are stored")
    n_q = T if queries_n is None else min(queries_n, T)

    layers_mod = decoder_layers(model)
    n_layers = len(layers_mod)
    wanted = parse_layers(args.layers, n_layers)
    attns = {}
    for i in wanted:
        attn = getattr(layers_mod[i], "self_attn", None)
        if attn is None:
            raise CaptureError(f"layer {i}: {type(layers_mod[i]).__name__} has no self_attn module")
        attns[i] = attn
    geo = {i: attention_geometry(a, i) for i, a in attns.items()}
    if len(set(geo.values())) != 1:
        raise CaptureError(f"the captured layers differ in heads or head_dim: {sorted(set(geo.values()))}")
    n_qh, n_kvh, hd = next(iter(geo.values()))
    # A model whose scores are not scaled by 1/sqrt(head_dim) (gemma3's query_pre_attn_scalar) gets
    # the difference folded into q, as `kvlab dump` does: softmax(q k^T / sqrt(head_dim)) of the
    # captured q is the model's attention.
    q_fold = {}
    for i, a in attns.items():
        rope_function(a)
        scaling = float(getattr(a, "scaling", hd ** -0.5))
        q_fold[i] = scaling * math.sqrt(hd)
    folded = {i: f for i, f in q_fold.items() if abs(f - 1.0) > 1e-6}
    if folded:
        i, f = next(iter(folded.items()))
        note(f"layer {i} scales scores by {f * hd ** -0.5:g}, not 1/sqrt(head_dim) = {hd ** -0.5:g}: q is stored "
             f"times {f:g} ({len(folded)} layers folded) so that replay's 1/sqrt(head_dim) gives the model's attention")
    # A capture records no attention window (replay's exact reference is full causal attention), so
    # a sliding layer is captured only for prompts within its window, as `kvlab dump` does:
    # --layers all leaves such layers out when others attend globally (gemma3), and says so.
    def layer_window(a):
        return getattr(a, "sliding_window", None) if hasattr(a, "sliding_window") else \
            getattr(config, "sliding_window", None)
    past = [i for i, a in attns.items() if layer_window(a) and T > layer_window(a)]
    if past and args.layers == "all" and len(past) < len(attns):
        note(f"{len(past)} layers slide through a window shorter than the prompt's {T} tokens, which a capture "
             f"does not record; --layers all captures the {len(attns) - len(past)} others")
        wanted = [i for i in wanted if i not in past]
        attns = {i: a for i, a in attns.items() if i not in past}
    elif past:
        raise CaptureError(f"--layers {args.layers}: layer {past[0]} attends through a sliding window of "
                           f"{layer_window(attns[past[0]])} tokens, shorter than the prompt's {T}; a capture records "
                           "no window (replay would judge against full attention): shorten the prompt or name "
                           "layers without one")
    theta, rope_scaling = rope_metadata(config)
    arch = getattr(config, "model_type", None) or type(model).__name__
    model_id = args.model_id or (os.path.join(args.model, args.gguf_file) if args.gguf_file else args.model)
    meta = {
        "model_id": model_id, "architecture": arch, "n_layers": n_layers, "n_q_heads": n_qh,
        "n_kv_heads": n_kvh, "head_dim": hd, "rope_theta": theta, "rope_scaling": rope_scaling,
        "dtype": storage,
        "layers": wanted, "queries": args.queries, "source_dataset": source,
        "kvlab_version": f"{PROG} (transformers {transformers.__version__}, torch {torch.__version__})",
        "git_sha": git_sha(),
    }
    note(f"{model_id} ({arch}): {n_layers} layers, {n_qh} q / {n_kvh} kv heads, head_dim {hd}; {T} tokens, "
         f"layers {','.join(map(str, wanted))}, queries {args.queries}, compute {args.compute_dtype} on "
         f"{args.device}, storage {meta['dtype']} (loaded in {time.time() - t0:.1f} s)")

    writer = CaptureWriter(out, meta)
    last = wanted[-1]
    check_tol = 1e-3 if compute == torch.float32 else 5e-2
    worst = [0.0]

    def make_hook(layer, rope):
        def hook(mod, hargs, hkwargs, output):
            h = hkwargs.get("hidden_states", hargs[0] if hargs else None)
            pe = hkwargs.get("position_embeddings", hargs[1] if len(hargs) > 1 else None)
            if h is None or pe is None:
                raise CaptureError(f"layer {layer}: {type(mod).__name__} is not called with hidden_states and "
                                   "position_embeddings (cos, sin); only llama-style attention is supported")
            B, L, _ = h.shape
            q = mod.q_proj(h).view(B, L, -1, hd)
            k = mod.k_proj(h).view(B, L, -1, hd)
            v = mod.v_proj(h).view(B, L, -1, hd)
            if getattr(mod, "q_norm", None) is not None:
                q = mod.q_norm(q)
            if getattr(mod, "k_norm", None) is not None:
                k = mod.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, H, T, d]
            cos, sin = pe
            q, k = rope(q, k, cos, sin)
            if q_fold[layer] != 1.0:
                q = q * q_fold[layer]
            if not args.no_check:
                worst[0] = max(worst[0], self_check(mod, layer, q, k, v, output, hd, check_tol, config))
            qt, kt, vt = q[0, :, L - n_q:], k[0], v[0]
            count, first = first_nonfinite((("q", qt), ("k", kt), ("v", vt)))
            if count:
                raise CaptureError(f"layer {layer}: the forward pass produced {count} non-finite values in q/k/v; "
                                   f"the first is {first}; nothing written to --out {out}")
            writer.write_layer(layer, qt, kt, vt)
            if layer == last:
                raise _Stop()
        return hook

    hooks = [a.register_forward_hook(make_hook(i, rope_function(a)), with_kwargs=True) for i, a in attns.items()]
    t1 = time.time()
    try:
        writer.begin_sample("prompt", ids, n_q)
        input_ids = torch.tensor([ids], dtype=torch.long, device=args.device)
        try:
            with torch.inference_mode():
                model(input_ids=input_ids, use_cache=False)
        except _Stop:
            pass
        writer.end_sample()
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        for h in hooks:
            h.remove()
    check = "not checked (--no-check)" if args.no_check else f"self-check max rel. error {worst[0]:.2e}"
    note(f"wrote {out}: 1 sample, {T} tokens, {len(wanted)} layer{'s' * (len(wanted) != 1)}, queries {args.queries}, "
         f"{time.time() - t1:.1f} s; {check}")


def self_check(mod, layer, q, k, v, output, hd, tol, config):
    """The module's output at the last CHECK_ROWS positions recomputed from the captured q/k/v:
    softmax(q k^T / sqrt(head_dim)) v over the causal (sliding-window) keys, then o_proj. Returns the
    relative L2 error; refuses the module above `tol`."""
    import torch
    o = output[0] if isinstance(output, (tuple, list)) else output
    if not torch.is_tensor(o) or o.dim() != 3:
        raise CaptureError(f"layer {layer}: {type(mod).__name__} returns no [batch, tokens, hidden] output")
    T = q.shape[2]
    m = min(T, CHECK_ROWS)
    g = q.shape[1] // k.shape[1]
    qs = q[0, :, T - m:].float()
    ks = k[0].float().repeat_interleave(g, 0)
    vs = v[0].float().repeat_interleave(g, 0)
    s = qs @ ks.transpose(1, 2) * hd ** -0.5  # [Hq, m, T]; q carries any other scaling (q_fold)
    window = getattr(mod, "sliding_window", None) if hasattr(mod, "sliding_window") else \
        getattr(config, "sliding_window", None)
    pos = torch.arange(T - m, T, device=q.device)[:, None]
    key = torch.arange(T, device=q.device)[None, :]
    allowed = key <= pos
    if window:
        allowed &= pos - key < window
    s = s.masked_fill(~allowed, float("-inf"))
    a = torch.softmax(s, dim=-1) @ vs  # [Hq, m, d]
    a = a.transpose(0, 1).reshape(1, m, -1).to(o.dtype)
    mine = mod.o_proj(a).float()
    ref = o[:, T - m:].float()
    err = float((mine - ref).norm() / ref.norm().clamp_min(1e-30))
    if not err <= tol:
        raise CaptureError(f"layer {layer}: {type(mod).__name__}'s output is not reproduced from the recomputed "
                           f"q/k/v (relative error {err:.2e} > {tol:g}): this attention is not the llama-style "
                           "q/k/v -> [q/k norm] -> RoPE -> softmax attention this script captures (pass --no-check "
                           "to write it anyway)")
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF directory, hub name, or a .gguf file")
    ap.add_argument("--gguf-file", help="GGUF file name inside --model (a directory)")
    ap.add_argument("--model-id", help="model_id attribute (default: --model as given, joined with --gguf-file)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt given inline")
    src.add_argument("--prompt-ids", help="token ids, comma-separated, used as they are")
    src.add_argument("--text-file", help="a text file used as one prompt")
    ap.add_argument("--chat-template", default="auto", choices=["auto", "none"],
                    help="auto: the tokenizer's chat template around the prompt (a user message), if it has one")
    ap.add_argument("--layers", default="all", help="'all' or comma-separated 0-based layer indices")
    ap.add_argument("--queries", default="all", help="'all' or 'last:N': query positions stored")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="storage dtype of q/k/v")
    ap.add_argument("--compute-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="dtype of the forward pass")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--attn-implementation", default=None, help="passed to from_pretrained (eager, sdpa, ...)")
    ap.add_argument("--trust-remote-code", action="store_true", help="passed to from_pretrained")
    ap.add_argument("--no-check", action="store_true", help="skip the self-check of each captured layer")
    ap.add_argument("--out", required=True, help="output capture file (.h5)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = ap.parse_args(argv)
    try:
        capture(args)
    except CaptureError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"{PROG}: error: {e} (needs numpy, h5py, torch, transformers; gguf and accelerate for .gguf models)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
