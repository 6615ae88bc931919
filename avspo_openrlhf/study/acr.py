"""Does early collapse predict final accuracy on our runs? The paper reports early raw ACR (its
first 100 steps) against final accuracy at r = -0.785 (R² = 0.617) over 245 Qwen2.5 runs; this
computes the same relation over a study's runs, within each method and pooled, with Pearson's r,
its 95 % Fisher-z interval and the run counts (``avspo_openrlhf.stats.pearson``)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from avspo_openrlhf import stats

EARLY_STEPS = 10
# name: what it averages. A run without a per-step curve (a study that kept only the whole-run mean)
# enters a window only where that mean is the window's, i.e. the run is no longer than the window.
WINDOWS = {
    f"first_{EARLY_STEPS}_steps": f"raw ACR averaged over the first {EARLY_STEPS} training steps",
    "first_third": "raw ACR averaged over the first third of the run's steps (rounded up)",
    "whole_run": "raw ACR averaged over every training step",
}


def window_acr(run: dict, window: str) -> float | None:
    """A run's raw ACR (trained batches) averaged over ``window``; None where the run does not hold it."""
    steps = run["steps"]
    n = {f"first_{EARLY_STEPS}_steps": EARLY_STEPS, "first_third": math.ceil(steps / 3), "whole_run": steps}[window]
    curve = run.get("curve")
    if curve:
        return statistics.mean(c["acr"] for c in curve[:n])
    return run["acr_raw"] if n >= steps else None


@dataclass
class Sample:
    """Runs that share a held-out set: ``accuracy`` names each run's final held-out accuracy."""

    name: str
    runs: list[dict]
    accuracy: str

    @classmethod
    def from_published(cls, name: str, published: dict | list) -> Sample:
        """A study's published results.json: ``{"runs": [...]}`` (or the list of runs itself), each
        run's final accuracy ``heldout_pass1``."""
        runs = published["runs"] if isinstance(published, dict) else published
        return cls(name, runs, "heldout_pass1")


def filtered_methods(runs: list[dict]) -> list[str]:
    """Methods whose trained batches held no collapsed group in any run (dynamic sampling drops them
    before training): their trained-batch ACR is 0 by construction and says nothing about the policy."""
    methods = dict.fromkeys(r["method"] for r in runs)
    return [m for m in methods if all(r["acr_raw"] == 0 for r in runs if r["method"] == m)]


def _centred(xs: list[float], groups: list[str]) -> list[float]:
    means = {g: statistics.mean(x for x, h in zip(xs, groups) if h == g) for g in set(groups)}
    return [x - means[g] for x, g in zip(xs, groups)]


def relation(samples: list[Sample]) -> dict:
    """Per sample: Pearson's r of window raw ACR against final accuracy for each method, every
    method pooled, and pooled after centring both within each method (how a run's ACR relates to its
    accuracy beside the other runs of its method, the methods' own levels removed), per window."""
    out = {"early_steps": EARLY_STEPS, "windows": WINDOWS, "samples": []}
    for s in samples:
        skip = filtered_methods(s.runs)
        runs = [r for r in s.runs if r["method"] not in skip and r.get(s.accuracy) is not None]
        methods = list(dict.fromkeys(r["method"] for r in runs))
        groups = []
        if not runs:  # nothing to relate yet (a study still running)
            out["samples"].append({"name": s.name, "accuracy": s.accuracy, "excluded_methods": skip, "groups": []})
            continue
        for label, members, centre in [
            *((m, [r for r in runs if r["method"] == m], False) for m in methods),
            ("pooled", runs, False),
            ("pooled, centred within method", runs, True),
        ]:
            row = {"group": label, "runs": len(members), "steps_mean": statistics.mean(r["steps"] for r in members)}
            for w in WINDOWS:
                held = [(window_acr(r, w), r[s.accuracy], r["method"]) for r in members]
                held = [h for h in held if h[0] is not None]
                x, y, g = [h[0] for h in held], [h[1] for h in held], [h[2] for h in held]
                if centre and held:
                    x, y = _centred(x, g), _centred(y, g)
                row[w] = stats.pearson(x, y, centred_groups=len(set(g)) if centre else 0)
            groups.append(row)
        out["samples"].append({"name": s.name, "accuracy": s.accuracy, "excluded_methods": skip, "groups": groups})
    return out


def _cell(c: dict) -> str:
    if c["n"] == 0:
        return "- (no run holds this window)"
    if c["r"] is None:
        return f"- ({c['n']} runs)"
    ci = f" [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]" if c["ci95"] else " [too few runs for an interval]"
    return f"{c['r']:+.2f}{ci}, R² {c['r2']:.2f}, p={c['p']:.2f} ({c['n']})"


def markdown(rel: dict) -> str:
    """The relation as tables, one per sample (generated: the numbers are ``relation``'s)."""
    lines = [
        "Early raw ACR against final held-out accuracy, our runs (the paper: r = -0.785, R² = 0.617 over 245 "
        "Qwen2.5 runs, early = its first 100 steps). Each cell: Pearson r [95 % interval from Fisher's z], R², "
        "two-sided p of r = 0 (t test), (runs). Windows: "
        + "; ".join(f"{w.replace('_', ' ')}: {d}" for w, d in rel["windows"].items())
        + ". Raw ACR is measured on the trained batches. A run without a per-step curve enters only the windows "
        'its whole-run mean covers. "Pooled, centred within method": both variables minus their method\'s mean, '
        "the interval with one degree of freedom fewer per method beyond the first.",
    ]
    for s in rel["samples"]:
        if not s["groups"]:
            lines += ["", f"**{s['name']}**: no runs yet."]
            continue
        lines += [
            "",
            f"**{s['name']}**"
            + (
                f"; left out, their trained-batch ACR being 0 by construction "
                f"(dynamic sampling): {', '.join(s['excluded_methods'])}"
                if s["excluded_methods"]
                else ""
            )
            + ":",
            "",
            "| runs of | mean steps | " + " | ".join(f"r, {w.replace('_', ' ')}" for w in rel["windows"]) + " |",
            "| --- | --- |" + " --- |" * len(rel["windows"]),
        ]
        for g in s["groups"]:
            lines.append(
                f"| {g['group']} | {g['steps_mean']:.1f} | " + " | ".join(_cell(g[w]) for w in rel["windows"]) + " |"
            )
    return "\n".join(lines) + "\n"
