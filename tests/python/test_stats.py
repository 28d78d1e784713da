#!/usr/bin/env python3
"""python/kvlab/stats.py against the scipy/statsmodels goldens in tests/fixtures/stats_golden/
golden.json (written by data_scripts/make_stats_golden.py, which never imports stats.py), plus hand
cases (McNemar 4-0, Holm, the verdicts) and the percentile bootstrap's properties. System python3,
standard library only; the last line is "N passed, M failed", exit status 1 on any failure.

  python3 tests/python/test_stats.py [repo root]

Tolerances: 1e-9 relative for the closed forms and distributions (plus 1e-12 absolute on interval
endpoints and differences, which can sit at 0); 1e-12 absolute for the noncentral t cdf; the MDE
1e-9 relative to the tight root of statsmodels' power function, 5e-5 relative to what
TTestPower.solve_power itself returns (its solver stops up to 2.2e-5 short; cases where it did not
converge are left out by the golden script).
"""
import json
import math
import os
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvlab import stats as S  # noqa: E402

with open(os.path.join(ROOT, "tests", "fixtures", "stats_golden", "golden.json")) as f:
    G = json.load(f)
NAN = float("nan")
counts = {"passed": 0, "failed": 0}


def check(ok, what):
    counts["passed" if ok else "failed"] += 1
    if not ok:
        print(f"FAIL: {what}")


def close(got, want, rel=1e-9, abs_=0.0):
    """want None is nan in the golden: got must be nan too."""
    if want is None or (isinstance(want, float) and math.isnan(want)):
        return isinstance(got, float) and math.isnan(got)
    return got == want or math.isclose(got, want, rel_tol=rel, abs_tol=abs_)


def same(x, y):
    """Two Intervals equal field by field, nan equal to nan."""
    return all(u == v or (math.isnan(u) and math.isnan(v)) for u, v in zip(x, y))


def fields(got, want, names, rel=1e-9, abs_=0.0):
    """The names whose values differ, each as 'name got/want'."""
    return [f"{k} {got[k]!r}/{want[k]!r}" for k in names if not close(got[k], want[k], rel, abs_)]


# ---- paired t = scipy.stats.ttest_rel ----------------------------------------------------------
for c in G["paired"]:
    r = S.paired_interval(c["a"], c["b"], c["level"])._asdict()
    bad = fields(r, c, ["mean", "lo", "hi", "df", "p"], abs_=1e-12) + fields(r, c, ["se"]) + \
        ([] if r["n"] == c["n"] else ["n"])
    check(not bad, f"paired_interval {c['name']}: {bad}")
    d = S.diff_interval([x - y for x, y in zip(c["a"], c["b"])], c["level"])
    check(same(d, S.paired_interval(c["a"], c["b"], c["level"])), f"diff_interval {c['name']}")
    m, se = S.mean_se([x - y for x, y in zip(c["a"], c["b"])])
    check(close(m, c["mean"], abs_=1e-12) and close(se, c["se"]), f"mean_se {c['name']}: {m}, {se}")
check(all(math.isnan(v) for v in S.mean_se([])) and S.mean_se([3])[0] == 3 and math.isnan(S.mean_se([3])[1]),
      "mean_se: n = 0 -> (nan, nan); n = 1 -> (x, nan)")

# ---- distributions -----------------------------------------------------------------------------
D = G["dist"]
for name, fn, rows in (("t_cdf", S.t_cdf, D["t_cdf"]), ("t_ppf", S.t_ppf, D["t_ppf"])):
    bad = [(x, df, fn(x, df), want) for x, df, want in rows if not close(fn(x, df), want)]
    check(not bad, f"{name}: {len(bad)} of {len(rows)} off, e.g. {bad[:3]}")
for name, fn in (("norm_cdf", S.norm_cdf), ("norm_ppf", S.norm_ppf)):
    bad = [(x, fn(x), want) for x, want in D[name] if not close(fn(x), want)]
    check(not bad, f"{name}: {bad}")
bad = [(x, df, nc, S.nct_cdf(x, df, nc), want) for x, df, nc, want in D["nct_cdf"]
       if not close(S.nct_cdf(x, df, nc), want, 0.0, 1e-12)]
check(not bad, f"nct_cdf: {len(bad)} of {len(D['nct_cdf'])} off, e.g. {bad[:3]}")

# ---- stratified (equal-weight strata, Welch-Satterthwaite df) -----------------------------------
for c in G["stratified"]:
    r = S.stratified_interval(c["groups"], c["level"])._asdict()
    bad = fields(r, c, ["mean", "se", "df", "lo", "hi", "p"], abs_=1e-12)
    check(not bad and r["n"] == c["n"], f"stratified_interval {c['name']}: {bad}")
    if "ttest_rel_lo" in c:
        check(close(r["lo"], c["ttest_rel_lo"]) and close(r["hi"], c["ttest_rel_hi"]) and close(r["p"], c["ttest_rel_p"])
              and close(r["df"], len(c["groups"][0]) - 1.0), "stratified_interval: one stratum = ttest_rel")
flat = S.stratified_interval({"t1": [0.5, 0.5, 0.5], "t2": [0.25, 0.25]})
check(flat.lo == flat.hi == flat.mean == 0.375 and flat.p == 0.0, f"stratified_interval, no variance: {flat}")

# ---- McNemar and Newcombe's paired interval ----------------------------------------------------
check(S.mcnemar_exact(4, 0) == 0.125 and S.mcnemar_exact(0, 4) == 0.125, "mcnemar_exact 4-0 = 0.125")
check(S.mcnemar_exact(0, 0) == 1.0, "mcnemar_exact 0-0 = 1")
bad = [(b, c, S.mcnemar_exact(b, c), want) for b, c, want in G["mcnemar"] if not close(S.mcnemar_exact(b, c), want)]
check(not bad, f"mcnemar_exact vs statsmodels: {bad}")
for c in G["pairs"]:
    r = S.mcnemar_from_pairs(c["x"], c["y"], c["level"])
    bad = [k for k in "abcdn" if r[k] != c[k]] + fields(r, c, ["diff", "lo", "hi", "p"], abs_=1e-12)
    check(not bad, f"mcnemar_from_pairs {c['a'], c['b'], c['c'], c['d']}: {bad}")
    check(r["lo"] <= r["diff"] <= r["hi"], f"mcnemar_from_pairs: diff inside [lo, hi] {r}")

# ---- Holm = statsmodels multipletests(method='holm') --------------------------------------------
for c in G["holm"]:
    adj = S.holm(c["p"])
    check(all(close(g, w) for g, w in zip(adj, c["adjusted"])), f"holm {c['p']}: {adj} vs {c['adjusted']}")
    check(S.holm_reject(c["p"], 0.05) == c["reject05"] and S.holm_reject(c["p"], 0.10) == c["reject10"],
          f"holm_reject {c['p']}")
hand = S.holm([0.01, 0.04, 0.03, 0.005])  # sorted: 4*0.005, 3*0.01, 2*0.03, max(0.06, 1*0.04)
check(all(close(g, w) for g, w in zip(hand, [0.03, 0.06, 0.06, 0.02])), f"holm on a hand family: {hand}")
check(S.holm_reject([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True], "holm_reject on a hand family")

# ---- power ---------------------------------------------------------------------------------------
bad = [(e, n, a, S.paired_power(e, n, a), w) for e, n, a, w in G["power"] if not close(S.paired_power(e, n, a), w, 1e-9, 1e-12)]
check(not bad, f"paired_power vs statsmodels ttest_power: {bad[:3]}")
for c in G["mde"]:
    for sd in (1.0, 0.37):
        got = S.mde_paired(sd, c["n"], c["alpha"], c["power"])
        check(close(got, c["effect"] * sd, 1e-9), f"mde_paired {c} sd {sd}: {got}")
        if c["solve_power_converged"]:
            check(close(got, c["solve_power"] * sd, 5e-5), f"mde_paired vs solve_power {c}: {got}")
for c in G["n_for_margin"]:
    got = S.n_for_margin(c["sd"], c["margin"], c["alpha"], c["power"])
    check(got == c["n"], f"n_for_margin {c}: {got}")
    check(S.mde_paired(c["sd"], got, c["alpha"], c["power"]) <= c["margin"] < S.mde_paired(c["sd"], got - 1, c["alpha"], c["power"]),
          f"n_for_margin {c}: the smallest n with mde <= margin")

# ---- verdicts --------------------------------------------------------------------------------------
check(S.VERDICTS == ("holds", "fails", "not separated", "untestable"), "VERDICTS")
for lo, hi, claim, want in ((0.1, 0.5, 0.3, "holds"), (-0.5, -0.1, -0.3, "holds"), (0.1, 0.3, 0.1, "holds"),
                            (-0.1, 0.5, 0.3, "not separated"), (0.0, 0.5, 0.3, "not separated"),
                            (0.1, 0.2, 0.3, "fails"), (0.4, 0.6, 0.3, "fails"), (-0.5, -0.1, 0.3, "fails"),
                            (-0.1, 0.1, 0.3, "fails"), (NAN, 0.5, 0.3, "untestable")):
    check(S.verdict(lo, hi, claim) == want, f"verdict({lo}, {hi}, {claim}) = {S.verdict(lo, hi, claim)}, not {want}")
for lo, hi, sign, want in ((0.1, 0.5, 1, "holds"), (-0.5, -0.1, 1, "fails"), (-0.1, 0.5, 1, "not separated"),
                           (0.0, 0.5, 1, "not separated"), (-0.5, -0.1, -1, "holds"), (0.1, 0.5, -1, "fails"),
                           (-0.1, 0.5, -1, "not separated"), (0.1, NAN, 1, "untestable")):
    got = S.directional_verdict(lo, hi, sign)
    check(got == want, f"directional_verdict({lo}, {hi}, {sign}) = {got}, not {want}")

# ---- bootstrap: properties (its RNG is not scipy's) ---------------------------------------------------
d = G["bootstrap"]["d"]
b0, b0again, b1 = S.bootstrap_interval(d, seed=0), S.bootstrap_interval(d, seed=0), S.bootstrap_interval(d, seed=1)
t = S.diff_interval(d)
width = t.hi - t.lo
check(same(b0, b0again), "bootstrap_interval is deterministic for a seed")
check((b0.lo, b0.hi) != (b1.lo, b1.hi), "bootstrap_interval depends on the seed")
check(b0.lo < b0.mean < b0.hi and b0.mean == t.mean, f"bootstrap_interval contains the mean: {b0}")
check(abs(b0.lo - t.lo) < 0.05 * width and abs(b0.hi - t.hi) < 0.05 * width,
      f"bootstrap within 5% of the t width of the t interval (n = {len(d)}): {b0} vs {t}")
check(abs(b0.lo - G["bootstrap"]["scipy_lo"]) < 0.05 * width and abs(b0.hi - G["bootstrap"]["scipy_hi"]) < 0.05 * width,
      f"bootstrap within 5% of the t width of scipy's percentile bootstrap: {b0}")
check(close(b0.se, t.se, 0.1), f"bootstrap se within 10% of the t se: {b0.se} vs {t.se}")
small = S.bootstrap_interval([1.0, 2.0, 4.0], level=0.9, n_boot=2000, seed=3)
check(1.0 <= small.lo <= small.hi <= 4.0, f"bootstrap endpoints inside the data's range: {small}")

# ---- Spearman = scipy.stats.spearmanr, ties at average ranks ----------------------------------------
for c in G["spearman"]:
    got = S.spearman(c["x"], c["y"])
    check(close(got, c["rho"], 1e-12, 1e-12), f"spearman {c['name']}: {got} vs scipy {c['rho']}")
check(S.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0], "ranks: ties at their average rank")
check(math.isnan(S.spearman([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])), "spearman of a constant side is nan")

print(f"{counts['passed']} passed, {counts['failed']} failed")
sys.exit(1 if counts["failed"] else 0)
