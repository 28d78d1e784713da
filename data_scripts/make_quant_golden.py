#!/usr/bin/env python3
"""Golden KV-cache quantization outputs of the reference implementations (issue 52).

Writes small JSON files into tests/fixtures/quant_golden/ that the C++ quantizers are tested
against. docs/quantization.md is the specification of every scheme (formulas, grouping axes,
rounding, zero-range groups, the residual window's hand-off, bytes stored); this script records
what the references actually produce on a few small, fixed tensors shaped like one layer of a KV
cache, [kv_heads=2, tokens=200, head_dim=64]:

  inputs.json               the keys and values (float16-exact float32 values, seeded)
  transformers_quanto.json  transformers QuantizedCache, backend "quanto" (optimum-quanto),
                            nbits 2 and 4: the defaults (axis_key=axis_value=0, group 64,
                            residual 128) and KIVI's axes (axis_key=-1, axis_value=0, group 32)
  transformers_hqq.json     transformers QuantizedCache, backend "hqq": the defaults (axes 0,
                            nbits 2, 4) and axes 1 (per token; nbits 2, 4, 8)
  fp8_e4m3fn.json           torch float8_e4m3fn round trips: per-tensor scale amax/448,
                            per-(head, token) scale amax/448 (floored at 1/(448*512)), vLLM's
                            one-shot calc_kv_scales (amax/200 for keys, amax/100 for values),
                            and a table of edge values (ties, subnormals, overflow, NaN) at scale 1
  kivi.json                 an independent transcription of KIVI (Liu et al. 2024, arXiv
                            2402.02750; official code github.com/jy-yuan/KIVI at commit
                            876b4d2d08e3b1d5f70d0969c299d8c7c42ddfb6, models/llama_kivi.py and
                            quant/new_pack.py), 2 and 4 bits, group 32, residual 128, computed in
                            float32 and in float16 (the official dtype)

The transformers caches are driven as a model would drive them: a prefill of 64 tokens, then 136
single-token decode steps (the residual window flushes at decode step 128, so the hand-off is
covered), checking at every step that the returned keys/values are [dequantized part | residual
tokens exactly as given | the new token exactly as given].

Pinned versions (the separate venv that make_kvpress_golden.py uses; CPU, one thread):
  /opt/kvpress-py/bin/pip install kvpress==0.5.5 gguf          # transformers 5.2.0, torch 2.15.0
  /opt/kvpress-py/bin/pip install optimum-quanto==0.2.7 hqq==0.2.8.post1 einops==0.8.2 ninja==1.13.2
  -> torch 2.15.0, transformers 5.2.0, optimum-quanto 0.2.7, hqq 0.2.8.post1, numpy 2.4.6,
     CPython 3.11 (versions are recorded in every file). optimum-quanto builds its small C++ CPU
     extension (bit unpacking) with ninja and the system g++ on first use.

Usage:
  OMP_NUM_THREADS=1 nice -n 19 /opt/kvpress-py/bin/python data_scripts/make_quant_golden.py \
      [--out-dir tests/fixtures/quant_golden]

Deterministic: the inputs come from numpy's PCG64 with a fixed seed, every computation runs on
CPU with one thread; two runs give byte-identical files.

File format (all files):
  * Binary arrays are base64 (RFC 4648, standard alphabet, padded) of little-endian raw bytes:
    "*_f32" float32, "*_f16" float16 bit patterns, "*_u8" bytes.
  * Arrays are row-major in the shape given next to them. The cache layer tensors are
    [heads, tokens, head_dim] (transformers' batch dimension of 1 is dropped; the flat element
    order is the same).
  * "codes": the integer codes of one quantized tensor, in the tensor's own element order (NOT the
    reference's internal bit packing, which docs/quantization.md describes), packed `bits` per code,
    least significant bits first: code i sits in byte (i*bits)//8 at bit (i*bits)%8. 8-bit codes
    are one byte each. FP8 codes are the float8_e4m3fn bit patterns, one byte each.
  * Group parameters ("scale", "shift", "zero", "mn") are float32 (float16 in kivi.json's
    float16 variant) in the reference's own order; "group_index" names the rule that maps a flat
    element index f of the tensor to its parameter index (see the "group_index_rules" entry of
    each file).
  * "dequant" says how the reference dequantizes (the same float operations, in this order, in
    the parameters' dtype); the script checks, bit for bit, that this formula applied to the
    stored codes and parameters gives the reference library's own dequantized tensor.
    "dequant_sum" and "dequant_sumsq" are float64 sums over that tensor (flat order), and
    "dequant_head_f32" its first 64 values, for a check that does not use the formula.
"""

import argparse
import base64
import json
import math
import os
import platform
import sys

import numpy as np
import torch

torch.set_num_threads(1)

H, T, D = 2, 200, 64
SEED = 52_2024
N_PREFILL = 64
RESIDUAL = 128


# ----------------------------------------------------------------------------- encoding helpers

def b64(arr, dtype):
    a = np.ascontiguousarray(np.asarray(arr).astype(dtype))
    return base64.b64encode(a.tobytes()).decode("ascii")


def f32(arr):
    return b64(np.asarray(arr, dtype=np.float32), "<f4")


def pack_codes(codes, bits):
    c = np.asarray(codes, dtype=np.uint8).reshape(-1)
    assert c.size == 0 or int(c.max()) < (1 << bits), (int(c.max()), bits)
    if bits == 8:
        return b64(c, "u1")
    per = 8 // bits
    pad = (-c.size) % per
    c = np.concatenate([c, np.zeros(pad, np.uint8)]).reshape(-1, per)
    out = np.zeros(c.shape[0], np.uint8)
    for i in range(per):
        out |= (c[:, i] << (bits * i)).astype(np.uint8)
    return b64(out, "u1")


def unpack_codes(s, bits, n):  # used by the self-check
    raw = np.frombuffer(base64.b64decode(s), np.uint8)
    if bits == 8:
        return raw[:n].copy()
    per = 8 // bits
    out = np.zeros((raw.size, per), np.uint8)
    for i in range(per):
        out[:, i] = (raw >> (bits * i)) & ((1 << bits) - 1)
    return out.reshape(-1)[:n]


def deq_stats(x):
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    x64 = x.astype(np.float64)
    return {"dequant_sum": float(np.sum(x64)), "dequant_sumsq": float(np.sum(x64 * x64)),
            "dequant_head_f32": f32(x[:64])}


def rel_err(xhat, x):
    x = np.asarray(x, np.float64)
    return float(np.linalg.norm(np.asarray(xhat, np.float64) - x) / np.linalg.norm(x))


def versions():
    import transformers
    v = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
         "transformers": transformers.__version__}
    try:
        import optimum.quanto as q
        v["optimum-quanto"] = q.__version__
    except Exception as e:  # noqa: BLE001
        v["optimum-quanto"] = f"unavailable: {e}"
    try:
        import hqq
        v["hqq"] = hqq.__version__
    except Exception as e:  # noqa: BLE001
        v["hqq"] = f"unavailable: {e}"
    return v


# ----------------------------------------------------------------------------- inputs

def make_inputs():
    """Keys/values [H, T, D]; head 1 has key outlier channels and value outlier tokens.

    Every value is float16-exact (rounded through float16), so the same numbers are exact in
    float32 and float16 and can be stored as float16 bit patterns.
    """
    rng = np.random.default_rng(SEED)
    K = rng.standard_normal((H, T, D))
    V = rng.standard_normal((H, T, D))
    # keys: outlier channels with offsets, as in real (RoPE'd) keys
    K[1, :, 3] = K[1, :, 3] * 6.0 + 12.0
    K[1, :, 17] = K[1, :, 17] * 4.0 - 9.0
    K[1, :, 40] = K[1, :, 40] * 10.0
    K[0, :, 61] = K[0, :, 61] * 3.0 + 2.0
    # zero-range groups: one channel constant over tokens 0..31 (per-channel groups of 32 and 64
    # tokens start there), one token constant over all channels (per-token groups)
    K[0, 0:32, 7] = -0.25
    K[1, 10, :] = 1.5
    # values: outlier tokens (a sink-like first token), a biased channel, a constant token
    V[1, 0, :] *= 12.0
    V[1, 50, :] *= 6.0
    V[1, 150, :] *= 8.0
    V[1, 20, :] = 0.0
    V[0, :, 5] += 4.0
    K = K.astype(np.float16).astype(np.float32)
    V = V.astype(np.float16).astype(np.float32)
    return K, V


# ----------------------------------------------------------------------------- transformers

GROUP_INDEX_RULES_TRANSFORMERS = {
    "flat_div_g": "param index = f // g: groups are g consecutive elements in flat order "
                  "(quanto axis 0, HQQ axis 1); with head_dim == g one group is one (head, token)",
    "quanto_axis_last": "rows r = f // D (r = head*n + token), channel d = f % D, A = rows // g; "
                        "param index = d*A + r // g: per channel, groups of g consecutive rows of "
                        "the flattened [heads*tokens, D] matrix (a group can straddle two heads "
                        "when n % g != 0)",
    "flat_mod_ngroups": "param index = f % (numel // g): the tensor reshaped to [g, numel//g], one "
                        "group per column (HQQ axis 0)",
}


def _quanto_state(qt, shape, bits):
    """codes in element order, scale, shift (native order), dequantized tensor; formula check."""
    from optimum.quanto.tensor.grouped import ungroup

    axis, g = qt.axis, qt._group_size
    data = qt._data.unpack() if hasattr(qt._data, "unpack") else qt._data
    codes = ungroup(data, axis=axis, orig_shape=torch.Size(shape)).numpy().astype(np.uint8)
    scale = qt._scale.reshape(-1).numpy().astype(np.float32)
    shift = qt._shift.reshape(-1).numpy().astype(np.float32)
    deq_ref = qt.dequantize().numpy().astype(np.float32)
    f = np.arange(codes.size)
    if axis == 0:
        gi = f // g
        rule = "flat_div_g"
    else:
        rows = codes.size // shape[-1]
        A = rows // g
        gi = (f % shape[-1]) * A + (f // shape[-1]) // g
        rule = "quanto_axis_last"
    flat = codes.reshape(-1).astype(np.float32)
    mine = (scale[gi] * flat) - shift[gi]  # float32: (scale * code) - shift
    assert np.array_equal(mine.view(np.uint32), deq_ref.reshape(-1).view(np.uint32)), \
        "quanto dequant formula mismatch"
    return codes, scale, shift, deq_ref, rule


def _hqq_state(qw, meta, shape):
    from hqq.core.quantize import Quantizer

    unpacked = Quantizer.unpack[meta["packing"]](qw, dtype=torch.uint8)
    codes = unpacked.reshape(shape).numpy().astype(np.uint8)
    scale = meta["scale"].reshape(-1).numpy().astype(np.float32)
    zero = meta["zero"].reshape(-1).numpy().astype(np.float32)
    deq_ref = Quantizer.dequantize(qw, meta).numpy().astype(np.float32)
    g = meta["group_size"]
    f = np.arange(codes.size)
    if meta["axis"] == 1:
        gi = f // g
        rule = "flat_div_g"
    else:
        gi = f % (codes.size // g)
        rule = "flat_mod_ngroups"
    mine = (codes.reshape(-1).astype(np.float32) - zero[gi]) * scale[gi]
    assert np.array_equal(mine.view(np.uint32), deq_ref.reshape(-1).view(np.uint32)), \
        "hqq dequant formula mismatch"
    return codes, scale, zero, deq_ref, rule


def quanto_np(x, bits, axis, g):
    """Independent numpy transcription of quanto's MaxOptimizer + quantize_affine (docs)."""
    x = np.asarray(x, np.float32)
    n = x.size
    if axis == 0:
        G = x.reshape(-1, g)  # [groups, g]
        mn, mx = G.min(1, keepdims=True), G.max(1, keepdims=True)
    else:
        Dd = x.shape[-1]
        A = (n // Dd) // g
        G = x.reshape(A, g, Dd).transpose(1, 2, 0).reshape(g, Dd * A)  # [g, groups]
        mn, mx = G.min(0, keepdims=True), G.max(0, keepdims=True)
    scale = (mx - mn) / np.float32(2 ** bits - 1)
    shift = -mn
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.rint((G + shift) / scale)
    q = np.nan_to_num(np.clip(q, 0, 2 ** bits - 1), nan=0.0)
    deq = scale * q - shift
    if axis == 0:
        deq = deq.reshape(x.shape)
        qe = q.reshape(x.shape)
    else:
        Dd = x.shape[-1]
        A = (n // Dd) // g
        deq = deq.reshape(g, Dd, A).transpose(2, 0, 1).reshape(x.shape)
        qe = q.reshape(g, Dd, A).transpose(2, 0, 1).reshape(x.shape)
    return qe.astype(np.uint8), scale.reshape(-1), shift.reshape(-1), deq.astype(np.float32)


def hqq_np(x, bits, axis, g, iters=20, lp=0.7, beta=10.0):
    """Independent numpy transcription of HQQ Quantizer.quantize(optimize=True) (docs)."""
    W = np.asarray(x, np.float32)
    Wg = W.reshape(-1, g) if axis == 1 else W.reshape(g, -1)
    mn = Wg.min(axis=axis, keepdims=True)
    mx = Wg.max(axis=axis, keepdims=True)
    maxv = np.float32(2 ** bits - 1)
    denom = mx - mn
    with np.errstate(divide="ignore"):
        s = maxv / denom
    s = np.where(np.abs(denom) <= 1e-4, np.float32(1.0), s).astype(np.float32)
    s = np.minimum(s, np.float32(2e4))
    z = (-mn * s).astype(np.float32)
    best = np.float32(np.inf)
    n_steps = 0
    for _ in range(iters):
        Wq = np.clip(np.rint(Wg * s + z), 0, maxv)
        Wr = (Wq - z) / s
        e = Wg - Wr
        ae = np.abs(e)
        with np.errstate(divide="ignore", invalid="ignore"):
            shr = np.maximum(ae - np.float32(1.0 / beta) * np.power(ae, np.float32(lp - 1)), 0)
        We = (shr * np.sign(e)).astype(np.float32)
        z = np.mean(Wq - (Wg - We) * s, axis=axis, keepdims=True, dtype=np.float32)
        cur = np.mean(np.abs(Wg - Wr), dtype=np.float32)
        n_steps += 1
        if cur < best:
            best = cur
        else:
            break
    Wq = np.clip(np.rint(Wg * s + z), 0, maxv)
    scale = (np.float32(1.0) / s).astype(np.float32)
    deq = ((Wq - z) * scale).reshape(W.shape)
    return Wq.reshape(W.shape).astype(np.uint8), scale.reshape(-1), z.reshape(-1), deq, n_steps


def run_transformers(backend, nbits, axis_key, axis_value, q_group_size, K, V):
    from transformers import LlamaConfig
    from transformers.cache_utils import QuantizedCache

    cfg = LlamaConfig(num_hidden_layers=1, num_attention_heads=H, num_key_value_heads=H,
                      hidden_size=H * D, vocab_size=16)
    cache = QuantizedCache(backend, cfg, nbits=nbits, axis_key=axis_key, axis_value=axis_value,
                           q_group_size=q_group_size, residual_length=RESIDUAL)
    layer = cache.layers[0]
    k = torch.from_numpy(K)[None]
    v = torch.from_numpy(V)[None]

    def snapshot(n_quant):
        out = {}
        for name, q, x in (("keys", layer._quantized_keys, K), ("values", layer._quantized_values, V)):
            shape = (1, H, n_quant, D)
            if backend == "quanto":
                codes, scale, par, deq, rule = _quanto_state(q, shape, nbits)
                par_name = "shift"
            else:
                codes, scale, par, deq, rule = _hqq_state(q[0], q[1], shape)
                par_name = "zero"
            out[name] = {"codes": codes, "scale": scale, par_name: par, "deq": deq, "rule": rule}
        return out

    def deq_now():
        return (layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values))

    rk, rv = cache.update(k[:, :, :N_PREFILL], v[:, :, :N_PREFILL], 0)
    assert torch.equal(rk, k[:, :, :N_PREFILL]) and torch.equal(rv, v[:, :, :N_PREFILL]), \
        "prefill must return its input unchanged"
    states = [{"after_token": N_PREFILL, "n_quantized": N_PREFILL, **snapshot(N_PREFILL)}]
    events = [{"T": N_PREFILL, "n_quantized": N_PREFILL, "n_residual": 0, "event": "prefill"}]
    n_quant, n_res = N_PREFILL, 0
    for t in range(N_PREFILL, T):
        dk, dv = deq_now()
        rk, rv = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1], 0)
        exp_k = torch.cat([dk, k[:, :, n_quant:t + 1]], dim=-2)
        exp_v = torch.cat([dv, v[:, :, n_quant:t + 1]], dim=-2)
        assert torch.equal(rk, exp_k) and torch.equal(rv, exp_v), f"returned tensors differ at t={t}"
        if layer.keys.numel() == 0:  # flushed: everything returned was re-quantized
            n_quant, n_res = t + 1, 0
            states.append({"after_token": t + 1, "n_quantized": n_quant, **snapshot(n_quant)})
            events.append({"T": t + 1, "n_quantized": n_quant, "n_residual": 0, "event": "flush"})
        else:
            n_res += 1
            assert layer.keys.shape[-2] == n_res
            if n_res == RESIDUAL - 1 or t == T - 1:
                events.append({"T": t + 1, "n_quantized": n_quant, "n_residual": n_res,
                               "event": "decode"})
    assert cache.get_seq_length(0) == T
    return states, events


def check_against_numpy(backend, nbits, axis, g, x_in, st, notes):
    """Compare one quantization (the prefill state: input = the original tokens) with numpy."""
    x = x_in.reshape(-1)
    if backend == "quanto":
        codes, scale, shift, deq = quanto_np(x_in[None], nbits, 0 if axis == 0 else -1, g)
        ok = (np.array_equal(codes.reshape(-1), st["codes"].reshape(-1))
              and np.array_equal(scale.view(np.uint32), st["scale"].view(np.uint32))
              and np.array_equal(shift.view(np.uint32), st["shift"].view(np.uint32))
              and np.array_equal(deq.reshape(-1).view(np.uint32), st["deq"].reshape(-1).view(np.uint32)))
        assert ok, "numpy transcription of quanto differs from quanto"
        return {"numpy_transcription_bitwise_equal": True}
    codes, scale, zero, deq, steps = hqq_np(x_in[None], nbits, axis, g)
    mism = int(np.sum(codes.reshape(-1) != st["codes"].reshape(-1)))
    res = {"numpy_transcription_code_mismatches": mism,
           "numpy_transcription_max_abs_zero_diff": float(np.max(np.abs(zero - st["zero"]))),
           "numpy_transcription_max_abs_dequant_diff": float(np.max(np.abs(deq.reshape(-1) - st["deq"].reshape(-1)))),
           "numpy_transcription_optimizer_steps": steps}
    notes.append(f"hqq {nbits}b axis {axis}: numpy transcription: {res}")
    return res


def transformers_configs(backend):
    if backend == "quanto":
        return [("quanto_default", 2, 0, 0, 64), ("quanto_default", 4, 0, 0, 64),
                ("quanto_kivi_axes", 2, -1, 0, 32), ("quanto_kivi_axes", 4, -1, 0, 32)]
    return [("hqq_default", 2, 0, 0, 64), ("hqq_default", 4, 0, 0, 64),
            ("hqq_axis1", 2, 1, 1, 64), ("hqq_axis1", 4, 1, 1, 64), ("hqq_axis1", 8, 1, 1, 64)]


def transformers_golden(backend, K, V, notes):
    cases = []
    for name, nbits, ak, av, g in transformers_configs(backend):
        states, events = run_transformers(backend, nbits, ak, av, g, K, V)
        out_states = []
        for st in states:
            n = st["n_quantized"]
            s_out = {"after_token": st["after_token"], "n_quantized": n}
            for which, X, ax in (("keys", K, ak), ("values", V, av)):
                e = st[which]
                par_name = "shift" if backend == "quanto" else "zero"
                entry = {"shape": [H, n, D], "bits": nbits, "group_index": e["rule"],
                         "codes": pack_codes(e["codes"], nbits), "scale_f32": f32(e["scale"]),
                         f"{par_name}_f32": f32(e[par_name]), "n_groups": int(e["scale"].size),
                         "rel_err_vs_input": rel_err(e["deq"].reshape(H, n, D), X[:, :n]),
                         **deq_stats(e["deq"])}
                if st["after_token"] == N_PREFILL:
                    entry.update(check_against_numpy(backend, nbits, ax, g, X[:, :n], e, notes))
                s_out[which] = entry
            out_states.append(s_out)
        cases.append({"name": f"{name}_{nbits}bit", "backend": backend, "nbits": nbits,
                      "axis_key": ak, "axis_value": av, "q_group_size": g,
                      "residual_length": RESIDUAL, "n_prefill": N_PREFILL, "n_total": T,
                      "events": events, "states": out_states})
    return cases


# ----------------------------------------------------------------------------- FP8

def fp8_encode_py(x):
    """float32 -> float8_e4m3fn bits, written from docs/quantization.md (RNE, saturating)."""
    x = float(np.float32(x))
    if math.isnan(x):
        return 0xFF if math.copysign(1.0, x) < 0 else 0x7F
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= 448.0:  # finite overflow and inf saturate (torch >= the saturating change; vLLM SATFINITE)
        return sign | 0x7E
    if a < 2.0 ** -6:  # subnormal range: multiples of 2^-9
        q = round(a / 2.0 ** -9)  # Python round(): half to even
        return sign | q  # q == 8 is the smallest normal, 0x08
    m, e = math.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    e -= 1  # a = (2m) * 2^e, 2m in [1, 2)
    q = round(a / 2.0 ** (e - 3))  # in [8, 16]
    if q == 16:
        q, e = 8, e + 1
    code = ((e + 7) << 3) | (q - 8)
    return sign | min(code, 0x7E)


def fp8_decode_py(c):
    s = -1.0 if c & 0x80 else 1.0
    E, M = (c >> 3) & 0xF, c & 7
    if E == 15 and M == 7:
        return float("nan")
    if E == 0:
        return s * M * 2.0 ** -9
    return s * (1 + M / 8) * 2.0 ** (E - 7)


def fp8_edge_values():
    vals = set()
    pos = [fp8_decode_py(c) for c in range(0x7F)]  # all finite non-negative fp8 values
    for a, b in zip(pos[:-1], pos[1:]):
        mid = np.float32((a + b) / 2)
        vals.update([mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))])
    vals.update(np.float32(p) for p in pos)
    for v in (447.0, 448.0, 449.0, 463.99997, 464.0, 464.00003, 479.0, 480.0, 500.0, 1e4, 3.0e38,
              np.inf, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 1e-30, 0.0):
        vals.add(np.float32(v))
    vals = sorted(float(v) for v in vals)
    arr = np.array(vals + [-v for v in vals], dtype=np.float32)
    arr = np.concatenate([arr, np.array([np.nan, -np.nan], np.float32)])
    return arr


def fp8_quant_torch(x, scale):
    """(x / scale) -> float8_e4m3fn (torch cast), dequant float(code) * scale, all float32."""
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    st = torch.from_numpy(np.ascontiguousarray(scale, np.float32))
    q = (xt / st).to(torch.float8_e4m3fn)
    codes = q.view(torch.uint8).numpy().copy()
    deq = (q.to(torch.float32) * st).numpy()
    return codes, deq


def fp8_golden(K, V, notes):
    n_tok = 64
    cases = []
    lut = np.array([fp8_decode_py(c) for c in range(256)], dtype=np.float32)
    tl = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    assert np.array_equal(np.isnan(lut), np.isnan(tl)) and np.array_equal(
        np.nan_to_num(lut).view(np.uint32), np.nan_to_num(tl).view(np.uint32)), "fp8 decode table"
    for which, X in (("keys", K), ("values", V)):
        x = X[:, :n_tok]
        amax = np.float32(np.max(np.abs(x)))
        # vLLM calc_kv_scales: computed once, on the first forward (here the first 32 tokens)
        amax_first = np.float32(np.max(np.abs(X[:, :32])))
        const = np.float32(200.0 if which == "keys" else 100.0)
        per_tok = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True) / np.float32(448.0),
                             np.float32(1.0) / (np.float32(448.0) * np.float32(512.0))).astype(np.float32)
        for cname, scale, sdesc in (
                ("per_tensor_amax_over_448", np.float32(amax / np.float32(448.0)).reshape(1, 1, 1),
                 "scale = amax(|x|) / 448 over the whole [H, 64, D] tensor (float32)"),
                ("per_head_token_amax_over_448", per_tok,
                 "scale[h, t] = max(amax_d(|x[h,t,:]|) / 448, 1/(448*512)) (float32), shape [H, 64]"),
                ("vllm_calc_kv_scales", np.float32(amax_first / const).reshape(1, 1, 1),
                 f"scale = amax(|x[:, :32]|) / {int(const)} (vLLM Attention.calc_kv_scales, once, on "
                 "the first forward; K_SCALE_CONSTANT=200, V_SCALE_CONSTANT=100), applied to all 64 tokens")):
            codes, deq = fp8_quant_torch(x, scale)
            mine = np.array([fp8_encode_py(v) for v in (x / scale).reshape(-1)], np.uint8)
            assert np.array_equal(mine, codes.reshape(-1)), f"fp8 python encoder differs ({cname})"
            mine_deq = (lut[codes.reshape(-1)].reshape(codes.shape) * scale).astype(np.float32)
            assert np.array_equal(mine_deq.view(np.uint32), deq.view(np.uint32))
            cases.append({"name": f"{which}_{cname}", "tensor": which, "shape": [H, n_tok, D],
                          "input": f"inputs.json {which}[:, :{n_tok}, :]", "scale_rule": sdesc,
                          "scale_f32": f32(scale.reshape(-1)), "scale_shape": list(scale.shape[:2]) if scale.size > 1 else [],
                          "codes": pack_codes(codes, 8),
                          "n_at_448": int(np.sum((codes & 0x7F) == 0x7E)),
                          "n_overflow": int(np.sum(np.abs(x / scale) > np.float32(448.0))),
                          "rel_err_vs_input": rel_err(deq, x), **deq_stats(deq)})
    edge = fp8_edge_values()
    codes, _ = fp8_quant_torch(edge, np.float32(1.0).reshape(1))
    mine = np.array([fp8_encode_py(v) for v in edge], np.uint8)
    assert np.array_equal(mine, codes), "fp8 python encoder differs on the edge values"
    notes.append(f"fp8: python bit-level encoder == torch {torch.__version__} on all cases")
    return {"cases": cases,
            "edge_values": {"n": int(edge.size), "x_f32": f32(edge), "codes": pack_codes(codes, 8),
                            "about": "torch float32 -> float8_e4m3fn casts at scale 1: every finite "
                                     "fp8 value, the midpoints between neighbours and one float32 ulp "
                                     "either side of each, overflow (>= 448, inf), tiny values, "
                                     "+-0, +-NaN"},
            "decode_table_f32": f32(np.nan_to_num(lut, nan=0.0)),
            "decode_table_about": "float value of each fp8 byte 0..255 (0x7F and 0xFF are NaN, "
                                  "written here as 0)"}


# ----------------------------------------------------------------------------- KIVI

def kivi_quant_lastdim(x, G, bits):
    """KIVI's triton_quantize_and_pack_along_last_dim, unpacked: groups of G along the last dim.

    mn, mx per group; scale = (mx - mn) / (2^bits - 1); q = round(clamp((x - mn) / scale, 0, max));
    dequant = q * scale + mn. Computed in x's dtype. A group with mx == mn divides 0 by 0; the
    official code then casts NaN to int32 (platform-defined); here the code is 0, and the
    dequantized value is mn either way (scale is 0).
    """
    shp = x.shape
    xg = x.reshape(*shp[:-1], shp[-1] // G, G)
    mn = xg.amin(-1, keepdim=True)
    mx = xg.amax(-1, keepdim=True)
    scale = (mx - mn) / (2 ** bits - 1)
    q = ((xg - mn) / scale).clamp(0, 2 ** bits - 1).round()
    q = torch.nan_to_num(q, nan=0.0)
    deq = q * scale + mn
    return q.to(torch.uint8).reshape(shp), scale.squeeze(-1), mn.squeeze(-1), deq.reshape(shp)


class KiviLayer:
    """KIVI's cache state machine (models/llama_kivi.py, LlamaAttention_KIVI.forward), one layer.

    keys: per channel, groups of G consecutive tokens; values: per token, groups of G channels.
    Prefill of T tokens: keys: T % R == 0 -> all quantized; T < R -> none; else the first
    T - T % R quantized, the last T % R kept. Values: T <= R -> none; else the first T - R
    quantized, the last R kept. Decode: the new key joins the full-precision keys and when they
    number R, all R are quantized (one block of R/G groups per channel); the new value joins the
    full-precision values and when they number R + 1 the oldest one is quantized alone.
    """

    def __init__(self, bits_k, bits_v, G, R):
        self.bk, self.bv, self.G, self.R = bits_k, bits_v, G, R
        self.kq, self.vq = [], []  # lists of (codes, scale, mn, deq) blocks, in token order
        self.kf = self.vf = None

    def _qk(self, k):  # k [H, n, D] -> quantize along tokens per channel
        c, s, m, d = kivi_quant_lastdim(k.transpose(-1, -2).contiguous(), self.G, self.bk)
        self.kq.append((c.transpose(-1, -2), s, m, d.transpose(-1, -2)))  # s, m: [H, D, n/G]

    def _qv(self, v):
        self.vq.append(kivi_quant_lastdim(v.contiguous(), self.G, self.bv))  # s, m: [H, n, D/G]

    def prefill(self, k, v):
        n = k.shape[-2]
        if n % self.R != 0:
            if n < self.R:
                self.kf = k
            else:
                self._qk(k[:, : n - n % self.R])
                self.kf = k[:, n - n % self.R:]
        else:
            self._qk(k)
            self.kf = None
        if n <= self.R:
            self.vf = v
        else:
            self._qv(v[:, : n - self.R])
            self.vf = v[:, n - self.R:]

    def decode(self, k1, v1):
        self.kf = k1 if self.kf is None else torch.cat([self.kf, k1], dim=-2)
        if self.kf.shape[-2] == self.R:
            self._qk(self.kf)
            self.kf = None
        self.vf = torch.cat([self.vf, v1], dim=-2)
        if self.vf.shape[-2] > self.R:
            self._qv(self.vf[:, :1])
            self.vf = self.vf[:, 1:]

    def state(self):
        def cat(blocks, i, dim):
            return torch.cat([b[i] for b in blocks], dim=dim) if blocks else None
        return {"k_codes": cat(self.kq, 0, -2), "k_scale": cat(self.kq, 1, -1), "k_mn": cat(self.kq, 2, -1),
                "k_deq": cat(self.kq, 3, -2), "v_codes": cat(self.vq, 0, -2), "v_scale": cat(self.vq, 1, -2),
                "v_mn": cat(self.vq, 2, -2), "v_deq": cat(self.vq, 3, -2),
                "n_kq": 0 if not self.kq else sum(b[0].shape[-2] for b in self.kq),
                "n_vq": 0 if not self.vq else sum(b[0].shape[-2] for b in self.vq),
                "kf": self.kf, "vf": self.vf}


def kivi_golden(K, V, notes):
    G, R = 32, RESIDUAL
    out = []
    for dtype, dname in ((torch.float32, "float32"), (torch.float16, "float16")):
        k_all = torch.from_numpy(K).to(dtype)
        v_all = torch.from_numpy(V).to(dtype)
        for bits in (2, 4):
            finals = []
            checkpoints = []
            for n_pre in (100, 150, 200):
                L = KiviLayer(bits, bits, G, R)
                L.prefill(k_all[:, :n_pre], v_all[:, :n_pre])
                for t in range(n_pre, T):
                    L.decode(k_all[:, t:t + 1], v_all[:, t:t + 1])
                    s = L.state()
                    if n_pre == 100 and t + 1 in (127, 128, 129, 200):
                        checkpoints.append({"T": t + 1, "keys_quantized": s["n_kq"],
                                            "keys_full_precision": 0 if s["kf"] is None else s["kf"].shape[-2],
                                            "values_quantized": s["n_vq"],
                                            "values_full_precision": s["vf"].shape[-2]})
                finals.append(L.state())
            # the state depends on the token count only, not on the prefill/decode split
            for s in finals[1:]:
                for key in ("k_codes", "k_scale", "k_mn", "v_codes", "v_scale", "v_mn"):
                    assert torch.equal(s[key], finals[0][key]), f"KIVI state depends on the path ({key})"
            s = finals[0]
            nk, nv = s["n_kq"], s["n_vq"]
            assert nk == (T // R) * R and nv == T - R
            assert torch.equal(s["kf"], k_all[:, nk:]) and torch.equal(s["vf"], v_all[:, nv:]), \
                "full-precision tokens must be exact"
            np_dt = np.float32 if dtype == torch.float32 else np.float16
            tag = "f32" if dtype == torch.float32 else "f16"
            kdeq = s["k_deq"].float().numpy()
            vdeq = s["v_deq"].float().numpy()
            # cross-check with optimum-quanto's affine quantizer at KIVI's axes (float32 only)
            if dtype == torch.float32:
                qc, qs, qsh, qd = quanto_np(K[:, :nk], bits, -1, G)  # per channel, groups of G tokens
                assert np.array_equal(qd.view(np.uint32), kdeq.view(np.uint32)), "KIVI keys != quanto axis -1"
                qc, qs, qsh, qd = quanto_np(V[:, :nv], bits, 0, G)
                assert np.array_equal(qd.view(np.uint32), vdeq.view(np.uint32)), "KIVI values != quanto axis 0"
                from optimum.quanto import MaxOptimizer, qint2, qint4, quantize_weight
                qt = qint2 if bits == 2 else qint4
                for X, n, ax, mine in ((K, nk, -1, kdeq), (V, nv, 0, vdeq)):
                    xt = torch.from_numpy(np.ascontiguousarray(X[:, :n]))[None]
                    sc, sh = MaxOptimizer()(xt, qt, ax, G)
                    ref = quantize_weight(xt, qt, ax, sc, sh, G).dequantize()[0].numpy()
                    assert np.array_equal(ref.view(np.uint32), mine.view(np.uint32)), "KIVI != optimum-quanto"
                notes.append(f"kivi {bits}b float32: keys == optimum-quanto axis -1 group 32, values == "
                             "axis 0 group 32, bit for bit")
            out.append({
                "name": f"kivi_{bits}bit_{dname}", "dtype": dname, "k_bits": bits, "v_bits": bits,
                "group_size": G, "residual_length": R, "n_total": T,
                "paths_checked": "prefill 100 + 100 decodes, prefill 150 + 50, prefill 200: identical state",
                "checkpoints_prefill_100": checkpoints,
                "keys": {"shape": [H, nk, D], "bits": bits, "codes": pack_codes(s["k_codes"].numpy(), bits),
                         "group_index": "kivi_key", "params_shape": [H, D, nk // G],
                         f"scale_{tag}": b64(s["k_scale"].numpy().astype(np_dt), "<" + np.dtype(np_dt).str[1:]),
                         f"mn_{tag}": b64(s["k_mn"].numpy().astype(np_dt), "<" + np.dtype(np_dt).str[1:]),
                         "rel_err_vs_input": rel_err(kdeq, K[:, :nk]), **deq_stats(kdeq)},
                "values": {"shape": [H, nv, D], "bits": bits, "codes": pack_codes(s["v_codes"].numpy(), bits),
                           "group_index": "kivi_value", "params_shape": [H, nv, D // G],
                           f"scale_{tag}": b64(s["v_scale"].numpy().astype(np_dt), "<" + np.dtype(np_dt).str[1:]),
                           f"mn_{tag}": b64(s["v_mn"].numpy().astype(np_dt), "<" + np.dtype(np_dt).str[1:]),
                           "rel_err_vs_input": rel_err(vdeq, V[:, :nv]), **deq_stats(vdeq)},
            })
    return out



# ----------------------------------------------------------------------------- format self-check

def _arr(s, dt):
    return np.frombuffer(base64.b64decode(s), dtype=dt)


def _group_index(rule, shape, n_params):
    h, n, d = shape
    f = np.arange(h * n * d)
    if rule == "flat_div_g":
        return f // (f.size // n_params)
    if rule == "flat_mod_ngroups":
        return f % n_params
    if rule == "quanto_axis_last":
        rows = f.size // d
        a_groups = n_params // d
        return (f % d) * a_groups + (f // d) // (rows // a_groups)
    t, dd, hh = (f // d) % n, f % d, f // (n * d)
    if rule == "kivi_key":
        return (hh * d + dd) * (n // 32) + t // 32
    if rule == "kivi_value":
        return (hh * n + t) * (d // 32) + dd // 32
    raise ValueError(rule)


def verify_dir(out_dir):
    """Decode every file with numpy alone, as a C++ test would, and recheck the stored sums."""
    def load(name):
        with open(os.path.join(out_dir, name)) as fh:
            return json.load(fh)

    inp = load("inputs.json")
    shp = inp["shape"]
    X = {"keys": _arr(inp["keys_f16"], "<f2").astype(np.float32).reshape(shp),
         "values": _arr(inp["values_f16"], "<f2").astype(np.float32).reshape(shp)}
    checked = 0

    def check(e, xhat):
        nonlocal checked
        x64 = xhat.reshape(-1).astype(np.float64)
        assert np.array_equal(xhat.reshape(-1)[:64].view(np.uint32), _arr(e["dequant_head_f32"], "<f4").view(np.uint32))
        assert abs(np.sum(x64) - e["dequant_sum"]) <= 1e-9 * max(1.0, abs(e["dequant_sum"]))
        assert abs(np.sum(x64 * x64) - e["dequant_sumsq"]) <= 1e-9 * e["dequant_sumsq"]
        checked += 1

    for name in ("transformers_quanto.json", "transformers_hqq.json"):
        for c in load(name)["cases"]:
            for st in c["states"]:
                for which in ("keys", "values"):
                    e = st[which]
                    n = int(np.prod(e["shape"]))
                    q = unpack_codes(e["codes"], e["bits"], n).astype(np.float32)
                    sc = _arr(e["scale_f32"], "<f4")
                    gi = _group_index(e["group_index"], e["shape"], sc.size)
                    if "shift_f32" in e:
                        xhat = (sc[gi] * q) - _arr(e["shift_f32"], "<f4")[gi]
                    else:
                        xhat = (q - _arr(e["zero_f32"], "<f4")[gi]) * sc[gi]
                    check(e, xhat.astype(np.float32))
    fp8 = load("fp8_e4m3fn.json")
    lut = _arr(fp8["decode_table_f32"], "<f4")
    for c in fp8["cases"]:
        codes = _arr(c["codes"], "u1")
        sc = _arr(c["scale_f32"], "<f4")
        sc = sc.reshape(c["shape"][0], c["shape"][1], 1) if sc.size > 1 else sc.reshape(1, 1, 1)
        check(c, (lut[codes].reshape(c["shape"]) * sc).astype(np.float32))
    for c in load("kivi.json")["cases"]:
        dt = np.float32 if c["dtype"] == "float32" else np.float16
        tag = "f32" if dt == np.float32 else "f16"
        for which in ("keys", "values"):
            e = c[which]
            n = int(np.prod(e["shape"]))
            q = unpack_codes(e["codes"], e["bits"], n).astype(dt)
            sc = _arr(e[f"scale_{tag}"], "<" + np.dtype(dt).str[1:])
            mn = _arr(e[f"mn_{tag}"], "<" + np.dtype(dt).str[1:])
            gi = _group_index(e["group_index"], e["shape"], sc.size)
            check(e, ((q * sc[gi]).astype(dt) + mn[gi]).astype(dt).astype(np.float32))
    return checked

# ----------------------------------------------------------------------------- main

def dump(path, obj):
    with open(path, "w", encoding="ascii") as f:
        json.dump(obj, f, separators=(",", ":"), sort_keys=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "tests", "fixtures", "quant_golden"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    ver = versions()
    notes = []
    K, V = make_inputs()
    common = {"versions": ver, "generator": "data_scripts/make_quant_golden.py", "spec": "docs/quantization.md"}

    dump(os.path.join(args.out_dir, "inputs.json"), {
        "about": "Inputs of every quant_golden file: one KV-cache layer, [heads, tokens, head_dim]. "
                 "Float16-exact values (stored as float16 bits; use them as float32). numpy PCG64 "
                 f"seed {SEED}: standard normals, then head-1 key outlier channels 3, 17, 40 and "
                 "head-0 channel 61, a constant key channel (head 0, channel 7, tokens 0-31), a "
                 "constant key token (head 1, token 10), value outlier tokens (head 1: 0, 50, 150), "
                 "a zero value token (head 1, token 20) and a biased value channel (head 0, ch 5).",
        **common, "shape": [H, T, D], "keys_f16": b64(K.astype(np.float16), "<f2"),
        "values_f16": b64(V.astype(np.float16), "<f2")})

    fmt_common = ("Binary arrays: base64 of little-endian bytes (f32 float32, f16 float16 bits, u8 "
                  "bytes), row-major. codes: the tensor's element order, `bits` per code, LSB first "
                  "(code i in byte (i*bits)//8 at bit (i*bits)%8). dequant_sum/dequant_sumsq: "
                  "float64 sums over the reference's dequantized tensor; dequant_head_f32: its first "
                  "64 values.")
    for backend, fname in (("quanto", "transformers_quanto.json"), ("hqq", "transformers_hqq.json")):
        cases = transformers_golden(backend, K, V, notes)
        par = "shift" if backend == "quanto" else "zero"
        deq = ("x_hat = (scale[gi] * code) - shift[gi], float32, in that order (shift = -min of the "
               "group)" if backend == "quanto" else
               "x_hat = (code - zero[gi]) * scale[gi], float32, in that order (zero in code units; "
               "scale = 1 / (optimised inverse scale))")
        dump(os.path.join(args.out_dir, fname), {
            "about": f"transformers QuantizedCache(backend='{backend}') driven on inputs.json: prefill of "
                     f"{N_PREFILL} tokens, then single-token updates up to {T}. Each state is the "
                     "quantized part right after the prefill and right after the residual-window "
                     "flush (decode step 128); the residual tokens are the inputs, exactly (checked "
                     "at every step against the tensors update() returns).",
            **common, "format": fmt_common, "dequant": deq, "param_name": par,
            "group_index_rules": GROUP_INDEX_RULES_TRANSFORMERS, "cases": cases})

    fp8 = fp8_golden(K, V, notes)
    dump(os.path.join(args.out_dir, "fp8_e4m3fn.json"), {
        "about": "torch float8_e4m3fn round trips: code = cast_e4m3fn(x / scale) (float32 division; "
                 "round to nearest even; |x/scale| >= 448 and inf saturate to +-448 in this torch; "
                 "NaN stays NaN), x_hat = float(code) * scale (float32). Inputs: inputs.json, first "
                 "64 tokens.", **common, "format": fmt_common, **fp8})

    kivi = kivi_golden(K, V, notes)
    dump(os.path.join(args.out_dir, "kivi.json"), {
        "about": "Independent Python transcription of KIVI (arXiv 2402.02750; github.com/jy-yuan/KIVI "
                 "@ 876b4d2d08e3b1d5f70d0969c299d8c7c42ddfb6, models/llama_kivi.py "
                 "LlamaAttention_KIVI.forward and quant/new_pack.py "
                 "triton_quantize_and_pack_along_last_dim), state after 200 tokens of inputs.json. "
                 "The full-precision tokens are the inputs after the quantized ones: keys "
                 "[n_keys_quantized, 200), values [72, 200).", **common, "format": fmt_common,
        "dequant": "x_hat = (code * scale[gi]) + mn[gi], in the case's dtype (float16 rounding after "
                   "each operation for the float16 cases, as the official PyTorch reference "
                   "unpack_and_dequant_*; the official CUDA kernel computes float(scale)*code + "
                   "float(mn) in float32)",
        "group_index_rules": {
            "kivi_key": "element (h, t, d) -> params[h, d, t // 32] (per channel, groups of 32 tokens)",
            "kivi_value": "element (h, t, d) -> params[h, t, d // 32] (per token, groups of 32 channels)"},
        "cases": kivi})

    # sanity: error decreases with bits; print a summary
    summary = []
    for fname in ("transformers_quanto.json", "transformers_hqq.json", "kivi.json"):
        with open(os.path.join(args.out_dir, fname)) as f:
            data = json.load(f)
        for c in data["cases"]:
            st = c.get("states", [c])[-1]
            summary.append((fname, c["name"], st["keys"]["rel_err_vs_input"], st["values"]["rel_err_vs_input"]))
    by = {}
    for fname, name, ek, ev in summary:
        base = name.replace("_2bit", "").replace("_4bit", "").replace("_8bit", "")
        bits = 2 if "_2bit" in name else 4 if "_4bit" in name else 8
        by.setdefault((fname, base), []).append((bits, ek, ev))
    for key, lst in by.items():
        lst.sort()
        for (b1, k1, v1), (b2, k2, v2) in zip(lst, lst[1:]):
            assert k2 < k1 and v2 < v1, f"error does not decrease with bits: {key} {lst}"
    for fname, name, ek, ev in summary:
        print(f"{name:32s} rel_err keys {ek:.4f} values {ev:.4f}")
    for c in fp8["cases"]:
        print(f"fp8 {c['name']:40s} rel_err {c['rel_err_vs_input']:.5f} at 448: {c['n_at_448']} "
              f"overflowing (> 448 before the cast): {c['n_overflow']}")
    for n in notes:
        print(n)
    print(f"format self-check (numpy only): {verify_dir(args.out_dir)} tensors decoded and matched")
    total = 0
    for fn in sorted(os.listdir(args.out_dir)):
        sz = os.path.getsize(os.path.join(args.out_dir, fn))
        total += sz
        print(f"{fn:28s} {sz:8d} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
