"""The remedies studies' one paired comparison between two methods, the CPU study's
(``study/remedies.py``) and the GPU study's (``study/remedies_gpu.py``) alike: each run a dict with
``method``, ``seed``, ``heldout_pass1`` and its held-out ``per_problem`` accuracies; the statistics
are ``avspo_openrlhf.stats``'s (scipy's t quantile, the exact sign-flip test)."""

from __future__ import annotations

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
