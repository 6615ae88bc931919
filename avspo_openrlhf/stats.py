"""The statistics of the studies and the quickstart, one implementation each: paired bootstrap
intervals (over problems, or over seeds and problems), the exact sign-flip test, Student-t
intervals (and their half-width alone: one run's evaluation interval) and Pearson's r with its
interval.

The t distribution is scipy's (imported when first needed: the study loop on a bare GPU machine
imports this module without scipy). The exact sign-flip test is written here because scipy's
``permutation_test`` enumerates all 2^n sign patterns (16.7 million statistics at 24 seeds), where
the meet-in-the-middle count below holds 2 x 2^(n/2) sums.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

# ── Student t ──


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (scipy.stats.t)."""
    from scipy.stats import t as student_t

    if df <= 0:
        raise ValueError(f"t_cdf: df must be > 0, got {df}")
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (scipy.stats.t)."""
    from scipy.stats import t as student_t

    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    return float(student_t.ppf(p, df))


def t_halfwidth(xs: Sequence[float], level: float = 0.95) -> float:
    """Half-width of the two-sided ``level`` t interval of the mean of ``xs``: t quantile
    ``(1 + level) / 2`` with n - 1 degrees of freedom x sd (n - 1) / sqrt(n). One run's evaluation
    interval is this over its per-problem accuracies (with hundreds of problems, t is the normal's
    1.96 to within 0.01). Needs two values or more."""
    if len(xs) < 2:
        raise ValueError(f"t_halfwidth: needs 2 values or more, got {len(xs)}")
    return t_quantile(0.5 + level / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Mean, standard deviation (n - 1) and the two-sided ``level`` t interval of the mean:
    ``(mean, sd, lo, hi)``. Needs two values or more."""
    if len(xs) < 2:
        raise ValueError(f"t_interval: needs 2 values or more, got {len(xs)}")
    mean, sd, half = statistics.mean(xs), statistics.stdev(xs), t_halfwidth(xs, level)
    return mean, sd, mean - half, mean + half


# ── paired tests ──


SIGN_FLIP_EXACT_MAX = 40  # pairs up to which the sign-flip p is exact (2 x 2^20 sums held at most)
SIGN_FLIP_DRAWS = 2**20  # random sign patterns beyond it: the p's Monte Carlo standard error <= 0.0005


def sign_flip_p(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided paired permutation test: the share of the 2^n sign flips of the paired differences
    whose |sum| reaches the observed one. With n pairs the smallest p is 2 / 2^n.

    Exact up to 40 pairs without holding 2^n sums: the sums of each half's 2^(n/2) patterns, one
    half sorted, and for each sum of the other half the count of partners beyond the observed |sum|.
    Beyond 40 pairs, :data:`SIGN_FLIP_DRAWS` random patterns from ``seed`` (the same p for the same
    differences): (1 + reaching) / (1 + draws), a valid permutation p-value (Phipson & Smyth, 2010)."""
    n = len(diffs)
    if n == 0:
        return float("nan")
    d = np.asarray(diffs, dtype=float)
    t = abs(d.sum()) - 1e-12
    if t <= 0:
        return 1.0  # every pattern reaches a sum of 0
    if n > SIGN_FLIP_EXACT_MAX:
        return _sign_flip_p_drawn(d, t, seed)

    def sums(x: np.ndarray) -> np.ndarray:  # the sum under every pattern of +-1 signs of x
        signs = 1 - 2 * ((np.arange(2 ** len(x))[:, None] >> np.arange(len(x))) & 1)
        return signs @ x

    a, b = sums(d[: n // 2]), np.sort(sums(d[n // 2 :]))
    reach = (len(b) - np.searchsorted(b, t - a, side="left")) + np.searchsorted(b, -t - a, side="right")
    return float(reach.sum() / 2**n)


def _sign_flip_p_drawn(d: np.ndarray, t: float, seed: int, chunk: int = 2**16) -> float:
    """The sign-flip p from :data:`SIGN_FLIP_DRAWS` random patterns, drawn in chunks (memory bounded)."""
    rng = np.random.default_rng(seed)
    reach = 0
    for _ in range(SIGN_FLIP_DRAWS // chunk):
        signs = rng.integers(0, 2, size=(chunk, len(d)), dtype=np.int8) * 2 - 1
        reach += int((np.abs(signs @ d) >= t).sum())
    return (1 + reach) / (1 + SIGN_FLIP_DRAWS)


def bootstrap_mean(d, rng: np.random.Generator, n_boot: int = 10_000) -> tuple[float, float, float, float]:
    """Mean of paired differences ``d`` with a 95 % percentile bootstrap interval and a two-sided
    bootstrap p-value: ``(mean, lo, hi, p)``. ``d`` is [S, P]: per seed (rows) and problem (columns);
    each replicate resamples the seeds, then the problems (the same problems for every seed). One
    row: the problems alone. ``rng`` is drawn from, so calls that share it continue its stream."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    if d.size == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    if d.shape[0] == 1:
        boots = d[0][rng.integers(0, d.shape[1], size=(n_boot, d.shape[1]))].mean(axis=1)
    else:
        s_idx = rng.integers(0, d.shape[0], size=(n_boot, d.shape[0]))
        p_idx = rng.integers(0, d.shape[1], size=(n_boot, d.shape[1]))
        boots = np.array([d[s][:, p].mean() for s, p in zip(s_idx, p_idx)])
    p = float(min(1.0, 2 * min((boots <= 0).mean(), (boots >= 0).mean())))
    return float(d.mean()), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)), p


def bootstrap_gain(
    before: list[dict], after: list[dict], n_boot: int = 10_000, seed: int = 0, levels: Sequence[str] | None = None
) -> dict[str, tuple[float, float, float]]:
    """Held-out gain after - before of one model on the same problems (evaluation records with
    ``unique_id``, ``level`` and per-sample ``correct``), with a paired 95 % bootstrap interval over
    problems (a problem's accuracy is the mean over its samples). Returns ``{"all" | level: (gain,
    lo, hi)}`` as fractions; ``levels`` default to the order the records first name them."""
    acc_b = {r["unique_id"]: (r.get("level"), float(np.mean(r["correct"]))) for r in before}
    acc_a = {r["unique_id"]: float(np.mean(r["correct"])) for r in after}
    ids = sorted(set(acc_b) & set(acc_a))
    if levels is None:
        levels = list(dict.fromkeys(r.get("level") for r in before if r.get("level") is not None))
    groups = {"all": ids, **{lv: [i for i in ids if acc_b[i][0] == lv] for lv in levels}}
    rng = np.random.default_rng(seed)
    out = {}
    for name, members in groups.items():
        if members:
            mean, lo, hi, _ = bootstrap_mean([acc_a[i] - acc_b[i][1] for i in members], rng, n_boot)
            out[name] = (mean, lo, hi)
    return out


# ── correlation ──


def pearson(x: Sequence[float], y: Sequence[float], centred_groups: int = 0) -> dict:
    """Pearson's r of paired values with its 95 % interval from Fisher's z (atanh(r) is about normal
    with sd 1 / sqrt(n - 3 - k)), R² and the two-sided p of r = 0 (t test, n - 2 - k degrees of
    freedom). ``centred_groups``: the values were centred within that many groups first (a partial
    correlation given the groups: k = groups - 1 degrees of freedom fewer). Returns ``{"n", "r",
    "ci95", "r2", "p"}``: the interval None below 4 + k pairs, everything but n None below 3 + k
    pairs or where either variable is constant."""
    n, k = len(x), max(0, centred_groups - 1)
    if n != len(y):
        raise ValueError(f"pearson: {n} x values, {len(y)} y values")
    out = {"n": n, "r": None, "ci95": None, "r2": None, "p": None}
    # exactly rounded sums (math.fsum), not BLAS dot products: a dot's summation order follows the
    # CPU's vector width, and a published r differed in its last digit between AVX2 and AVX-512
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    mx, my = (math.fsum(xs) / n, math.fsum(ys) / n) if n else (0.0, 0.0)
    dx, dy = [v - mx for v in xs], [v - my for v in ys]
    sxx, syy = math.fsum(a * a for a in dx), math.fsum(b * b for b in dy)
    if n - k < 3 or sxx <= 0 or syy <= 0:
        return out
    r = math.fsum(a * b for a, b in zip(dx, dy)) / math.sqrt(sxx * syy)
    r = math.copysign(1.0, r) if abs(r) > 1 - 1e-12 else r  # points on a line: exactly +-1, not 0.9999...
    df = n - 2 - k
    p = 0.0 if abs(r) == 1 else 2 * (1 - t_cdf(abs(r) * math.sqrt(df / (1 - r * r)), df))
    out.update(r=r, r2=r * r, p=p)
    if n - 3 - k >= 1:
        half = statistics.NormalDist().inv_cdf(0.975) / math.sqrt(n - 3 - k)
        out["ci95"] = [r, r] if abs(r) == 1 else [math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)]
    return out
