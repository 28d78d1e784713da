"""The statistics behind every table kvlab prints, standard library only (CI has no numpy/scipy).
Each function names the scipy/statsmodels function it equals; tests/python/test_stats.py checks
them against goldens those packages wrote (data_scripts/make_stats_golden.py)."""
import math
import random
from collections import namedtuple
from fractions import Fraction
from statistics import NormalDist

VERDICTS = ("holds", "fails", "not separated", "untestable")
_NAN = float("nan")
Interval = namedtuple("Interval", "mean se lo hi df p n")
Interval.__doc__ = """A mean (difference), its standard error, the two-sided interval [lo, hi], the
degrees of freedom of its t, the two-sided p of the test against 0, and the number of pairs."""


def mean_se(xs):
    """(mean, sd/sqrt(n)), sd with the n-1 denominator = (numpy.mean, scipy.stats.sem).
    se is nan for n < 2; both are nan for n = 0."""
    xs = [float(x) for x in xs]
    n = len(xs)
    if n == 0:
        return _NAN, _NAN
    m = math.fsum(xs) / n
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else _NAN


def norm_cdf(x):
    """Phi(x) = erfc(-x/sqrt 2)/2 = scipy.stats.norm.cdf."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def norm_ppf(q):
    """Phi^-1(q) = scipy.stats.norm.ppf, by statistics.NormalDist.inv_cdf (Wichura's AS 241, ~1e-16)."""
    return NormalDist().inv_cdf(q)


def _betacf(a, b, x):
    """The continued fraction of I_x(a, b) by modified Lentz (Numerical Recipes 6.4, betacf)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    h = d = 1.0 / (d if abs(d) > tiny else tiny)
    for m in range(1, 100000):
        for aa in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            return h
    raise ArithmeticError("betacf did not converge")


def betainc(a, b, x, y=None):
    """Regularized incomplete beta I_x(a, b) = scipy.special.betainc; y = 1 - x, passed when the
    caller knows it more precisely. The fraction runs on the side where it converges fast."""
    y = 1.0 - x if y is None else y
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(a * math.log(x) + b * math.log(y) - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, y) / b


def t_sf(x, df):
    """P(T > x), Student t, real df > 0 = scipy.stats.t.sf: I_{df/(df+x^2)}(df/2, 1/2)/2 for x >= 0."""
    if math.isinf(x):
        return 0.0 if x > 0 else 1.0
    tail = 0.5 * betainc(0.5 * df, 0.5, df / (df + x * x), x * x / (df + x * x))
    return tail if x >= 0 else 1.0 - tail


def t_cdf(x, df):
    """P(T <= x) = scipy.stats.t.cdf (= t_sf(-x))."""
    return t_sf(-x, df)


def t_ppf(q, df):
    """Student t quantile = scipy.stats.t.ppf: the root x >= 0 of t_sf(x) = min(q, 1-q) by Newton
    steps (the density from lgamma) kept inside a bisection bracket, mirrored for q < 1/2."""
    if not 0.0 < q < 1.0:
        return {0.0: -math.inf, 1.0: math.inf}.get(q, _NAN)
    p = min(q, 1.0 - q)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > p:
        lo, hi = hi, 2.0 * hi
    x, logc = 0.5 * (lo + hi), math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for _ in range(200):
        f = t_sf(x, df) - p
        lo, hi = (x, hi) if f > 0 else (lo, x)
        nx = x + f / math.exp(logc - (df + 1) / 2 * math.log1p(x * x / df))
        nx = nx if lo < nx < hi else 0.5 * (lo + hi)
        done, x = abs(nx - x) <= 1e-15 * nx or hi - lo <= 1e-15 * hi, nx
        if done:
            break
    return x if q > 0.5 else -x


def _mixture(lam, s, b, z, y):
    """sum_i e^-lam lam^i/Gamma(i+s) I_z(i+s-1/2, b), summed outwards from the Poisson mode
    k = floor(lam) (Benton & Krishnamoorthy 2003) so no weight underflows; the incomplete betas
    by I(a+1) = I(a) - g(a), g(a) = Gamma(a+b)/(Gamma(a+1)Gamma(b)) z^a y^b, and back down."""
    k = int(lam)
    a0 = k + s - 0.5
    w0 = math.exp(-lam + (k * math.log(lam) if k else 0.0) - math.lgamma(k + s))
    i0 = betainc(a0, b, z, y)
    g0 = math.exp(math.lgamma(a0 + b) - math.lgamma(a0 + 1) - math.lgamma(b) + a0 * math.log(z) + b * math.log(y))
    total, (w, ib, g, a) = w0 * i0, (w0, i0, g0, a0)
    while True:  # upwards weights and betas both fall: the rest < term r/(1-r)
        r = lam / (a + 0.5)
        w, ib, g, a = w * r, ib - g, g * z * (a + b) / (a + 1), a + 1
        total += w * max(ib, 0.0)
        if w * max(ib, 0.0) * r <= (1e-17 * total + 1e-300) * (1 - r):
            break
    w, ib, g, a = w0, i0, g0, a0
    while a > s:  # downwards to i = 0 the betas rise to <= 1: the rest < w r/(1-r)
        g *= a / (z * (a + b - 1))  # g(a - 1)
        w, ib, a = w * (a - 0.5) / lam, ib + g, a - 1
        total += w * ib
        r = (a - 0.5) / lam
        if r < 1 and w * r <= (1e-17 * total + 1e-300) * (1 - r):
            break
    return total


def nct_cdf(x, df, nc):
    """P(T <= x), noncentral t(df, nc) = scipy.special.nctdtr(df, nc, x) = scipy.stats.nct.cdf. For
    x > 0, z = x^2/(x^2+df), lam = nc^2/2 (AS 243's series, Lenth 1989): Phi(-nc) + 1/2 sum_i [P_i
    I_z(i+1/2, df/2) + nc/sqrt2 Q_i I_z(i+1, df/2)], P_i = e^-lam lam^i/i!, Q_i = e^-lam lam^i/
    Gamma(i+3/2); x < 0 by 1 - P(T <= -x; -nc). Absolute error ~1e-13 for |nc| <= 100."""
    if x < 0:
        return 1.0 - nct_cdf(-x, df, -nc)
    if x == 0:
        return norm_cdf(-nc)
    lam, b, z, y = 0.5 * nc * nc, 0.5 * df, x * x / (x * x + df), df / (x * x + df)
    s = _mixture(lam, 1.0, b, z, y) + nc / math.sqrt(2.0) * _mixture(lam, 1.5, b, z, y)
    return min(1.0, max(0.0, norm_cdf(-nc) + 0.5 * s))


def _t_interval(mean, se, df, n, level):
    """mean -+ t_{(1+level)/2, df} se and the two-sided p of mean/se against t(df); with se = 0
    (as scipy) lo = hi = mean and p = 0, or nan when mean = 0 too."""
    if not (se >= 0 and df > 0):
        return Interval(mean, se, _NAN, _NAN, df, _NAN, n)
    h = t_ppf(0.5 + level / 2.0, df) * se
    p = min(1.0, 2.0 * t_sf(abs(mean / se), df)) if se > 0 else (_NAN if mean == 0 else 0.0)
    return Interval(mean, se, mean - h, mean + h, df, p, n)


def diff_interval(d, level=0.95):
    """One-sample t interval of mean(d), df = n-1 = scipy.stats.ttest_1samp(d, 0)'s
    confidence_interval(level) and pvalue."""
    m, se = mean_se(d)
    return _t_interval(m, se, len(d) - 1.0, len(d), level)


def paired_interval(a, b, level=0.95):
    """Paired t interval of mean(a_i - b_i) = scipy.stats.ttest_rel(a, b)'s confidence_interval(level)
    and pvalue."""
    if len(a) != len(b):
        raise ValueError("paired samples differ in length")
    return diff_interval([x - y for x, y in zip(a, b)], level)


def stratified_interval(groups, level=0.95):
    """The mean over T strata (tasks) of per-stratum mean paired differences, each stratum weighted
    equally (as RULER averages its tasks): mean = (1/T) sum m_t, se = sqrt(sum v_t/n_t)/T (v_t the
    n_t-1 variance), df by Welch-Satterthwaite (sum v_t/n_t)^2 / sum (v_t/n_t)^2/(n_t-1), and the t
    interval on them; one stratum gives ttest_rel. groups: lists of differences (or a dict of them),
    each of >= 2. No variance anywhere: lo = hi = mean, df nan."""
    groups = [list(g) for g in (groups.values() if hasattr(groups, "values") else groups)]
    if not groups or any(len(g) < 2 for g in groups):
        raise ValueError("every stratum needs at least 2 pairs")
    ms = [mean_se(g) for g in groups]
    w = [se * se for _, se in ms]  # v_t / n_t
    mean, n = math.fsum(m for m, _ in ms) / len(groups), sum(map(len, groups))
    den = math.fsum(wt * wt / (len(g) - 1) for wt, g in zip(w, groups))
    if den == 0:
        return Interval(mean, 0.0, mean, mean, _NAN, _NAN if mean == 0 else 0.0, n)
    return _t_interval(mean, math.sqrt(math.fsum(w)) / len(groups), math.fsum(w) ** 2 / den, n, level)


def bootstrap_interval(d, level=0.95, n_boot=10000, seed=0):
    """Percentile bootstrap of mean(d): n_boot resamples with replacement drawn by
    random.Random(seed) (deterministic for a seed); lo, hi = the (1-level)/2 and (1+level)/2
    quantiles of the resampled means, interpolated as numpy.percentile's default; se = their sd;
    df, p nan. The analogue of scipy.stats.bootstrap(method='percentile') (another RNG: no golden)."""
    d = [float(x) for x in d]
    if not d:
        raise ValueError("no data")
    rng, n = random.Random(seed), len(d)
    means = sorted(sum(rng.choices(d, k=n)) / n for _ in range(n_boot))
    sd = mean_se(means)[1] * math.sqrt(n_boot)
    return Interval(math.fsum(d) / n, sd, percentile(means, (1 - level) / 2), percentile(means, (1 + level) / 2),
                    _NAN, _NAN, n)


def percentile(sorted_xs, q):
    """The q-quantile (0 <= q <= 1) of sorted values, interpolated as numpy.percentile's default
    (linear)."""
    n = len(sorted_xs)
    h = (n - 1) * q
    i = min(int(h), n - 2) if n > 1 else 0
    return sorted_xs[i] + (h - i) * (sorted_xs[min(i + 1, n - 1)] - sorted_xs[i])


def ranks(xs):
    """Ranks 1..n, ties given their average rank (scipy.stats.rankdata's 'average')."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(xs, ys):
    """Spearman's rank correlation with ties at average ranks: the Pearson correlation of the ranks
    (= scipy.stats.spearmanr(xs, ys).statistic); nan when either side is constant."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} x values and {len(ys)} y values")
    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = math.fsum(rx) / len(rx), math.fsum(ry) / len(ry)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = math.fsum((a - mx) ** 2 for a in rx), math.fsum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else _NAN


def mcnemar_exact(b, c):
    """Two-sided exact McNemar p from the discordant counts (b: A right & B wrong, c: the reverse):
    min(1, 2 BinomCDF(min(b, c); b + c, 1/2)), summed in exact integers = statsmodels.stats
    .contingency_tables.mcnemar([[a, b], [c, d]], exact=True).pvalue; 1 when b + c = 0."""
    m, term, total = b + c, 1, 1  # term = comb(m, k)
    for k in range(min(b, c)):
        term = term * (m - k) // (k + 1)
        total += term
    return float(min(Fraction(1), Fraction(2 * total, 2 ** m)))


def _wilson(k, n, z):
    """Wilson score interval of k/n = statsmodels proportion_confint(k, n, method='wilson')."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return centre - half, centre + half


def mcnemar_from_pairs(x, y, level=0.95):
    """McNemar on aligned 0/1 outcomes x (A), y (B): a dict of the table a (both 1), b (x=1, y=0),
    c (x=0, y=1), d, n; p = mcnemar_exact(b, c); diff = (b - c)/n = mean(x) - mean(y) and its
    interval lo, hi by Newcombe's hybrid score method for paired data (Stat Med 1998 17:2635,
    method 10, no continuity correction): Wilson (l1, u1) of p1 = (a+b)/n, (l2, u2) of p2 = (a+c)/n,
    phi = (ad - bc)/sqrt(product of the 4 margins) (0 if one is 0), lo = diff - sqrt((p1-l1)^2
    - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2), hi = diff + sqrt((u1-p1)^2 - 2 phi (u1-p1)(p2-l2) + (p2-l2)^2)."""
    if len(x) != len(y) or not x:
        raise ValueError("need two aligned, non-empty lists of 0/1 outcomes")
    cells = [(int(u), int(v)) for u, v in zip(x, y)]
    a, b, c, d = (cells.count(k) for k in ((1, 1), (1, 0), (0, 1), (0, 0)))
    n, z = len(x), norm_ppf(0.5 + level / 2.0)
    if a + b + c + d != n:
        raise ValueError("outcomes must be 0 or 1")
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = _wilson(a + b, n, z), _wilson(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    lo = (b - c) / n - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = (b - c) / n + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return dict(a=a, b=b, c=c, d=d, n=n, diff=(b - c) / n, lo=lo, hi=hi, p=mcnemar_exact(b, c))


def holm(pvalues):
    """Holm step-down adjusted p, in input order = statsmodels.stats.multitest.multipletests(p,
    method='holm')[1]: for sorted p_(1) <= ... <= p_(m), adj_(i) = min(1, max_{j<=i} (m-j+1) p_(j))."""
    m, adj, run = len(pvalues), [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        run = max(run, (m - rank) * pvalues[i])
        adj[i] = min(1.0, run)
    return adj


def holm_reject(pvalues, alpha=0.05):
    """Holm's rejections in input order = multipletests(p, alpha, method='holm')[0]: the sorted
    p_(i) is rejected while p_(j) <= alpha/(m-j+1) for every j <= i."""
    m, reject, ok = len(pvalues), [False] * len(pvalues), True
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        ok = ok and pvalues[i] <= alpha / (m - rank)
        reject[i] = ok
    return reject


def paired_power(effect, n, alpha=0.05):
    """Power of the two-sided paired (one-sample) t test with n pairs at the standardized effect
    mean/sd = statsmodels.stats.power.ttest_power(effect, n, alpha): with c = t_{1-alpha/2, n-1} and
    T' noncentral t(n-1, effect sqrt n), P(T' > c) + P(T' < -c)."""
    c, nc = t_ppf(1.0 - alpha / 2.0, n - 1), effect * math.sqrt(n)
    return (1.0 - nct_cdf(c, n - 1, nc)) + nct_cdf(-c, n - 1, nc)


def mde_paired(sd, n, alpha=0.05, power=0.8):
    """Minimal detectable mean difference of the two-sided paired t test with n pairs whose
    differences have sd: sd times the effect where paired_power = power (the exact noncentral t;
    bisection to 1e-13 relative) = TTestPower().solve_power(nobs=n, alpha=alpha, power=power) * sd
    (statsmodels' own solver stops ~1e-5 short of this root, and fails at n = 2)."""
    if n < 2:
        raise ValueError("need n >= 2 pairs")
    lo, hi = 0.0, 1.0
    while paired_power(hi, n, alpha) < power:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if paired_power(mid, n, alpha) < power else (lo, mid)
    return 0.5 * (lo + hi) * sd


def n_for_margin(sd, margin, alpha=0.05, power=0.8):
    """The smallest n >= 2 pairs with mde_paired(sd, n) <= margin, i.e. paired_power(margin/sd, n)
    >= power = ceil(TTestPower().solve_power(effect_size=margin/sd, alpha=alpha, power=power))."""
    ok = lambda n: paired_power(margin / sd, n, alpha) >= power  # noqa: E731
    lo, hi = 1, 2
    while not ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # ok(hi); lo = 1 or not ok(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def verdict(lo, hi, claim):
    """The ledger's verdict on a claimed effect `claim` (signed; > 0: the paper's method better)
    from the closed interval [lo, hi] of the measured effect: "holds" when the claim is inside and
    0 is not; "fails" when the claim is outside (the effect is absent, reversed, or of another
    size); "not separated" when both the claim and 0 are inside; "untestable" when lo or hi is nan."""
    if math.isnan(lo) or math.isnan(hi):
        return "untestable"
    if not lo <= claim <= hi:
        return "fails"
    return "not separated" if lo <= 0.0 <= hi else "holds"


def directional_verdict(lo, hi, sign):
    """The verdict on a claim of direction only ("A beats B": sign > 0; "A is worse": sign < 0):
    "holds" when [lo, hi] lies wholly on the claimed side of 0 (lo > 0 or hi < 0), "fails" when
    wholly on the other, "not separated" when it contains 0, "untestable" when lo or hi is nan."""
    if sign == 0:
        raise ValueError("sign must be > 0 or < 0")
    if math.isnan(lo) or math.isnan(hi):
        return "untestable"
    if lo > 0 or hi < 0:
        return "holds" if (lo > 0) == (sign > 0) else "fails"
    return "not separated"
