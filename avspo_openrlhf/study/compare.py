"""The remedies studies' one paired comparison between two methods, the CPU study's
(``study/remedies.py``) and the GPU study's (``study/remedies_gpu.py``) alike: each run a dict with
``method``, ``seed``, ``heldout_pass1`` and its held-out ``per_problem`` accuracies; the statistics
are ``avspo_openrlhf.stats``'s (scipy's t quantile, the exact sign-flip test). Then the decision
rule over a family of such comparisons (:func:`rule`: the t interval, the sign-flip p, Holm), its
power (statsmodels' t-test power) and the probability of improvement, plain functions of the per-seed
differences, which a study applies (``GPURemediesStudy.decide``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from avspo_openrlhf import stats

# The one result schema: what a run's result holds whichever study and backend made it (the study
# loop's ``result.json``; ``remedies.run_one``'s over an ``avspo-train`` cell), and what the paired
# comparisons and the shared report tables read. Each backend records more beside it (the loop: its
# settings record and hash, arm, device, token accounting; the CPU cells: their CPU, GRESO counters).
RESULT_SCHEMA = {
    "method": "the arm's (method's) name",
    "seed": "the run's seed: runs of two arms with one seed are a pair",
    "steps": "optimizer steps taken",
    "generated_tokens": "completion tokens generated, every round and refill counted",
    "heldout_pass1": "held-out pass@1, each level weighing the same (None: not evaluated)",
    "heldout_problems": "held-out problems evaluated",
    "heldout_by_level": "level -> held-out pass@1",
    "per_problem": "held-out unique_id -> accuracy over its samples",
    "acr_raw": "mean raw ACR over the trained batches",
    "acr_effective": "mean effective ACR (groups whose advantages are all 0) over the trained batches",
    "acr_all_wrong": "mean share of all-wrong groups",
    "acr_all_right": "mean share of all-right groups",
    "curve": "one row per step: step, tokens, wall_s, reward, acr, acr_effective (and more)",
    "mid_evals": "the mid-run evaluations: step, pass1 (and more)",
    "precision": "the run's precisions, recorded by the machine that ran it",
    "resumed": "whether the run resumed after a kill (its wall time is then not comparable)",
}
CURVE_KEYS = ("step", "tokens", "wall_s", "reward", "acr", "acr_effective")


# a run that fails on an error of its own in this many launches has failed for good: it is scored by the
# rule (its last mid-run evaluation, or 0) and never run again nor replaced; a crash of the process it
# shared with others (out of memory, a kill) is not its failure and does not count
FAIL_ATTEMPTS = 2

# A run that failed for good (the GPU study's rule, fixed before its runs: its own error in two launches)
# is kept as a record that says so and carries the score the rule gives it; it is never replaced.
FAILED_SCHEMA = {
    "method": RESULT_SCHEMA["method"],
    "seed": RESULT_SCHEMA["seed"],
    "failed": "True: the run failed for good",
    "error": "the last line of its last error",
    "heldout_pass1": "the score the study's rule gives a failed run (its last mid-run evaluation, or 0)",
    "score_rule": "where that score comes from, in words",
}


def failed(r: dict) -> bool:
    """A record of a run that failed for good (:data:`FAILED_SCHEMA`), not a finished run."""
    return bool(r.get("failed"))


def check_results(results: list[dict], where: str) -> None:
    """Refuse, naming the run and the keys, a result without :data:`RESULT_SCHEMA`'s keys (a file from
    another tool or version; a failed run's record: :data:`FAILED_SCHEMA`'s): a report built on it
    would be wrong where it is silent."""
    for r in results:
        missing = [k for k in (FAILED_SCHEMA if failed(r) else RESULT_SCHEMA) if k not in r]
        curve = r.get("curve") or []
        missing += [f"curve[].{k}" for k in CURVE_KEYS if curve and k not in curve[-1]]
        if missing:
            name = f"{r.get('method', '?')} seed {r.get('seed', '?')}"
            raise ValueError(f"{where}: the result of {name} lacks {', '.join(missing)} (compare.RESULT_SCHEMA)")


def per_seed_diffs(
    results: list[dict], method: str, base: str, level: Callable[[str], str], keep: Callable[[str], bool] | None = None
) -> dict[int, float]:
    """``method`` - ``base`` per seed both hold: the mean over levels (``level(unique_id)``) of the
    mean per-problem difference within each level, so each level weighs the same, as in the runs'
    held-out pass@1. Every seed's difference is over the same problems: those every run of the
    comparison holds (a run evaluated on a subset pairs with the rest on that subset), restricted
    by ``keep(unique_id)``. A seed where either run failed for good (:data:`FAILED_SCHEMA`) counts as
    the difference of the two held-out pass@1 (the rule's score), and is left out where ``keep``
    restricts the problems."""
    a = {r["seed"]: r for r in results if r["method"] == method}
    b = {r["seed"]: r for r in results if r["method"] == base}
    seeds = sorted(set(a) & set(b))
    whole = [s for s in seeds if not (failed(a[s]) or failed(b[s]))]
    if keep is not None:  # a failed run has no per-problem records: a per-level or subset row leaves its seed out
        seeds = whole
    if not seeds:
        return {}
    ids = set.intersection(*(set(a[s]["per_problem"]) & set(b[s]["per_problem"]) for s in whole)) if whole else set()
    ids = sorted(i for i in ids if keep is None or keep(i))
    if whole and not ids:
        return {}
    out = {}
    for s in seeds:
        if s not in whole:  # the rule's score of a failed run against the other's held-out pass@1
            out[s] = a[s]["heldout_pass1"] - b[s]["heldout_pass1"]
            continue
        pa, pb = a[s]["per_problem"], b[s]["per_problem"]
        levels: dict[str, list[float]] = {}
        for uid in ids:
            levels.setdefault(level(uid), []).append(pa[uid] - pb[uid])
        out[s] = sum(sum(v) / len(v) for v in levels.values()) / len(levels)
    return out


def paired(
    results: list[dict], method: str, base: str, level: Callable[[str], str], keep: Callable[[str], bool] | None = None
) -> dict | None:
    """``method`` - ``base`` paired by seed (:func:`per_seed_diffs`): mean, sd, 95 % t interval over
    the seeds, exact sign-flip p, and the between-arm correlation of the seeds' held-out accuracies
    (common random numbers make it positive; None with ``keep``, which restricts the problems); None
    for a method against itself or below two common seeds."""
    d = per_seed_diffs(results, method, base, level, keep)
    if method == base or len(d) < 2:
        return None
    per_seed = list(d.values())
    mean, sd, lo, hi = stats.t_interval(per_seed)
    acc = {(r["method"], r["seed"]): r["heldout_pass1"] for r in results}
    r = stats.pearson([acc[method, s] for s in d], [acc[base, s] for s in d]) if keep is None else {"r": None}
    return {
        "seeds": len(per_seed),
        "diff": mean,
        "sd": sd,
        "ci95": [lo, hi],
        "halfwidth": (hi - lo) / 2,
        "p_sign_flip": stats.sign_flip_p(per_seed),
        "seed_list": list(d),
        "per_seed": per_seed,
        "correlation": r["r"],
    }


def pooled_compare(acc: dict[tuple[str, str, int], float], method: str, base: str) -> dict | None:
    """``method`` - ``base`` over every (pass, seed) draw both hold in ``acc`` (keyed (pass, method,
    seed)), paired within a draw: mean, sd, 95 % t interval over the draws and the exact sign-flip
    p-value; None below two draws."""
    d = [acc[k] - acc[k[0], base, k[2]] for k in sorted(acc) if k[1] == method and (k[0], base, k[2]) in acc]
    if method == base or len(d) < 2:
        return None
    mean, sd, lo, hi = stats.t_interval(d)
    return {"pairs": len(d), "diff": mean, "sd": sd, "ci95": [lo, hi], "p_sign_flip": stats.sign_flip_p(d)}


# ── the decision rule and its power ──

ALPHA = 0.05  # the family-wise error rate of the primary comparisons (Holm)
MARGIN = 0.05  # the default "no difference larger than" margin (a study sets its own: GPURemediesStudy.margin)
POWER = 0.8  # the power at which the minimum detectable effect is stated


def seeds_for_halfwidth(sd: float, halfwidth: float, max_n: int = 1000) -> int | None:
    """The fewest seeds n whose 95 % t interval of a mean difference with standard deviation ``sd``
    has a half-width of at most ``halfwidth`` (t quantile with n - 1 degrees of freedom); None past
    ``max_n``."""
    for n in range(2, max_n + 1):
        if stats.t_quantile(0.975, n - 1) * sd / math.sqrt(n) <= halfwidth:
            return n
    return None


def detectable_effect(sd: float, n: int, family: int = 1, power: float = POWER, alpha: float = ALPHA) -> float | None:
    """The smallest true mean difference the decision rule (:func:`rule`) declares with probability
    ``power`` over ``n`` seeds at a per-seed sd of ``sd``, when it is the one real effect of a Holm
    family of ``family`` comparisons: Holm's first step tests it at alpha / family, and the interval
    the rule reads is at the same level (a two-sided paired t, statsmodels' noncentral t; the rule's
    exact sign-flip p behaves alike on near-normal differences: :func:`simulate_rule` checks it)."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not sd > 0:
        return None
    d = TTestPower().solve_power(nobs=n, alpha=alpha / family, power=power, alternative="two-sided")
    return float(d) * sd


def power_at(effect: float, sd: float, n: int, family: int = 1, alpha: float = ALPHA) -> float | None:
    """The probability that the rule declares a true ``effect`` (the one real effect of a family of
    ``family``: tested at alpha / family, see :func:`detectable_effect`)."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not sd > 0:
        return None
    return float(TTestPower().power(effect_size=effect / sd, nobs=n, alpha=alpha / family, alternative="two-sided"))


def seeds_for_effect(
    sd: float, effect: float, family: int, power: float = POWER, floor: int = 24, max_n: int = 1000
) -> int | None:
    """The fewest seeds, at least ``floor``, at which the rule detects a true ``effect`` with
    probability ``power`` (:func:`detectable_effect` at most ``effect``); None past ``max_n``."""
    for n in range(max(2, floor), max_n + 1):
        if detectable_effect(sd, n, family, power) <= effect:
            return n
    return None


def fewest_seeds(family: int, alpha: float = ALPHA) -> int:
    """The fewest seeds at which the rule (:func:`rule`) can declare a difference at all: the exact
    sign-flip p of n seeds is at least 2 / 2^n (every seed of one sign), and Holm needs the smallest
    p of a family of ``family`` below alpha / family. Below it a plan can only end "inconclusive", or
    "no difference" read off a t interval of one or two degrees of freedom: no verdict is given."""
    n = 2
    while 2.0 ** (1 - n) >= alpha / family:
        n += 1
    return n


def holm_levels(p: dict[str, float], alpha: float = ALPHA) -> dict[str, float]:
    """The confidence level of the interval beside each comparison's Holm verdict: the comparison of
    rank j (ascending p) is tested at alpha / (m - j + 1), so its interval is at 1 - alpha / (m - j + 1)
    (the largest p's at 1 - alpha); tied p's, which Holm adjusts alike, at their first rank's level."""
    ranked = sorted(p, key=lambda a: p[a])
    first = {}  # tied p's share one adjusted p, so one level: that of the block's first rank
    for j, a in enumerate(ranked):
        first.setdefault(p[a], j)
    return {a: 1 - alpha / (len(p) - first[p[a]]) for a in ranked}


def rule(per_seed: dict[str, list[float] | None], margin: float, alpha: float = ALPHA) -> dict[str, dict]:
    """The decision rule, fixed before the runs, on each primary comparison's per-seed paired
    differences (None: no runs, p = 1). For each: the exact sign-flip p, Holm's adjusted p over the
    whole family, the t interval at its Holm level (:func:`holm_levels`), and the verdict:
    ``better``/``worse`` when the adjusted p is below ``alpha`` and the interval excludes 0;
    ``equivalent`` (no difference larger than ``margin``) when the interval lies inside +-margin;
    ``identical`` when every seed's difference is exactly 0 (the remedy never changed a run: no
    evidence about the remedy, not equivalence); ``inconclusive`` otherwise."""
    p = {a: (stats.sign_flip_p(d) if d and len(d) >= 2 else 1.0) for a, d in per_seed.items()}
    adjusted, levels = holm(p), holm_levels(p, alpha)
    out = {}
    for a, d in per_seed.items():
        ci = list(stats.t_interval(d, levels[a])[2:]) if d and len(d) >= 2 else None
        if ci is None:
            verdict = "inconclusive"
        elif not any(d):  # every seed's difference exactly 0: the two arms trained alike (a gate never opened)
            verdict = "identical"
        elif (ci[0] > 0 or ci[1] < 0) and adjusted[a] < alpha:
            verdict = "better" if ci[0] > 0 else "worse"
        elif -margin < ci[0] and ci[1] < margin:
            verdict = "equivalent"
        else:
            verdict = "inconclusive"
        out[a] = {"p": p[a], "holm": adjusted[a], "level": levels[a], "ci": ci, "verdict": verdict}
    return out


def equivalence_chance(
    sd: float, n: int, family: int, margin: float, effect: float = 0.0, reps: int = 20_000, seed: int = 0
) -> float:
    """The chance that the rule says "no difference larger than ``margin``" of a comparison whose true
    difference is ``effect`` (the others of the family at 0): its interval at its Holm level lies
    inside +-margin. Vectorized over ``reps`` simulated studies; the comparisons are ranked by their
    |t| where the rule ranks them by the exact sign-flip p (which orders near-normal differences
    alike), so that a 37-seed study is simulated in a second (:func:`simulate_rule` runs the rule)."""
    import numpy as np
    from scipy.stats import t as student_t

    rng = np.random.default_rng(seed)
    d = rng.normal(0.0, sd, size=(reps, family, n))
    d[:, 0] += effect
    mean, se = d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n)
    rank = np.argsort(np.argsort(-np.abs(mean / se), axis=1), axis=1)  # 0: the largest |t|, tested first
    half = student_t.ppf(1 - ALPHA / (family - rank) / 2, n - 1) * se
    inside = (mean - half > -margin) & (mean + half < margin)
    return float(inside[:, 0].mean())


def simulate_rule(
    effect: float, sd: float, n: int, family: int, margin: float, reps: int = 1000, seed: int = 0
) -> dict[str, float]:
    """The rule (:func:`rule`) applied to ``reps`` simulated studies: the first comparison's per-seed
    differences drawn from N(effect, sd), the other ``family - 1`` from N(0, sd). Returns the share of
    studies whose verdict on the first is each verdict (``better`` is the power at ``effect`` > 0,
    ``equivalent`` at ``effect`` = 0 the chance to say "no difference larger than margin")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = {"better": 0, "worse": 0, "equivalent": 0, "identical": 0, "inconclusive": 0}
    for _ in range(reps):
        draws = rng.normal(0.0, sd, size=(family, n))
        draws[0] += effect
        counts[rule({f"arm{i}": list(draws[i]) for i in range(family)}, margin)["arm0"]["verdict"]] += 1
    return {k: v / reps for k, v in counts.items()}


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of comparisons (name -> p): the j-th smallest p times
    m - j + 1, made monotone and capped at 1 (statsmodels' ``multipletests(method="holm")``, which
    runs a full garbage collection on every call: 0.3 s, too slow to simulate the rule)."""
    ranked = sorted(p, key=lambda a: p[a])
    out, running = {}, 0.0
    for j, a in enumerate(ranked):
        running = max(running, min(1.0, (len(p) - j) * p[a]))
        out[a] = running
    return {a: out[a] for a in p}


def probability_of_improvement(x, y, seed: int = 0, n_boot: int = 2000) -> dict | None:
    """P(X > Y) of Agarwal et al. (2021): per level, the Mann-Whitney U of the runs' accuracies over
    n_x n_y (scipy.stats.mannwhitneyu), averaged over the levels; with a 95 % percentile interval
    from a bootstrap that resamples each arm's runs (scipy.stats.bootstrap). ``x``, ``y``: ``[runs,
    levels]``. rliable computes the same; its last release (1.2.0) fails with pandas 3 and arch 8
    (its StratifiedBootstrap passes ``random_state=None`` that arch 8 refuses), so scipy does it here."""
    import numpy as np
    from scipy.stats import bootstrap, mannwhitneyu

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape[0] < 2 or y.shape[0] < 2:
        return None

    def poi(a, b):
        return float(
            np.mean(
                [
                    0.5
                    if np.array_equal(a[:, j], b[:, j])
                    else mannwhitneyu(a[:, j], b[:, j], alternative="greater").statistic / (len(a) * len(b))
                    for j in range(a.shape[1])
                ]
            )
        )

    est = poi(x, y)
    # resample run indices; the statistic reads each arm's rows at them (vectorized=False: one per resample)
    res = bootstrap(
        (np.arange(len(x)), np.arange(len(y))),
        lambda i, j: poi(x[i.astype(int)], y[j.astype(int)]),
        vectorized=False,
        paired=False,
        n_resamples=n_boot,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return {"poi": est, "ci95": [float(res.confidence_interval.low), float(res.confidence_interval.high)]}
