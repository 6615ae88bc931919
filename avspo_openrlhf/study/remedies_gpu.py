"""Which remedy for advantage collapse? Many seeds per arm at equal generated tokens, many runs at
once on one GPU (or the nodes of a cluster): the study loop (``study/loop.py``) run by the
scheduler (``study/scheduler.py``), compared and reported here.

Every run trains the same model on the same data with the same settings and stops at the same
generated-token budget; arms differ only in their :class:`~avspo_openrlhf.study.loop.Arm`. A
finished run is written to ``<out>/<arm>_seed<k>/result.json`` and, with ``--publish DIR``, to
``DIR/runs/<arm>_seed<k>.json`` with its per-problem records; a run found in either place with the
same settings hash is not run again, so the study resumes later, on another machine, or as a Slurm
array (``launch_scripts/slurm/remedies_study.sbatch``: ``--shard I/N`` gives each task its share of
the runs, all publishing into one folder). Runs of other settings (another budget, model, data,
code of the loop or the remedies) are never paired: collecting them together is refused, naming the
fields that differ. ``--report-only`` rebuilds the tables and the plot from what is published.

The decision rule is code (:meth:`GPURemediesStudy.decide`): a fixed family of the primary
comparisons, each remedy against GRPO, held-out pass@1 at equal generated tokens, paired by seed
(each seed's difference averaged over the held-out problems, each level weighing the same), the 95 %
t interval over seeds, the exact sign-flip p, Holm's adjustment over the whole family (a comparison
without runs counts as p = 1), and no verdict until every primary arm has its planned seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from avspo_openrlhf import stats
from avspo_openrlhf.study import compare, store, tables
from avspo_openrlhf.study.loop import (
    Arm,
    RunSpec,
    StudySettings,
    atomic_write,
    check_loop_arm,
    device_and_dtype,
    settings_difference,
    settings_hash,
)
from avspo_openrlhf.study.scheduler import Job, measure_throughput, run_jobs

ALPHA = 0.05  # the family-wise error rate of the primary comparisons (Holm)
EQUIVALENCE = 0.03  # "no difference larger than 3 points": an interval inside +-3 points that holds 0
POWER = 0.8  # the power at which the minimum detectable effect is stated


class StudyError(ValueError):
    """A study's runs cannot be compared as they are (mixed settings): the message says why."""


# ── statistics ──


def seeds_for_halfwidth(sd: float, halfwidth: float, max_n: int = 1000) -> int | None:
    """The fewest seeds n whose 95 % t interval of a mean difference with standard deviation ``sd``
    has a half-width of at most ``halfwidth`` (t quantile with n - 1 degrees of freedom); None past
    ``max_n``."""
    for n in range(2, max_n + 1):
        if stats.t_quantile(0.975, n - 1) * sd / math.sqrt(n) <= halfwidth:
            return n
    return None


def detectable_effect(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float | None:
    """The smallest true mean difference a two-sided paired t test at ``alpha`` over ``n`` seeds
    detects with probability ``power``, for a per-seed sd of ``sd`` (statsmodels' noncentral t)."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not sd > 0:
        return None
    return float(TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="two-sided")) * sd


def power_at(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float | None:
    """The probability that a paired t test at ``alpha`` over ``n`` seeds detects a true ``effect``."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not sd > 0:
        return None
    return float(TTestPower().power(effect_size=effect / sd, nobs=n, alpha=alpha, alternative="two-sided"))


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of comparisons (name -> p), statsmodels' ``multipletests``."""
    from statsmodels.stats.multitest import multipletests

    if not p:
        return {}
    names = list(p)
    adjusted = multipletests([p[k] for k in names], alpha=ALPHA, method="holm")[1]
    return {k: float(v) for k, v in zip(names, adjusted)}


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


# ── the study ──


def level_of(unique_id: str) -> str:
    """A held-out problem's level, from its id (``heldout/<level>/<k>``)."""
    parts = unique_id.split("/")
    return parts[-2] if len(parts) >= 3 else ""


def paired_t(results: list[dict], method: str, base: str, keep=None) -> dict | None:
    """``method`` - ``base`` paired by seed, each level weighing the same (``compare.paired``, the CPU
    study's comparison too)."""
    return compare.paired(results, method, base, level_of, keep)


def tokens_to_target(r: dict, target: float) -> float:
    """The generated-token milestone of the first mid-run evaluation whose held-out pass@1 reaches
    ``target``; infinity for a run that never reached it within its budget (censored, not dropped)."""
    return next((float(e["milestone"]) for e in r.get("mid_evals", []) if e["pass1"] >= target), math.inf)


def check_pairable(results: list[dict]) -> dict | None:
    """The settings record the runs share, or :class:`StudyError` naming the fields where two groups
    of runs differ (runs without a record come from before the corrected design and are refused)."""
    old = [f"{r['method']} seed {r['seed']}" for r in results if "settings_hash" not in r]
    if old:
        raise StudyError(
            f"{len(old)} runs carry no settings record (made before the corrected design; not "
            f"comparable): {', '.join(old[:5])}{' ...' if len(old) > 5 else ''}"
        )
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(r["settings_hash"], []).append(r)
    if len(groups) > 1:
        (h1, g1), (h2, g2) = sorted(groups.items(), key=lambda kv: -len(kv[1]))[:2]
        diff = settings_difference(g1[0]["settings"], g2[0]["settings"])
        raise StudyError(
            f"runs of different settings cannot be paired: {len(g1)} runs of {h1} (e.g. {g1[0]['method']} "
            f"seed {g1[0]['seed']}) and {len(g2)} of {h2} (e.g. {g2[0]['method']} seed {g2[0]['seed']}) "
            f"differ in {'; '.join(diff) or 'their hash only'}. Publish each into its own folder."
        )
    return results[0]["settings"] if results else None


@dataclass(frozen=True)
class GPURemediesStudy:
    """The study's configuration (fixed before the runs); its methods run and report it."""

    levels: tuple[str, ...]  # synthetic_arithmetic's levels
    train_prompts: int  # the training pool
    heldout_per_level: int  # distinct held-out problems per level at most (a small level has fewer)
    settings: StudySettings  # what every arm shares
    arms: dict[str, Arm]  # name: what it changes
    seeds: dict[str, int]  # seeds planned per arm
    primary: tuple[str, ...]  # the base and the arms of the primary family (run first), each against ``base``
    base: str = "GRPO"
    second_base: str = "DAPO-DS"  # the filtering baseline every remedy is also compared with (exploratory)
    target: float = 0.5  # the held-out pass@1 whose generated tokens to reach are reported
    pilot: dict[str, int] = field(default_factory=dict)  # arms and seeds of the pilot
    validation_per_level: int = 50  # the learning-rate check's validation problems per level at most
    lr_check: dict = field(default_factory=dict)  # {"arms": (...), "lrs": (...), "seeds": n}: on the validation set
    plugins: tuple[str, ...] = ()  # modules a run imports first (a user's remedy as an arm)

    def __post_init__(self):
        names = set(self.seeds) | set(self.primary) | set(self.pilot) | {self.base, self.second_base}
        unknown = (names | set(self.lr_check.get("arms", ()))) - set(self.arms)
        if unknown:
            raise ValueError(f"GPURemediesStudy: arms {sorted(unknown)} are not in arms")
        if self.base not in self.primary:
            raise ValueError(f"GPURemediesStudy: the base {self.base!r} must be one of the primary arms")
        for name, arm in self.arms.items():
            try:
                check_loop_arm(arm)  # when the study is built, not when its first run starts
            except ValueError as e:
                raise ValueError(f"GPURemediesStudy arm {name!r}: {e}") from None

    @property
    def family(self) -> tuple[str, ...]:
        """The primary comparisons' arms (each against the base): the Holm family, fixed."""
        return tuple(a for a in self.primary if a != self.base)

    # ── data and jobs ──

    def make_data(self, out: Path) -> tuple[str, str, str]:
        """The training pool, the held-out set and the validation set, disjoint: held-out and
        validation hold distinct problems that are not training prompts (a level with few distinct
        problems, single-digit sums and products, has fewer), interleaved by level so the first
        ``mid_eval_problems`` hold every level; validation takes a quarter of a small level's pool."""
        from avspo_openrlhf.data.io import write_jsonl
        from avspo_openrlhf.data.tasks import synthetic_arithmetic

        out.mkdir(parents=True, exist_ok=True)
        train = synthetic_arithmetic(self.train_prompts, list(self.levels), seed=0)
        seen = {r["problem"] for r in train}
        pool: dict[str, list[dict]] = {lv: [] for lv in self.levels}
        for r in synthetic_arithmetic(2500 * len(self.levels), list(self.levels), seed=1000):  # a seeded stream
            if r["problem"] not in seen:
                seen.add(r["problem"])
                pool[r["level"]].append(r)
        heldout, validation = {}, {}
        for lv, rows in pool.items():
            n_val = min(self.validation_per_level, len(rows) // 4)
            validation[lv], heldout[lv] = rows[:n_val], rows[n_val : n_val + self.heldout_per_level]

        def interleave(by_level: dict[str, list[dict]], name: str) -> list[dict]:
            rows = []
            for k in range(max(map(len, by_level.values()))):
                rows += [
                    {**by_level[lv][k], "unique_id": f"{name}/{lv}/{k}"} for lv in self.levels if k < len(by_level[lv])
                ]
            return rows

        paths = []
        for name, rows in (
            ("train", train),
            ("heldout", interleave(heldout, "heldout")),
            ("validation", interleave(validation, "validation")),
        ):
            path = out / f"{name}.jsonl"
            write_jsonl(rows, str(path) + ".tmp")
            Path(str(path) + ".tmp").replace(path)  # a study beside a --report-only reads whole files
            paths.append(str(path))
        return paths[0], paths[1], paths[2]

    def order(self, arms: list[str], seeds: list[int] | None, pilot: bool = False) -> list[tuple[str, int]]:
        """The runs in the order they start (``store.seed_major``): the pilot's, or the primary arms
        seed by seed up to their planned seeds, then the other arms the same way."""
        wanted = self.pilot if pilot else self.seeds
        arms = [a for a in arms if a in wanted]
        groups = [[a for a in arms if a in self.primary], [a for a in arms if a not in self.primary]]
        return store.seed_major(groups, wanted, seeds)

    def lr_arms(self) -> dict[str, Arm]:
        """The learning-rate check's arms: each checked arm at each learning rate of the grid."""
        c = self.lr_check
        return {f"{a}@lr={lr:g}": replace(self.arms[a], lr=lr) for a in c.get("arms", ()) for lr in c.get("lrs", ())}

    def spec(
        self,
        arm: str,
        seed: int,
        model: str,
        data: tuple[str, ...],
        settings: StudySettings | None = None,
        arms: dict[str, Arm] | None = None,
        heldout: str | None = None,
    ) -> RunSpec:
        return RunSpec(
            method=arm,
            seed=seed,
            arm=(arms or self.arms)[arm],
            settings=settings or self.settings,
            model=model,
            train=data[0],
            heldout=heldout or data[1],
            plugins=self.plugins,
        )

    # ── results ──

    @staticmethod
    def collect(out: Path, published: Path | None) -> list[dict]:
        """Every finished run (``store.collect``: the published ones, then those of ``out``); runs
        of different settings are refused together (:func:`check_pairable`)."""
        results = store.collect(out, published)
        check_pairable(results)
        return results

    @staticmethod
    def failures(out: Path) -> dict[str, list[int]]:
        """Runs that stopped with an error and have no result (they resume when started again), per arm."""
        failed: dict[str, list[int]] = {}
        for d in sorted(out.glob("*_seed*")):
            log = d / "log.txt"
            if not (d / "result.json").exists() and log.exists() and "Traceback" in log.read_text(errors="replace"):
                arm, _, seed = d.name.rpartition("_seed")
                failed.setdefault(arm, []).append(int(seed))
        return failed

    def publish_run(self, r: dict, published: Path) -> None:
        store.publish_run(r, published, r["eval_n"])

    def summary(self, results: list[dict]) -> dict:
        """Per arm: its numbers and its paired comparisons (the report's tables, as data)."""
        out = {}
        base_seeds = {r["seed"] for r in results if r["method"] == self.base}
        for arm in self.arms:
            rs = sorted((r for r in results if r["method"] == arm), key=lambda r: r["seed"])
            if not rs:
                continue
            paired = [r for r in rs if r["seed"] in base_seeds]
            ttt = [tokens_to_target(r, self.target) for r in rs]
            x = [[r["heldout_by_level"].get(lv, math.nan) for lv in self.levels] for r in paired]
            y = [
                [r["heldout_by_level"].get(lv, math.nan) for lv in self.levels]
                for r in sorted(results, key=lambda r: r["seed"])
                if r["method"] == self.base
            ]
            out[arm] = {
                "seeds": len(rs),
                "seeds_planned": self.seeds.get(arm, 0),
                "heldout_pass1": [r["heldout_pass1"] for r in rs],
                "heldout_pass1_paired": [r["heldout_pass1"] for r in paired],
                "vs_" + self.base: paired_t(results, arm, self.base),
                "vs_" + self.second_base: paired_t(results, arm, self.second_base),
                "by_level_vs_" + self.base: {
                    lv: paired_t(results, arm, self.base, lambda k, lv=lv: level_of(k) == lv) for lv in self.levels
                },
                "poi_vs_" + self.base: probability_of_improvement(x, y) if arm != self.base else None,
                "steps": [r["steps"] for r in rs],
                "generated_tokens": [r["generated_tokens"] for r in rs],
                "tokens_to_target": {"reached": sum(math.isfinite(t) for t in ttt), "median": statistics.median(ttt)},
                "signal_groups_per_mtok": [r["signal_groups_per_mtok"] for r in rs],
                "acr_generated": [r["acr_generated"] for r in rs],
                "acr_effective": [r["acr_effective"] for r in rs],
                "truncation_rate": [r["truncation_rate"] for r in rs],
                "completion_tokens_mean": [r["completion_tokens_mean"] for r in rs],
                "train_min": [r["train_s"] / 60 for r in rs],
                "flagged_seeds": [r["seed"] for r in rs if r["flagged"]],
                "skipped_step_seeds": {r["seed"]: len(r["nonfinite_steps"]) for r in rs if r["nonfinite_steps"]},
            }
        return out

    def decide(self, summary: dict) -> dict:
        """The decision rule, fixed before the runs: Holm over the whole primary family (a missing
        comparison counts as p = 1); a remedy differs from the base when its interval excludes 0 and
        its adjusted p is below ALPHA; "no difference larger than 3 points" when its interval lies
        inside +-3 points and holds 0; no verdict at all until every primary arm has its planned seeds."""
        key = "vs_" + self.base
        comps = {a: summary.get(a, {}).get(key) for a in self.family}
        adjusted = holm({a: (c["p_sign_flip"] if c else 1.0) for a, c in comps.items()})
        missing = {a: max(0, self.seeds.get(a, 0) - (summary.get(a, {}).get("seeds", 0))) for a in self.primary}
        complete = not any(missing.values())
        verdicts = {}
        for a, c in comps.items():
            if not complete or c is None:
                verdicts[a] = "no verdict yet"
            elif (c["ci95"][0] > 0 or c["ci95"][1] < 0) and adjusted[a] < ALPHA:
                verdicts[a] = "better than " + self.base if c["diff"] > 0 else "worse than " + self.base
            elif -EQUIVALENCE < c["ci95"][0] <= 0 <= c["ci95"][1] < EQUIVALENCE:
                verdicts[a] = f"no difference larger than {100 * EQUIVALENCE:.0f} points"
            else:
                verdicts[a] = "inconclusive"
        return {"complete": complete, "missing": missing, "holm": adjusted, "verdicts": verdicts}

    def power_lines(self, summary: dict) -> list[str]:
        """From each primary comparison's measured sd: the half-width now, the seeds a 3-point
        half-width needs, and at the planned seeds the minimum detectable effect (80 % power) and the
        power to detect 3 and 5 points."""
        rows = []
        for arm in self.family:
            c = summary.get(arm, {}).get("vs_" + self.base)
            if c is None:
                continue
            n = self.seeds.get(arm, 0)
            mde, p3, p5 = detectable_effect(c["sd"], n), power_at(0.03, c["sd"], n), power_at(0.05, c["sd"], n)
            rows.append(
                f"| {arm} | {c['seeds']} | {100 * c['sd']:.1f} | {100 * c['halfwidth']:.1f} | "
                f"{seeds_for_halfwidth(c['sd'], 0.03) or '> 1000'} | {n} | "
                f"{'-' if mde is None else f'{100 * mde:.1f}'} | {'-' if p3 is None else f'{100 * p3:.0f} %'} | "
                f"{'-' if p5 is None else f'{100 * p5:.0f} %'} |"
            )
        if not rows:
            return []
        return [
            "",
            f"Power, from the measured sd of the per-seed paired differences against {self.base} (points): "
            f"the 95 % half-width now, the seeds a half-width of 3 points needs, and at the planned seeds the "
            f"minimum detectable effect (two-sided paired t, alpha {ALPHA}, {100 * POWER:.0f} % power) and the "
            f"power to detect a true difference of 3 and of 5 points:",
            "",
            "| arm | seeds | sd | half-width now | seeds for ≤ 3 | seeds planned | detectable effect | "
            "power at 3 | power at 5 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
        ]

    def header(self, results: list[dict], record: dict | None) -> str:
        """What the runs ran, read from their own records (not from this configuration)."""
        devices = tables.cpu_line([{"cpu": r["device"]} for r in results])
        if record is None:
            s = self.settings
            return (
                f"No run has finished yet. The configuration: G={s.group_size}, {s.prompts_per_step} prompts/step, "
                f"T={s.temperature}, lr {s.lr:g}, {s.token_budget:,} generated tokens a run."
            )
        s = record["settings"]
        commits = sorted({r.get("commit", "unknown")[:10] for r in results})
        return (
            f"Model {record['model']} (content hash), training pool {record['train']}, held-out set "
            f"{record['heldout']} (distinct problems, none a training prompt; each level weighs the same); "
            f"G={s['group_size']}, {s['prompts_per_step']} prompts/step, T={s['temperature']} (log-probs at the "
            f"same T), {s['max_new_tokens']} new tokens, lr {s['lr']:g}, one AdamW step per batch; every run "
            f"stops at the step where its generated tokens reach {s['token_budget']:,}. Held-out: n={s['eval_n']} "
            f"at T={s['eval_temperature']}; mid-run evaluations every {s['mid_eval_tokens']:,} generated tokens "
            f"on the first {s['mid_eval_problems']} held-out problems (n=2). Compute precision "
            f"{record['precision']}; loop and remedies code {record['code']}; commits {', '.join(commits)}. "
            f"StudySettings hash {results[0]['settings_hash']}. Device: {devices}. {tables.SD_NOTE}. Differences are "
            f"paired (same seed, same problems, common random numbers): mean [95 % t interval over seeds], "
            f"p = exact sign-flip over seeds (seeds)."
        )

    def report(
        self,
        results: list[dict],
        out: Path,
        failed: dict[str, list[int]] | None = None,
        lr_results: list[dict] | None = None,
    ) -> str:
        """``results.md``, ``results.json`` (the summary, no per-problem records) and the plot in ``out``."""
        record = check_pairable(results)
        summary = self.summary(results)
        decision = self.decide(summary)
        failed = failed or {}
        lines = [self.header(results, record), ""]
        if not decision["complete"]:
            lines += [
                "**Incomplete: no verdict yet.** Primary runs missing: "
                + ", ".join(f"{a} {m} of {self.seeds.get(a, 0)}" for a, m in decision["missing"].items())
                + ". Every number below is provisional.",
                "",
            ]
        others = ", ".join(
            f"{a} {max(0, n - summary.get(a, {}).get('seeds', 0))} of {n}"
            for a, n in self.seeds.items()
            if a not in self.primary
        )
        lines.append(f"Other runs missing: {others or 'none'}.")
        if not results:
            return self._write(out, "\n".join(lines) + "\n", summary, decision, results)
        b = self.base
        lines += [
            "",
            f"The primary comparisons, each remedy against {b} (Holm over the {len(self.family)} of them, "
            "fixed before the runs; a comparison without runs counts as p = 1):",
            "",
            f"| arm | seeds (planned) | held-out pass@1 (%) | vs {b} (points) | Holm p | P(better than {b}) "
            f"[95 %] | between-arm r | verdict |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm in self.primary:
            a = summary.get(arm)
            if a is None:
                lines.append(f"| {arm} | 0 ({self.seeds.get(arm, 0)}) | - | - | - | - | - | no runs |")
                continue
            c, poi = a["vs_" + b], a["poi_vs_" + b]
            poi_s = "-" if poi is None else f"{poi['poi']:.2f} [{poi['ci95'][0]:.2f}, {poi['ci95'][1]:.2f}]"
            r = "-" if c is None or c["correlation"] is None else f"{c['correlation']:+.2f}"
            lines.append(
                f"| {arm} | {a['seeds']} ({a['seeds_planned']}) | {tables.mean_sd(a['heldout_pass1_paired'], 100)} | "
                f"{tables.fmt_t(c)} | {tables.fmt_p(decision['holm'].get(arm)) if arm != b else '-'} | {poi_s} | {r} | "
                f"{decision['verdicts'].get(arm, '-')} |"
            )
        lines += [
            "",
            f"Exploratory (no adjustment, no verdict): the other arms against {b}, and every arm against "
            f"{self.second_base}:",
            "",
            f"| arm | seeds (planned) | held-out pass@1 (%) | vs {b} (points) | vs {self.second_base} (points) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for arm, a in summary.items():
            lines.append(
                f"| {arm} | {a['seeds']} ({a['seeds_planned']}) | {tables.mean_sd(a['heldout_pass1'], 100)} | "
                f"{tables.fmt_t(a['vs_' + b]) if arm not in self.primary else 'above'} | "
                f"{tables.fmt_t(a['vs_' + self.second_base])} |"
            )
        budget = record["settings"]["token_budget"]
        lines += [
            "",
            f"What each arm spent and trained on. Tokens to reach {100 * self.target:.0f} % on the mid-run "
            f"held-out subset: the median over every seed, a seed that never reached it counting as beyond the "
            f"budget (reached/seeds). Collapse over every generated group (DAPO-DS's and GRESO's dropped ones "
            f"too); groups with a non-zero advantage (token advantages count) per million generated tokens:",
            "",
            "| arm | steps | generated tokens | tokens to target | non-zero-advantage groups per M tokens | "
            "ACR, generated groups | effective ACR | truncated (%) | completion tokens | train (min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm, a in summary.items():
            t = a["tokens_to_target"]
            med = f"{t['median']:,.0f}" if math.isfinite(t["median"]) else f"> {budget:,}"
            lines.append(
                f"| {arm} | {tables.mean_sd(a['steps'], 1, '{:.1f}')} | "
                f"{tables.mean_sd(a['generated_tokens'], 1, '{:,.0f}')} | {med} ({t['reached']}/{a['seeds']}) | "
                f"{tables.mean_sd(a['signal_groups_per_mtok'], 1, '{:,.0f}')} | "
                f"{tables.mean_sd(a['acr_generated'], 1, '{:.2f}')} | {tables.mean_sd(a['acr_effective'], 1, '{:.2f}')} | "
                f"{tables.mean_sd(a['truncation_rate'], 100)} | {tables.mean_sd(a['completion_tokens_mean'], 1)} | "
                f"{tables.mean_sd(a['train_min'], 1, '{:.1f}')} |"
            )
        lines += tables.level_table(
            {arm: [a["by_level_vs_" + b][lv] for lv in self.levels] for arm, a in summary.items()},
            self.levels,
            f"Per level against {b}, exploratory (points; mean [95 % t interval over seeds], p = exact sign-flip "
            "(seeds)):",
            label="arm",
        )
        lines += self.power_lines(summary)
        lines += [
            "",
            "Seeds that lost steps or failed, per arm (never dropped: a run with more than "
            "1 % of its steps skipped for a non-finite gradient is flagged; a failed run resumes when started again):",
            "",
        ]
        health = []
        for arm, a in summary.items():
            if a["skipped_step_seeds"] or a["flagged_seeds"] or failed.get(arm):
                health.append(
                    f"- {arm}: steps skipped {a['skipped_step_seeds'] or 'none'}; flagged seeds "
                    f"{a['flagged_seeds'] or 'none'}; failed seeds {failed.get(arm) or 'none'}"
                )
        lines += health or ["- none: every run finished with every step updated."]
        if lr_results:
            lines += ["", *self.lr_lines(lr_results)]
        lines += tables.per_seed_table(results, list(summary))
        lines.append(f"\nRuns resumed after a kill: {sum(bool(r.get('resumed')) for r in results)}.")
        text = "\n".join(lines) + "\n"
        self._write(out, text, summary, decision, results)
        self.plot(results, out / "accuracy_vs_tokens.png")
        return text

    def lr_lines(self, lr_results: list[dict]) -> list[str]:
        """The learning-rate check: each checked arm's validation pass@1 per learning rate."""
        by: dict[str, list[float]] = {}
        for r in lr_results:
            by.setdefault(r["method"], []).append(r["heldout_pass1"])
        rows = [f"| {m} | {len(v)} | {tables.mean_sd(v, 100)} |" for m, v in sorted(by.items())]
        return [
            f"Learning-rate check (validation problems, not the held-out set; the study keeps lr "
            f"{self.settings.lr:g} for every arm, this says whether {', '.join(self.lr_check.get('arms', ()))} "
            "would do better at another):",
            "",
            "| arm at lr | seeds | validation pass@1 (%) |",
            "| --- | --- | --- |",
            *rows,
        ]

    def _write(self, out: Path, text: str, summary: dict, decision: dict, results: list[dict]) -> str:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "results.md", text)
        budget = results[0]["settings"]["settings"]["token_budget"] if results else self.settings.token_budget
        atomic_write(
            out / "results.json",
            json.dumps({"budget_tokens": budget, "decision": decision, "summary": summary}, indent=1, default=str),
        )
        return text

    def plot(self, results: list[dict], path: Path) -> None:
        """Mid-run held-out pass@1 at the generated-token milestones (mean ± sd over seeds) and the
        final held-out pass@1 per seed: two panels, legible at a page's width."""
        try:
            import matplotlib
        except ImportError:  # a bare GPU machine: the tables are written, the plot is made where the report is rebuilt
            print("[study] matplotlib is not installed: no plot (--report-only elsewhere makes it)", flush=True)
            return
        import numpy as np

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        arms = [a for a in self.arms if any(r["method"] == a and r.get("mid_evals") for r in results)]
        if not arms:
            return
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
        for i, arm in enumerate(arms):
            rs = [r for r in results if r["method"] == arm and r.get("mid_evals")]
            grid = sorted({e["milestone"] for r in rs for e in r["mid_evals"]})
            ys = np.array(
                [
                    [next((100 * e["pass1"] for e in r["mid_evals"] if e["milestone"] == m), np.nan) for m in grid]
                    for r in rs
                ]
            )
            mean = np.nanmean(ys, 0)
            ax0.plot(grid, mean, color=f"C{i}", marker=".", label=f"{arm} ({len(rs)})")
            if len(rs) > 1:
                sd = np.nanstd(ys, 0, ddof=1)
                ax0.fill_between(grid, mean - sd, mean + sd, color=f"C{i}", alpha=0.12, lw=0)
            final = [100 * r["heldout_pass1"] for r in rs]
            ax1.bar(i, statistics.mean(final), color=f"C{i}", alpha=0.6)
            ax1.scatter([i] * len(final), final, color="k", s=8, zorder=3)
        ax0.set(
            xlabel="generated tokens (evaluation milestones)",
            ylabel="held-out pass@1 (%), mid-run subset",
            title="accuracy against generated tokens (mean ± sd over seeds)",
        )
        ax0.legend(fontsize=8, title="arm (seeds)", title_fontsize=8)
        ax1.set_xticks(range(len(arms)), arms, rotation=35, ha="right", fontsize=8)
        ax1.set(ylabel="held-out pass@1 (%)", title="final held-out (dots: seeds)")
        for ax in (ax0, ax1):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    # ── the command ──

    def parser(self) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
        p.add_argument(
            "--out", default="runs/remedies_gpu", help="run folder: one sub-folder per run (rerun to resume)"
        )
        p.add_argument(
            "--publish",
            help="folder that receives every finished run (runs/<arm>_seed<k>.json, with its "
            "per-problem records) and the report; runs found there are not run again",
        )
        p.add_argument(
            "--arms",
            nargs="+",
            default=list(self.arms),
            choices=list(self.arms),
            help="arms to run (default: all; the primary ones start first)",
        )
        p.add_argument(
            "--seeds",
            type=int,
            nargs="+",
            help="seeds to run for every chosen arm (default: each arm's planned seeds from the study's configuration)",
        )
        p.add_argument("--pilot", action="store_true", help="run the pilot's arms and seeds only")
        p.add_argument(
            "--lr-check",
            action="store_true",
            help="run the learning-rate check instead (its arms at "
            "each learning rate of its grid, scored on the validation problems; published under "
            "<publish>/lr_check)",
        )
        p.add_argument(
            "--k",
            type=int,
            default=1,
            help="runs at once on this device (separate processes, or one stacked batch with --engine stacked)",
        )
        p.add_argument(
            "--engine",
            choices=["process", "stacked"],
            default="stacked",
            help="stacked: K runs in one process, their weights stacked (study/engine.py; measured "
            "against the other in experiments/remedies_gpu/README.md); process: one process per run, its own transformers model. Runs "
            "of the two engines never pair (each samples with its own random numbers): a study keeps one",
        )
        p.add_argument("--threads", type=int, help="CPU threads per run (default: the cores / K)")
        p.add_argument(
            "--start-runs-for",
            type=float,
            metavar="MIN",
            help="start no run after this many minutes "
            "(the runs in flight finish): fits a study into a job's time limit",
        )
        p.add_argument(
            "--shard",
            default="0/1",
            metavar="I/N",
            help="run only every N-th run from the I-th (a Slurm "
            "array task: $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)",
        )
        p.add_argument(
            "--ckpt-every",
            type=int,
            metavar="STEPS",
            help="steps between a run's checkpoints (default: the study's; 0: none, for a call whose runs "
            "all finish within it). Not part of the settings hash: runs pair whatever it was",
        )
        p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
        p.add_argument("--train", help="a jsonl of training problems (problem, answer) instead of the study's pool")
        p.add_argument("--heldout", help="a jsonl of held-out problems instead of the study's set")
        p.add_argument("--reward", help="the task's verifier: arith | math | module:function (default: the study's)")
        p.add_argument(
            "--budget",
            type=int,
            help="generated tokens per run (default: the study's); runs of another "
            "budget never pair with these: publish them into another folder",
        )
        p.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs only")
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="list the runs this call would start and check their specs, model and data paths; train nothing",
        )
        p.add_argument(
            "--throughput",
            metavar="K,K,...",
            help="measure aggregate generated tokens/s and runs/hour "
            "for each K (training-only runs of --throughput-budget tokens; K = 1 is always measured, the "
            "baseline) instead of running the study",
        )
        p.add_argument("--throughput-budget", type=int, default=8000, help="generated tokens per throughput run")
        return p

    def main(self, argv: list[str] | None = None) -> int:
        p = self.parser()
        args = p.parse_args(argv)
        try:
            i, n = (int(x) for x in args.shard.split("/"))
            if not 0 <= i < n:
                raise ValueError
        except ValueError:
            p.error(f"--shard: I/N with 0 <= I < N, got {args.shard!r}")
        if args.k < 1:
            p.error(f"--k must be >= 1, got {args.k}")
        out = Path(args.out)
        published = Path(args.publish) if args.publish else None
        if args.lr_check:
            if not self.lr_check:
                p.error("--lr-check: this study has no learning-rate check")
            out, published = out / "lr_check", (published / "lr_check" if published else None)
        try:
            settings = replace(
                self.settings,
                engine=args.engine,
                **{
                    k: v
                    for k, v in (
                        ("token_budget", args.budget),
                        ("reward", args.reward),
                        ("ckpt_every", args.ckpt_every),
                    )
                    if v is not None
                },
            )
        except ValueError as e:
            p.error(str(e))
        for flag, path in (("--train", args.train), ("--heldout", args.heldout)):
            if path and not Path(path).is_file():
                p.error(f"--{flag[2:]}: no such file: {path}")
        try:
            if args.report_only:
                return self._report_only(args, out, published)
            return self._run(args, p, out, published, settings, (i, n))
        except StudyError as e:
            print(f"[study] {e}", file=sys.stderr, flush=True)
            return 2

    def _report_only(self, args, out: Path, published: Path | None) -> int:
        print(self._rebuild(args, out, published), flush=True)
        return 0

    def _rebuild(self, args, out: Path, published: Path | None) -> str:
        """The report of what is finished: the study's (with the learning-rate check beside it), or
        the check's own page with ``--lr-check``."""
        if args.lr_check:  # validation pass@1 per arm and learning rate
            text = "\n".join(self.lr_lines(self.collect(out, published))) + "\n"
            (published or out).mkdir(parents=True, exist_ok=True)
            atomic_write((published or out) / "results.md", text)
            return text
        pub = Path(args.publish) / "lr_check" if args.publish else None
        lr = self.collect(Path(args.out) / "lr_check", pub) if self.lr_check else []
        return self.report(self.collect(out, published), published or out, self.failures(out), lr)

    def _run(self, args, p, out: Path, published: Path | None, settings: StudySettings, shard: tuple[int, int]) -> int:
        model = args.model
        if model not in ("smollm2", "tiny") and not Path(model, "config.json").is_file():
            p.error(f"--model: {model} is not smollm2, tiny or a local HF folder with a config.json")
        made = self.make_data(Path(args.out) / "data")
        data = (args.train or made[0], args.heldout or made[1], made[2])
        if args.throughput:
            ks = sorted({1, *(int(k) for k in args.throughput.split(","))})
            return self.throughput(ks, args, settings, data, out, published)
        arms = self.lr_arms() if args.lr_check else self.arms
        heldout = data[2] if args.lr_check else None  # the check scores on the validation problems
        if args.lr_check:
            order = [(a, s) for s in (args.seeds or range(self.lr_check["seeds"])) for a in arms]
        else:
            order = self.order(args.arms, args.seeds, args.pilot)
        i, n = shard
        if args.dry_run:
            done = {(r["method"], r["seed"]) for r in self.collect(out, published)}
            todo = [(a, s) for a, s in order[i::n] if (a, s) not in done]
            for a, s in todo:
                self.spec(a, s, model, data, settings, arms, heldout)  # every spec builds: the arms' options are valid
            print(
                f"[study] {len(todo)} runs to start (shard {i}/{n}, {len(done)} finished): "
                + ", ".join(f"{a} seed {s}" for a, s in todo),
                flush=True,
            )
            return 0
        if model in ("smollm2", "tiny"):
            from avspo_openrlhf.cpu.models import prepare

            model = prepare(model)
        specs = {(a, s): self.spec(a, s, model, data, settings, arms, heldout) for a, s in order}
        # the hash these runs will record: a published run of other settings is refused, not paired
        _, dtype = device_and_dtype(settings)
        precision = "bf16 autocast" if str(dtype) == "torch.bfloat16" else "fp32"
        first = next(iter(specs.values()), None)
        finished = self.collect(out, published)
        if first is not None and finished:
            record = {**first.settings_record(), "precision": precision}
            if finished[0]["settings_hash"] != settings_hash(record):
                diff = settings_difference(finished[0]["settings"], record)
                raise StudyError(
                    f"{published or out} holds runs of other settings ({'; '.join(diff) or 'hash'}); "
                    "publish these runs into another folder (--publish, --out)"
                )
        done = {(r["method"], r["seed"]) for r in finished}
        # the shard is taken from the whole list, not from what is left: a task started again (a requeue)
        # keeps its runs, so no two tasks ever run the same one
        todo = [(a, s) for a, s in order[i::n] if (a, s) not in done]
        jobs = [Job(specs[a, s], out / f"{a}_seed{s}") for a, s in todo]

        def report() -> str:
            try:
                return self._rebuild(args, out, published)
            except ImportError as e:  # a bare GPU machine without scipy/statsmodels: the runs are published
                return f"[study] no report here ({e}); rebuild it with --report-only where scipy is installed"

        def on_done(job: Job, rc: int) -> None:
            if job.done() and published is not None:
                self.publish_run(job.result(), published)
                report()

        until = time.monotonic() + 60 * args.start_runs_for if args.start_runs_for is not None else None
        failed = run_jobs(jobs, args.k, threads=args.threads, on_done=on_done, start_until=until, engine=args.engine)
        print(report(), flush=True)
        if failed:
            print(f"[study] {len(failed)} runs failed (rerun to resume them): {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0

    def throughput(self, ks: list[int], args, settings: StudySettings, data, out: Path, published: Path | None) -> int:
        """Aggregate throughput for each K on this device: K training-only GRPO runs at once, against
        one run alone (K = 1, always measured)."""
        from avspo_openrlhf.cpu.models import prepare

        model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
        short = replace(
            settings, token_budget=args.throughput_budget, final_eval=False, mid_eval_tokens=0, ckpt_every=0
        )

        def make_jobs(k: int) -> list[Job]:
            folder = out / "throughput" / f"k{k}"
            shutil.rmtree(folder, ignore_errors=True)
            return [Job(self.spec(self.base, s, model, data, short), folder / f"{self.base}_seed{s}") for s in range(k)]

        dest = published or out

        def write(rows: list[dict]) -> None:
            one = next(r for r in rows if r["k"] == 1)["tokens_per_s"]
            lines = [
                f"Device: {rows[0]['device']}; precision {json.dumps(rows[0]['precision'])}; engine "
                f"{settings.engine}; each run GRPO on the study's settings, {args.throughput_budget:,} generated "
                "tokens, no evaluation; × one run = aggregate generated tokens/s over those of one run alone "
                "(K = 1); runs/hour = aggregate generated tokens/s x 3600 / the study's budget "
                f"({settings.token_budget:,}), training only.",
                "",
                "| runs at once (K) | wall (s) | generated tokens/s | × one run | median step (s) | runs/hour |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            lines += [
                f"| {r['k']} | {r['wall_s']:.0f} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / one:.2f} | "
                f"{r['median_step_s']:.2f} | {r['runs_per_hour']:.1f} |"
                for r in rows
            ]
            dest.mkdir(parents=True, exist_ok=True)
            atomic_write(dest / "throughput.md", "\n".join(lines) + "\n")
            atomic_write(dest / "throughput.json", json.dumps(rows, indent=1))

        # K = 1 first (the sorted Ks start with it), so every table written has its "× one run"
        measure_throughput(make_jobs, ks, settings.token_budget, engine=settings.engine, on_row=write)
        print((dest / "throughput.md").read_text(encoding="utf-8"), end="", flush=True)
        return 0
