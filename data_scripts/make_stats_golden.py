#!/usr/bin/env python3
"""Writes tests/fixtures/stats_golden/golden.json: fixed inputs (seeded numpy draws, written out as
plain lists) and what scipy and statsmodels compute from them, the reference for
python/kvlab/stats.py (checked by tests/python/test_stats.py with the system python3).

This script never imports python/kvlab/stats.py: every expected value comes from scipy,
statsmodels, or a formula written out here again in numpy (the stratified interval, Newcombe's
paired interval, the tight root of statsmodels' power function).

Run (pinned versions in data_scripts/requirements.txt; CPython 3.11):
  python3 -m venv /tmp/statsvenv
  /tmp/statsvenv/bin/pip install numpy==2.4.6 scipy==1.17.1 statsmodels==0.15.0
  /tmp/statsvenv/bin/python data_scripts/make_stats_golden.py [repo root]

nan is written as null (the JSON stays strict).
"""
import json
import math
import os
import sys
import warnings

import numpy as np
import scipy
import statsmodels
from scipy import optimize, special, stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower, ttest_power
from statsmodels.stats.proportion import proportion_confint

warnings.simplefilter("ignore")  # scipy warns on the se = 0 cases; their values are the point
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
rng = np.random.default_rng(20240611)


def num(x):
    """A plain float for JSON; nan -> None."""
    x = float(x)
    return None if math.isnan(x) else x


def floats(xs):
    return [num(x) for x in xs]


# ---- paired t (scipy.stats.ttest_rel) --------------------------------------------------------
def paired_case(name, a, b, level=0.95):
    a, b = np.asarray(a, float), np.asarray(b, float)
    r = stats.ttest_rel(a, b)
    ci = r.confidence_interval(level)
    d = a - b
    return dict(name=name, a=floats(a), b=floats(b), level=level, n=len(a), mean=num(np.mean(d)),
                se=num(stats.sem(d)) if len(d) > 1 else None, lo=num(ci.low), hi=num(ci.high),
                df=num(r.df), p=num(r.pvalue))


paired = []
for n in (5, 11, 20, 110):  # continuous scores
    a = rng.normal(0.6, 0.15, n)
    paired.append(paired_case(f"normal_n{n}", a, a - rng.normal(0.03, 0.08, n)))
for n in (11, 20):  # quarter-point scores: ties and exact-zero differences
    paired.append(paired_case(f"ties_n{n}", rng.integers(0, 5, n) / 4, rng.integers(0, 5, n) / 4))
b = rng.integers(0, 8, 5) / 4
paired.append(paired_case("all_equal_diff", b + 0.5, b))  # se = 0, mean 0.5: p = 0, lo = hi = 0.5
paired.append(paired_case("all_zero_diff", b, b))  # se = 0, mean 0: p nan, lo = hi = 0
paired.append(paired_case("n2_level90", [1.0, 2.0], [0.0, 0.5], 0.90))
a = rng.normal(0.5, 0.2, 20)
paired.append(paired_case("n20_level99", a, a - rng.normal(0.1, 0.1, 20), 0.99))
paired.append(paired_case("binary_n110", rng.integers(0, 2, 110), rng.integers(0, 2, 110)))

# ---- distributions -------------------------------------------------------------------------------
dfs = [1, 1.5, 2, 3, 4.7, 10, 19, 30, 109, 1000]
xs = [-50, -8, -3, -1.2, -0.3, 0, 1e-3, 0.5, 1.96, 2.5, 4, 7, 20, 100]
qs = [1e-10, 1e-6, 1e-3, 0.025, 0.1, 0.3, 0.5, 0.6, 0.9, 0.975, 0.995, 0.999999]
dist = dict(
    t_cdf=[[x, df, num(stats.t.cdf(x, df))] for df in dfs for x in xs],
    t_ppf=[[q, df, num(stats.t.ppf(q, df))] for df in dfs for q in qs],
    norm_cdf=[[x, num(stats.norm.cdf(x))] for x in (-30, -8, -3, -1.96, -0.5, 0, 0.3, 1.644, 2.5, 6)],
    norm_ppf=[[q, num(stats.norm.ppf(q))] for q in (1e-12, 1e-5, 0.025, 0.2, 0.5, 0.8, 0.975, 0.999)],
    nct_cdf=[[x, df, nc, v] for df in (1, 2, 4, 10, 19, 109, 1000) for nc in (-2, 0, 0.5, 1.5, 2.8, 5, 10, 20)
             for x in (-5, -1.96, 0, 0.7, 2, 3.5, 8, 25)
             if not math.isnan(v := float(special.nctdtr(df, nc, x)))])  # nctdtr is nan far in some lower tails

# ---- stratified (equal-weight mean over strata, Welch-Satterthwaite df), numpy + scipy.stats.t ----
def stratified_case(name, groups, level=0.95):
    groups = [np.asarray(g, float) for g in groups]
    T = len(groups)
    m = np.array([g.mean() for g in groups])
    w = np.array([g.var(ddof=1) / len(g) for g in groups])
    nu = np.array([len(g) - 1 for g in groups])
    mean, se = m.mean(), math.sqrt(w.sum()) / T
    df = w.sum() ** 2 / np.sum(w ** 2 / nu)
    h = stats.t.ppf(0.5 + level / 2, df) * se
    return dict(name=name, groups=[floats(g) for g in groups], level=level, n=int(sum(map(len, groups))),
                mean=num(mean), se=num(se), df=num(df), lo=num(mean - h), hi=num(mean + h),
                p=num(2 * stats.t.sf(abs(mean / se), df)))


strat = [stratified_case("ruler_like_11x8", [rng.normal(0.02 * k, 0.05 + 0.02 * k, 8) for k in range(11)]),
         stratified_case("unequal_5_11_20", [rng.normal(0.1, 0.3, 5), rng.normal(0.0, 0.05, 11),
                                             rng.normal(-0.05, 0.1, 20)], 0.9),
         stratified_case("ties_3x6", [rng.integers(-2, 3, 6) / 2 for _ in range(3)])]
one = rng.normal(0.05, 0.1, 20)
s1 = stratified_case("one_stratum", [one])
r1 = stats.ttest_rel(one, np.zeros(20))
ci1 = r1.confidence_interval(0.95)
assert abs(s1["df"] - 19) < 1e-9 and abs(s1["lo"] - ci1.low) < 1e-12 and abs(s1["hi"] - ci1.high) < 1e-12
s1.update(ttest_rel_lo=num(ci1.low), ttest_rel_hi=num(ci1.high), ttest_rel_p=num(r1.pvalue))
strat.append(s1)

# ---- McNemar (statsmodels exact) and Newcombe's paired interval (statsmodels Wilson + numpy) ----
mcn = [[b, c, num(mcnemar([[7, b], [c, 3]], exact=True).pvalue)]
       for b, c in ((4, 0), (0, 4), (0, 0), (5, 5), (10, 3), (0, 12), (1, 2), (30, 45), (100, 130), (1000, 1100))]


def newcombe(x, y, level):
    x, y = np.asarray(x), np.asarray(y)
    a, b, c, d = (int(np.sum((x == u) & (y == v))) for u, v in ((1, 1), (1, 0), (0, 1), (0, 0)))
    n = len(x)
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = proportion_confint(a + b, n, 1 - level, method="wilson")
    l2, u2 = proportion_confint(a + c, n, 1 - level, method="wilson")
    marg = np.prod(np.array([a + b, c + d, a + c, b + d], float))
    phi = (a * d - b * c) / np.sqrt(marg) if marg > 0 else 0.0
    D = p1 - p2
    lo = D - np.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    hi = D + np.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    p = mcnemar([[a, b], [c, d]], exact=True).pvalue
    return dict(x=[int(v) for v in x], y=[int(v) for v in y], level=level, a=a, b=b, c=c, d=d, n=n,
                diff=num(D), lo=num(lo), hi=num(hi), p=num(p))


def table(a, b, c, d):  # a fixed 2x2 table as two aligned 0/1 vectors
    return [1] * a + [1] * b + [0] * c + [0] * d, [1] * a + [0] * b + [1] * c + [0] * d


pairs = [newcombe(*table(12, 9, 2, 21), 0.95), newcombe(*table(10, 15, 5, 20), 0.90),
         newcombe(*table(0, 4, 0, 0), 0.95), newcombe(*table(5, 0, 0, 6), 0.95),
         newcombe(*table(20, 0, 0, 0), 0.95)]
for n in (20, 110):
    x = rng.integers(0, 2, n)
    y = np.where(rng.random(n) < 0.7, x, rng.integers(0, 2, n))
    pairs.append(newcombe(x, y, 0.95))

# ---- Holm (statsmodels multipletests) -------------------------------------------------------------
families = [[0.01, 0.04, 0.03, 0.005, 0.2], [0.01, 0.01, 0.02, 0.5], [0.3, 0.6, 0.9], [0.04],
            [0.0125, 0.0125, 0.0125, 0.0125], list(np.round(rng.random(20) ** 3, 6))]
holm = []
for p in families:
    holm.append(dict(p=floats(p), adjusted=floats(multipletests(p, method="holm")[1]),
                     reject05=[bool(r) for r in multipletests(p, 0.05, method="holm")[0]],
                     reject10=[bool(r) for r in multipletests(p, 0.10, method="holm")[0]]))

# ---- power: statsmodels ttest_power, its tight root, and TTestPower.solve_power itself ----------
power = [[e, n, al, v] for n in (2, 5, 11, 50, 110) for al in (0.05, 0.01) for e in (0.1, 0.4, 1.0, 2.5)
         if not math.isnan(v := float(ttest_power(e, n, al)))]  # nan where scipy's nctdtr is
mde, mde_skipped = [], []
for n in (2, 3, 5, 11, 20, 50, 110, 1000):
    for al, pw in ((0.05, 0.8), (0.01, 0.9), (0.05, 0.5), (0.1, 0.95)):
        lo, hi = 1e-6, 0.25  # bracket the root closely: far above it scipy's nctdtr can be nan
        while ttest_power(hi, n, al) < pw:
            lo, hi = hi, 2 * hi
        try:  # the root of the very power function solve_power solves, to 1e-15
            root = optimize.brentq(lambda e: ttest_power(e, n, al) - pw, lo, hi, xtol=1e-15, rtol=1e-15)
        except ValueError:  # ttest_power is nan where scipy's nctdtr is (far lower tails at small n)
            mde_skipped.append([n, al, pw])
            continue
        sp = float(np.squeeze(TTestPower().solve_power(nobs=n, alpha=al, power=pw, alternative="two-sided")))
        mde.append(dict(n=n, alpha=al, power=pw, effect=root, solve_power=sp,
                        solve_power_converged=abs(sp - root) < 1e-3 * root))
margin = []
for sd, mg, al, pw in ((1, 0.5, 0.05, 0.8), (1, 0.1, 0.05, 0.8), (0.3, 0.05, 0.05, 0.8), (2, 1.7, 0.05, 0.8),
                       (1, 0.03, 0.05, 0.8), (0.2, 0.05, 0.01, 0.9), (1, 1.3, 0.05, 0.8)):
    sp = float(np.squeeze(TTestPower().solve_power(effect_size=mg / sd, alpha=al, power=pw)))
    root = optimize.brentq(lambda n: ttest_power(mg / sd, n, al) - pw, max(1.5, sp - 2), sp + 2, xtol=1e-12)
    assert math.ceil(sp) == math.ceil(root) and abs(root - round(root)) > 1e-6, (sd, mg, sp, root)
    margin.append(dict(sd=sd, margin=mg, alpha=al, power=pw, solve_power=sp, n=math.ceil(sp)))

# ---- bootstrap: data only (scipy's RNG differs); scipy's percentile interval as a loose reference ----
boot = rng.normal(0.05, 0.2, 200).round(4)
bres = stats.bootstrap((boot,), np.mean, confidence_level=0.95, n_resamples=10000, method="percentile",
                       random_state=np.random.default_rng(0))
bootstrap = dict(d=floats(boot), scipy_lo=num(bres.confidence_interval.low), scipy_hi=num(bres.confidence_interval.high))

# ---- Spearman (scipy.stats.spearmanr), ties at average ranks; its own generator, so the draws above stay ----
srng = np.random.default_rng(20261207)
spearman_cases = []
for name, x, y in (
        ("continuous n=12", srng.normal(0, 1, 12), srng.normal(0, 1, 12)),
        ("monotone decreasing n=8", np.arange(8.0), -np.arange(8.0) ** 2),
        ("ties in both n=20", srng.integers(0, 4, 20).astype(float), srng.integers(0, 3, 20).astype(float)),
        ("binary scores vs errors n=30", srng.uniform(0, 0.3, 30).round(4), srng.integers(0, 2, 30).astype(float)),
        ("cell means n=6", np.array([0.05, 0.12, 0.12, 0.3, 0.41, 0.2]), np.array([90.0, 85.0, 70.0, 70.0, 40.0, 66.0]))):
    spearman_cases.append(dict(name=name, x=floats(x), y=floats(y), rho=num(stats.spearmanr(x, y).statistic)))

out = dict(versions=dict(numpy=np.__version__, scipy=scipy.__version__, statsmodels=statsmodels.__version__,
                         python=sys.version.split()[0]),
           paired=paired, dist=dist, stratified=strat, mcnemar=mcn, pairs=pairs, holm=holm, power=power,
           mde=mde, mde_skipped=mde_skipped, n_for_margin=margin, bootstrap=bootstrap,
           spearman=spearman_cases)
path = os.path.join(ROOT, "tests", "fixtures", "stats_golden", "golden.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump(out, f, separators=(",", ":"), allow_nan=False)
    f.write("\n")
print(f"wrote {path}: {os.path.getsize(path)} bytes")
