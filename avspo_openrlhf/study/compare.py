"""Paired comparisons between two methods over a study's runs (each run a dict with ``method``,
``seed`` and its held-out ``per_problem`` accuracies), with ``avspo_openrlhf.stats``."""

from __future__ import annotations

import numpy as np

from avspo_openrlhf import stats


def paired_diffs(a: list[dict], b: list[dict]) -> np.ndarray:
    """Per-problem differences a - b, one row per seed both hold, over the held-out problems every
    one of those runs holds (runs evaluated on a subset pair with the rest on that subset)."""
    by_seed_b = {r["seed"]: r for r in b}
    pairs = [(r, by_seed_b[r["seed"]]) for r in a if r["seed"] in by_seed_b]
    if not pairs:
        return np.zeros((0, 0))
    ids = sorted(set.intersection(*(set(ra["per_problem"]) & set(rb["per_problem"]) for ra, rb in pairs)))
    return np.array([[ra["per_problem"][i] - rb["per_problem"][i] for i in ids] for ra, rb in pairs])


def paired_bootstrap(a: list[dict], b: list[dict], n_boot: int = 10_000, seed: int = 0) -> tuple[float, ...]:
    """Mean accuracy difference a - b over the seeds both hold, with a 95 % interval and a two-sided
    p-value from a bootstrap that resamples seeds and, within each, held-out problems (paired: the
    same problems and seed for both methods)."""
    return stats.bootstrap_mean(paired_diffs(a, b), np.random.default_rng(seed), n_boot)


def compare(results: list[dict], method: str, base: str) -> dict | None:
    """``method`` - ``base`` paired by seed: mean, bootstrap interval and p, exact sign-flip p over
    the seeds' mean differences; None for a method against itself or without a common seed."""
    a = [r for r in results if r["method"] == method]
    b = [r for r in results if r["method"] == base]
    diffs = [float(x) for x in paired_diffs(a, b).mean(axis=1)] if a and b else []
    if method == base or not diffs:
        return None
    mean, lo, hi, p_boot = paired_bootstrap(a, b)
    return {
        "seeds": len(diffs),
        "diff": mean,
        "ci95": [lo, hi],
        "p_bootstrap": p_boot,
        "p_sign_flip": stats.sign_flip_p(diffs),
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
