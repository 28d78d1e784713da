#!/usr/bin/env python3
"""Independent float64 reference of BalanceKV's practical halving; writes the golden file.

Written from the paper (Han et al., "BalanceKV: KV Cache Compression through Discrepancy
Theory", arXiv:2502.07861, §4: blocks of b, zero padding, sign assignment per block in parallel,
strictly n/2 kept, T iterations), docs/methods.md §3 (balancekv) and the official release
(github.com/ksheth96/BalanceKV, src/balanced_walk.py `balanced_walk`), NOT from kvlab's C++.

One round, per KV head, over the m current survivors (in ascending original position):
  * re-block them in order into ceil(m/b) blocks of b; the last block is zero-padded (keys and
    values), as the release's `indexing` / F.pad does;
  * values are multiplied by the survivor's accumulated weight (padding weight 0), ṽ;
  * keys are centred by their block mean, the zero padding included in the mean (the release
    takes torch.mean over the padded block);
  * kernel K_ij = exp(temp·<k̄_i,k̄_j>/√d) · (<ṽ_i,ṽ_j> + 1e-8 + value_offset)
    (the release: exp(temp·.../√d − β) with β = 0 in every released run, times
    (1e-8 + ṽṽᵀ + const_denom), const_denom = 0.025);
  * the self-balancing walk per block: s_0 = +1; for i >= 1, p_i = 0.5 − γ·Σ_{j<i} K_ij s_j
    (unclamped), s_i = +1 iff u_i < p_i. The uniforms u are an INPUT: per round one array of
    shape [n_kv_heads·n_blocks, b], row h·n_blocks + blk, column = position in the block
    (the release draws torch.rand([batch, heads, blocks, b]); with batch 1 that is the same
    layout). u[:, 0] is drawn but unused, as in the release;
  * signs are reshaped to the padded length and cut to m (padding dropped);
  * the release's keep rule, written with the release's array operations (cumsum, argmax of
    an all-false mask = 0, masks, stable argsort of −weight): c± = first index where the count
    of ±1 reaches ⌊m/2⌋, c = max(c−, c+); weight = |s| = 1 after c; at or before c, 2·s, negated
    when s[c] = +1 (so the sign opposite to s[c] gets +2); keep the first ⌊m/2⌋ of the stable
    descending argsort of weight, with their weights;
  * accumulated weight ← accumulated weight of the kept × round weight (the release's
    weight_idx products).

Usage: python3 data_scripts/balancekv_reference.py [--out PATH] [--check-mutants]
Writes tests/fixtures/balancekv_golden/golden.json (inputs as small integers with power-of-two
scales so the C++ test reproduces the exact float64 inputs; see "format" in the file).
"""

import argparse
import json
import math
import os
import sys

import numpy as np

KEY_SCALE = 1.0 / 64.0        # key = key_int * KEY_SCALE (exact in float64)
VALUE_SCALE = 1.0 / 1024.0    # value = value_int * VALUE_SCALE
U_SCALE = 1.0 / float(1 << 24)  # u = u_int * U_SCALE, u_int in [0, 2^24)


def round_kernel(kb, vb, temp, value_offset, centre=True):
    """kb [b, d], vb [b, dv] (padded block, ṽ already weighted) -> K [b, b]."""
    d = kb.shape[-1]
    kc = kb - kb.mean(axis=0, keepdims=True) if centre else kb
    return np.exp(temp * (kc @ kc.T) / math.sqrt(d)) * (1e-8 + (vb @ vb.T) + value_offset)


def walk(K, u, gamma):
    """K [b, b], u [b] -> signs [b] of ±1 (int), and the per-position p_i (NaN at 0)."""
    b = K.shape[0]
    s = np.zeros(b, dtype=np.int64)
    p = np.full(b, np.nan)
    s[0] = 1
    for i in range(1, b):
        # The release sums kernel[i, :] * signs over the whole row, signs[j >= i] still 0.
        acc = float(np.dot(K[i, :i], s[:i].astype(np.float64)))
        p[i] = 0.5 - gamma * acc
        s[i] = 1 if u[i] < p[i] else -1
    return s, p


def release_keep(signs):
    """signs [m] of ±1 -> (keep positions [⌊m/2⌋], their round weights), the release's way."""
    m = signs.shape[0]
    half = m // 2
    s = signs.astype(np.int64)
    cneg = np.cumsum(s == -1)
    cpos = np.cumsum(s == 1)
    c_neg = int(np.argmax(cneg == half))  # 0 if never (torch.argmax of all-false)
    c_pos = int(np.argmax(cpos == half))
    c = max(c_neg, c_pos)
    weight = s.copy()
    idx = np.arange(m)
    after = idx > c
    weight[after] = np.abs(weight[after])
    flip_needed = s[c] == 1  # read before weight (an alias of signs in the release) is scaled
    before = idx <= c
    weight[before] *= 2
    if flip_needed:
        weight[before] *= -1
    order = np.argsort(-weight, kind="stable")
    keep = order[:half]
    return keep, weight[keep]


def halve_reference(keys, values, uniforms, T, block, temp, gamma, value_offset,
                    mutant=None):
    """keys [H, n, d], values [H, n, dv] float64; uniforms: list of T arrays [H·nb_t, b].

    Returns dict with per-round survivors (original positions), round weights, the walk's
    probabilities margin, and the final indices / accumulated weights.
    `mutant` (self-check only) switches on one deliberate error to show the golden detects it.
    """
    H, n, d = keys.shape
    dv = values.shape[2]
    b = block
    idx = np.tile(np.arange(n, dtype=np.int64), (H, 1))  # [H, m]
    acc_w = np.ones((H, n))                                # [H, m]
    round_idx, round_w = [], []
    min_margin = math.inf
    interior = 0
    total = 0
    for t in range(T):
        m = idx.shape[1]
        assert m >= 2, "cases must not reach m < 2 (the release would then keep 0 tokens)"
        nb = -(-m // b)
        padded = nb * b
        u = uniforms[t]
        assert u.shape == (H * nb, b), (u.shape, (H * nb, b))
        new_idx = np.zeros((H, m // 2), dtype=np.int64)
        new_rw = np.zeros((H, m // 2))
        new_acc = np.zeros((H, m // 2))
        for h in range(H):
            k = np.zeros((padded, d))
            v = np.zeros((padded, dv))
            k[:m] = keys[h, idx[h]]
            w = acc_w[h] if mutant != "unweighted_values" else np.ones(m)
            v[:m] = values[h, idx[h]] * w[:, None]
            signs = np.zeros(padded, dtype=np.int64)
            for blk in range(nb):
                sl = slice(blk * b, (blk + 1) * b)
                kb, vb = k[sl], v[sl]
                if mutant == "mean_without_padding":
                    real = min(b, m - blk * b)
                    kb = kb - kb[:real].mean(axis=0, keepdims=True)
                    K = round_kernel(kb, vb, temp, value_offset, centre=False)
                else:
                    K = round_kernel(kb, vb, temp,
                                     0.0 if mutant == "no_offset" else value_offset,
                                     centre=(mutant != "no_centring"))
                row = blk * H + h if mutant == "u_block_major" else h * nb + blk
                s, p = walk(K, u[row], gamma)
                signs[sl] = s
                live = min(b, m - blk * b)  # margins only where the sign is used
                pr = p[1:live]
                if pr.size:
                    min_margin = min(min_margin, float(np.min(np.abs(u[h * nb + blk, 1:live] - pr))))
                    interior += int(np.sum((pr > 0) & (pr < 1)))
                    total += pr.size
            keep, rw = release_keep(signs[:m])
            new_idx[h] = idx[h, keep]
            new_rw[h] = rw
            new_acc[h] = acc_w[h, keep] * rw
        # the kept positions are ascending (2s all at or before c, 1s after c)
        assert np.all(np.diff(new_idx, axis=1) > 0)
        idx, acc_w = new_idx, new_acc
        round_idx.append(idx.copy())
        round_w.append(new_rw.copy())
    return {
        "round_idx": round_idx,
        "round_weight": round_w,
        "idx": idx,
        "weight": acc_w,
        "min_margin": min_margin,
        "interior_fraction": interior / max(total, 1),
    }


def release_balanced_walk_np(key, gamma_, temp_, beta_, itrs, block_size, value, rand_tensors,
                             const_denom=0.025):
    """A line-by-line numpy transliteration of the release's `balanced_walk` (query=None,
    sort_idx=None), with torch.rand(signs.shape, generator=rng) replaced by rand_tensors[t] of
    shape [batch, heads, blocks, b], and the release's hard-coded const_denom = 0.025 made an
    argument. Used only as a cross-check of halve_reference above."""
    b, h, n, d = key.shape
    sort_idx = None
    weight_idx = None
    for t in range(itrs):
        if sort_idx is not None:
            new_n = math.ceil(sort_idx.shape[-1] / block_size) * block_size
            pad = new_n - sort_idx.shape[-1]
            ks = np.take_along_axis(key, sort_idx[..., None], axis=2)
            vs = np.take_along_axis(value, sort_idx[..., None], axis=2)
            key_sorted = np.pad(ks, ((0, 0), (0, 0), (0, pad), (0, 0)))
            value_sorted = np.pad(vs, ((0, 0), (0, 0), (0, pad), (0, 0)))
            key_sorted = key_sorted.reshape(b, h, -1, block_size, d)
            weight_idx_padded = np.pad(weight_idx, ((0, 0), (0, 0),
                                       (0, math.ceil(n / block_size) * block_size - weight_idx.shape[-1])))
            value_sorted = value_sorted * weight_idx_padded[..., None]
            value_sorted = value_sorted.reshape(b, h, -1, block_size, d)
        else:
            new_n = math.ceil(n / block_size) * block_size
            key_sorted = np.pad(key, ((0, 0), (0, 0), (0, new_n - n), (0, 0))).reshape(b, h, -1, block_size, d)
            value_sorted = np.pad(value, ((0, 0), (0, 0), (0, new_n - n), (0, 0))).reshape(b, h, -1, block_size, d)
        normal_keys = key_sorted - np.mean(key_sorted, axis=-2, keepdims=True)
        kernel_ = np.exp(temp_ * np.einsum('...nd,...sd->...ns', normal_keys, normal_keys) / math.sqrt(d) - beta_)
        kernel_ *= (1e-8 + np.einsum('...nd,...sd->...ns', value_sorted, value_sorted) + const_denom)
        signs = np.zeros(kernel_.shape[:4], dtype=np.int16)
        signs[:, :, :, 0] = 1
        rand_tensor = rand_tensors[t]
        assert rand_tensor.shape == signs.shape
        for i in range(1, kernel_.shape[3]):
            partial_inner_prod = (kernel_[:, :, :, i, :] * signs).sum(axis=-1)
            samp_prb = 0.5 - gamma_ * partial_inner_prod
            signs[:, :, :, i] = 2 * (rand_tensor[:, :, :, i] < samp_prb) - 1
        signs = signs.reshape(b, h, -1)[:, :, :n]
        cumsum_neg = np.cumsum(signs == -1, axis=-1)
        cumsum_pos = np.cumsum(signs == 1, axis=-1)
        c_neg = np.argmax((cumsum_neg == n // 2).astype(np.int64), axis=-1)
        c_pos = np.argmax((cumsum_pos == n // 2).astype(np.int64), axis=-1)
        c = np.maximum(c_neg, c_pos)
        weight = signs  # an alias, as in the release
        indices = np.arange(signs.shape[2]).reshape(1, 1, -1)
        mask_after_c = indices > c[..., None]
        weight[mask_after_c] = np.abs(weight[mask_after_c])
        mask_flip_needed = (np.take_along_axis(signs, c[..., None], axis=2) == 1)[..., 0]
        mask_before_c = indices <= c[..., None]
        weight[mask_before_c] *= 2
        flip_mask = mask_before_c & mask_flip_needed[..., None]
        weight[flip_mask] *= -1
        weight_argsort = np.argsort(-weight, axis=-1, kind="stable")
        n = n // 2
        if sort_idx is None:
            sort_idx = weight_argsort[:, :, :n]
            weight_idx = np.take_along_axis(weight, weight_argsort[:, :, :n], axis=-1)
        else:
            sort_idx = np.take_along_axis(sort_idx, weight_argsort[:, :, :n], axis=2)
            weigth_idx_1 = np.take_along_axis(weight, weight_argsort[:, :, :n], axis=-1)
            weight_idx = np.take_along_axis(weight_idx, weight_argsort[:, :, :n], axis=-1)
            weight_idx = weight_idx * weigth_idx_1
    return sort_idx, weight_idx


def n_blocks_per_round(n, b, T):
    out, m = [], n
    for _ in range(T):
        out.append(-(-m // b))
        m //= 2
    return out


CASES = [
    # name, n, b, T, H, d, temp, gamma, value_offset, key sd (ints), value sd (ints), seed
    dict(name="n300_b64_T3_defaults", n=300, b=64, T=3, H=2, d=8, temp=0.1, gamma=4.0,
         value_offset=0.025, key_sd=160, key_shift=200, value_sd=60, seed=1),
    dict(name="n97_b32_T2_longbench", n=97, b=32, T=2, H=2, d=16, temp=1.0, gamma=4.0,
         value_offset=0.025, key_sd=48, key_shift=64, value_sd=40, seed=2),
    dict(name="n513_b128_T4_offset0", n=513, b=128, T=4, H=2, d=8, temp=0.5, gamma=2.0,
         value_offset=0.0, key_sd=96, key_shift=128, value_sd=80, seed=3),
    dict(name="n45_b64_T2_single_padded_block", n=45, b=64, T=2, H=2, d=12, temp=1.0, gamma=1.0,
         value_offset=0.1, key_sd=64, key_shift=96, value_sd=20, seed=4),
]


def make_inputs(c):
    rng = np.random.default_rng(1000 + c["seed"])
    H, n, d = c["H"], c["n"], c["d"]
    # Keys with a per-head, per-dimension mean shift (so that centring matters) and per-token
    # noise; values small enough that many walk probabilities fall inside (0, 1).
    shift = rng.normal(0.0, c["key_shift"], size=(H, 1, d))
    key_int = np.rint(shift + rng.normal(0.0, c["key_sd"], size=(H, n, d))).astype(np.int64)
    value_int = np.rint(rng.normal(0.0, c["value_sd"], size=(H, n, d))).astype(np.int64)
    u_int = [rng.integers(0, 1 << 24, size=(H * nb, c["b"]), dtype=np.int64)
             for nb in n_blocks_per_round(n, c["b"], c["T"])]
    return key_int, value_int, u_int


def run_case(c, mutant=None):
    key_int, value_int, u_int = make_inputs(c)
    keys = key_int.astype(np.float64) * KEY_SCALE
    values = value_int.astype(np.float64) * VALUE_SCALE
    uniforms = [ui.astype(np.float64) * U_SCALE for ui in u_int]
    out = halve_reference(keys, values, uniforms, c["T"], c["b"], c["temp"], c["gamma"],
                          c["value_offset"], mutant=mutant)
    return key_int, value_int, u_int, out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(
        os.path.join(here, "..", "tests", "fixtures", "balancekv_golden", "golden.json"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--check-mutants", action="store_true",
                    help="also report which deliberate errors the golden would detect")
    args = ap.parse_args()

    cases = []
    for c in CASES:
        key_int, value_int, u_int, out = run_case(c)
        print(f"{c['name']}: rounds {c['T']}, kept {out['idx'].shape[1]} per head, "
              f"min |u-p| = {out['min_margin']:.3e}, p in (0,1): {out['interior_fraction']:.2f}, "
              f"weights {sorted(set(out['weight'].ravel().tolist()))}")
        assert out["min_margin"] > 1e-9, "a near tie: float rounding could flip a sign"
        cases.append({
            "name": c["name"],
            "n": c["n"], "block": c["b"], "halvings": c["T"], "n_kv_heads": c["H"],
            "head_dim": c["d"], "value_dim": c["d"],
            "temp": c["temp"], "gamma": c["gamma"], "value_offset": c["value_offset"],
            "key_int": key_int.tolist(),        # [H, n, d]
            "value_int": value_int.tolist(),    # [H, n, dv]
            "u_int": [ui.tolist() for ui in u_int],  # per round [H·nb, b]
            "round_idx": [r.tolist() for r in out["round_idx"]],        # per round [H, m_r]
            "round_weight": [r.astype(int).tolist() for r in out["round_weight"]],
            "idx": out["idx"].tolist(),                                  # [H, m_T]
            "weight": out["weight"].astype(int).tolist(),               # [H, m_T] (integers)
            "min_margin": out["min_margin"],
            "interior_fraction": out["interior_fraction"],
        })
        assert np.all(out["weight"] == np.rint(out["weight"]))
        # Cross-check against the line-by-line transliteration of the release.
        keys = key_int.astype(np.float64) * KEY_SCALE
        values = value_int.astype(np.float64) * VALUE_SCALE
        rts = [(ui.astype(np.float64) * U_SCALE).reshape(1, c["H"], -1, c["b"]) for ui in u_int]
        r_idx, r_w = release_balanced_walk_np(keys[None], c["gamma"], c["temp"], 0.0, c["T"],
                                              c["b"], values[None], rts, c["value_offset"])
        assert np.array_equal(r_idx[0], out["idx"]), c["name"]
        assert np.array_equal(r_w[0].astype(np.float64), out["weight"]), c["name"]
        print("  matches the transliteration of the release's balanced_walk")

    if args.check_mutants:
        for mutant in ["no_centring", "mean_without_padding", "unweighted_values", "no_offset",
                       "u_block_major"]:
            hits = []
            for c in CASES:
                ref = run_case(c)[3]
                mut = run_case(c, mutant=mutant)[3]
                differs = any(not np.array_equal(a, b_)
                              for a, b_ in zip(ref["round_idx"], mut["round_idx"]))
                hits.append(c["name"] if differs else None)
            print(f"mutant {mutant}: detected by {[h for h in hits if h]}")

    doc = {
        "about": "BalanceKV practical halving golden, from data_scripts/balancekv_reference.py "
                 "(numpy float64, written from the paper §4, docs/methods.md §3 and the release's "
                 "src/balanced_walk.py balanced_walk). Regenerate with that script.",
        "format": {
            "keys": "key_int * key_scale, [n_kv_heads, n, head_dim]",
            "values": "value_int * value_scale, [n_kv_heads, n, value_dim]",
            "u": "per round u_int * u_scale, [n_kv_heads * n_blocks_r, block]; row h*n_blocks_r+blk",
            "round_idx": "per round [n_kv_heads, m_r] survivors' original positions, ascending",
            "round_weight": "per round [n_kv_heads, m_r] that round's weight (2 or 1)",
            "idx": "[n_kv_heads, m_T] final kept positions",
            "weight": "[n_kv_heads, m_T] accumulated weight (product over rounds)",
            "min_margin": "smallest |u_i - p_i| over the used walk steps (robustness to rounding)",
        },
        "key_scale": KEY_SCALE,
        "value_scale": VALUE_SCALE,
        "u_scale": U_SCALE,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
