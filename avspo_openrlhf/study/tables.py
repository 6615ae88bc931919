"""The studies' table cells, with one ± convention: mean ± standard deviation over seeds (n - 1),
stated in the header of every table that uses it (``SD_NOTE``)."""

from __future__ import annotations

import collections
import json
import math
import statistics

SD_NOTE = "± is the standard deviation over seeds"


def mean_sd(xs, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    """``mean ± sd`` of ``xs`` times ``scale``; one value alone (no spread to show), '-' for none."""
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt.format(xs[0] * scale)
    return f"{fmt.format(statistics.mean(xs) * scale)} ± {fmt.format(statistics.stdev(xs) * scale)}"


def mean(xs, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return fmt.format(statistics.mean(xs) * scale) if xs else "-"


def fmt_interval(g) -> str:
    """A difference with its interval, ``(mean, lo, hi)`` as fractions, in points: ``+x.x [+lo, +hi]``."""
    return f"{100 * g[0]:+.1f} [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}]"


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def fmt_t(c: dict | None) -> str:
    """A paired comparison (``compare.paired``) in points: mean [95 % t interval], p = exact sign-flip
    (seeds)."""
    if c is None:
        return "-"
    return f"{fmt_interval((c['diff'], *c['ci95']))}, p {fmt_p(c['p_sign_flip'])} ({c['seeds']})"


def cpu_line(results: list[dict]) -> str:
    """The CPUs the runs ran on, with their run counts: a study resumed on another machine (native
    bf16 or not) says so rather than naming the machine that wrote the report."""
    kinds = collections.Counter(r.get("cpu", "not recorded") for r in results)
    return "; ".join(f"{k} ({n} run{'s' * (n != 1)})" for k, n in sorted(kinds.items()))


def precisions(results: list[dict]) -> list[dict]:
    """The distinct per-stage precisions the runs recorded, each once."""
    return [json.loads(p) for p in sorted({json.dumps(r.get("precision", {}), sort_keys=True) for r in results})]


def precision_lines(results: list[dict]) -> list[str]:
    """One ``Precision: stage value; ...`` line per distinct set of per-stage precisions."""
    return [
        "\nPrecision: " + ("; ".join(f"{k} {v}" for k, v in p.items()) or "not recorded") + "."
        for p in precisions(results)
    ]


def pack_per_problem(per: dict[str, float], n: int) -> dict | dict[str, float]:
    """A run's per-problem accuracies as the repository keeps them: for each common id prefix, one
    digit per problem, its correct samples of ``n`` (1,200 problems in 1.2 kB instead of ~40 kB). Ids
    that are not ``prefix + 0..k-1`` for each prefix, or values that are not k/n, stay a plain dict."""
    groups: dict[str, list[str]] = {}
    for uid in per:
        groups.setdefault(uid.rsplit("/", 1)[0] + "/", []).append(uid)
    packed = {}
    for prefix, ids in groups.items():
        counts = [per.get(f"{prefix}{i}", -1.0) * n for i in range(len(ids))]
        if n > 9 or any(c < 0 or abs(c - round(c)) > 1e-9 for c in counts):
            return dict(per)
        packed[prefix] = "".join(str(round(c)) for c in counts)
    if len(packed) == 1:  # the one-prefix form the earlier studies published
        ((prefix, digits),) = packed.items()
        return {"n": n, "prefix": prefix, "correct": digits}
    return {"n": n, "prefixes": packed}


def unpack_per_problem(packed: dict) -> dict[str, float]:
    if "prefixes" in packed:
        return {
            f"{p}{i}": int(c) / packed["n"] for p, digits in packed["prefixes"].items() for i, c in enumerate(digits)
        }
    if "correct" not in packed:
        return dict(packed)
    return {f"{packed['prefix']}{i}": int(c) / packed["n"] for i, c in enumerate(packed["correct"])}


def per_seed_table(results: list[dict], methods: list[str]) -> list[str]:
    """Held-out pass@1 per seed (%), a column per method: the paired tests' inputs, an empty cell for a
    run not yet done (both remedies studies' reports)."""
    acc = {(r["method"], r["seed"]): r["heldout_pass1"] for r in results}
    lines = [
        "",
        "Held-out pass@1 per seed (%):",
        "",
        "| seed | " + " | ".join(methods) + " |",
        "| --- |" + " --- |" * len(methods),
    ]
    for seed in sorted({r["seed"] for r in results}):
        lines.append(
            f"| {seed} | " + " | ".join(f"{100 * acc[m, seed]:.1f}" if (m, seed) in acc else "" for m in methods) + " |"
        )
    return lines


def level_table(rows: dict[str, list[dict | None]], levels, title: str, label: str = "method") -> list[str]:
    """``compare.paired`` comparisons level by level (``rows``: method -> one per level) under
    ``title``, the first column headed ``label``; nothing when no method has one (both remedies
    studies' reports)."""
    body = [f"| {m} | " + " | ".join(fmt_t(c) for c in cmp) + " |" for m, cmp in rows.items() if any(cmp)]
    if not body:
        return []
    return ["", title, "", f"| {label} | " + " | ".join(levels) + " |", "| --- |" + " --- |" * len(levels), *body]
