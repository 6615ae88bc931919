"""The GPU remedies study's report (``GPURemediesStudy``'s reporting half, mixed into it): the
design as fixed before the runs, the power statement of the coded rule, the tables (primary family,
secondary readings, levels, exploratory contrasts, the learning-rate check), the facts of the runs
(device, precision, seeds) and the plot; and what the tables read of a run's results. The rule itself
is ``study/compare.py``'s; ``GPURemediesStudy.decide`` applies it."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study import compare, tables
from avspo_openrlhf.study.compare import (
    ALPHA,
    FAIL_ATTEMPTS,
    detectable_effect,
    equivalence_chance,
    fewest_seeds,
    power_at,
    seeds_for_effect,
)
from avspo_openrlhf.study.store import check_pairable, level_lookup


def paired_t(results: list[dict], method: str, base: str, level: Callable[[str], str], keep=None) -> dict | None:
    """``method`` - ``base`` paired by seed, each level (``level(unique_id)``: the problem's row's, through
    ``store.level_lookup``) weighing the same (``compare.paired``, the CPU study's comparison too)."""
    return compare.paired(results, method, base, level, keep)


def tokens_to_target(r: dict, target: float) -> float:
    """The generated tokens spent at the first mid-run evaluation whose held-out pass@1 reaches
    ``target`` (what the run had generated then, not the milestone it was due at: a DAPO-DS step
    overshoots a milestone by more); infinity for a run that never reached it (censored, not dropped)."""
    return next((float(e["tokens"]) for e in r.get("mid_evals", []) if e["pass1"] >= target), math.inf)


def swapped(problem: str) -> str | None:
    """An arithmetic problem with the operands of its first commutative operation swapped (``What is 3
    + 4?`` -> ``What is 4 + 3?``; ``What is 2 * 5 + 1?`` -> ``What is 5 * 2 + 1?``), or None."""
    import re

    m = re.fullmatch(r"What is (\d+) ([+*]) (\d+)(.*)", problem)
    return f"What is {m[3]} {m[2]} {m[1]}{m[4]}" if m and m[1] != m[3] else None


def greedy_view(results: list[dict]) -> list[dict]:
    """The runs with a greedy evaluation, read as greedy: their greedy per-problem records and pass@1
    where the comparisons read the sampled ones (a secondary reading)."""
    return [
        {**r, "per_problem": r["per_problem_greedy"], "heldout_pass1": r["heldout_greedy_pass1"]}
        for r in results
        if r.get("per_problem_greedy")
    ]


def acted(results: list[dict], method: str, base: str) -> bool | None:
    """Whether ``method`` changed any run against ``base``: on some seed both ran, some step's
    generated tokens, reward, effective ACR or groups with a signal differ (common random numbers make
    a remedy that never acts, a gate that never opened, reproduce the base step for step). None without
    a seed of both."""
    a = {r["seed"]: r for r in results if r["method"] == method and not compare.failed(r)}
    b = {r["seed"]: r for r in results if r["method"] == base and not compare.failed(r)}
    keys = ("tokens", "reward", "acr_effective", "groups_signal")

    def steps(r: dict) -> list[tuple]:
        return [tuple(c.get(k) for k in keys) for c in r.get("curve", [])]

    seeds = [
        s for s in set(a) & set(b) if a[s].get("curve") and b[s].get("curve")
    ]  # a record without its curve: unknown
    return None if not seeds else any(steps(a[s]) != steps(b[s]) for s in seeds)


# a share of truncated completions above which the report warns: the answers are cut, not wrong
TRUNCATION_WARN = 0.2


def wall_time_is_the_arms(r: dict) -> bool:
    """Whether a run's wall time measures its arm: it ran alone, or beside runs of its own arm only
    (in a stacked batch the runs advance in lockstep, so a run waits for its companions' refills)."""
    b = r.get("batch") or {}
    return b.get("runs_at_once") == 1 or b.get("methods") == [r["method"]]


class StudyReport:
    """The report's methods of :class:`~avspo_openrlhf.study.remedies_gpu.GPURemediesStudy`."""

    def design_lines(self) -> list[str]:
        """What the verdict licenses, from the plan (the planned seeds, the planning sd, the Holm family
        and the margin): the generated paragraph the README includes (``results/design.md``)."""
        m, n, sd = len(self.family), min(self.seeds[a] for a in self.family), self.planning_sd
        if sd is None:
            return []
        mde = detectable_effect(sd, n, m)
        p3, p5 = power_at(0.03, sd, n, m), power_at(0.05, sd, n, m)
        eq0 = equivalence_chance(sd, n, m, self.margin)
        low = 0.07  # the planning sd is an upper bound: what the same seeds give at a smaller one
        return [
            f"At the planned {n} seeds per primary arm and a per-seed paired sd of {100 * sd:.0f} points, the rule "
            f"(Holm over {m} comparisons with {self.base}, family-wise error {ALPHA}) declares a true difference of "
            f"{100 * mde:.1f} points with 80 % probability (the minimum detectable effect), one of 3 points with "
            f"{100 * p3:.0f} % and one of 5 points with {100 * p5:.0f} %. A remedy with no effect is called "
            f'better or worse with probability at most {ALPHA} over the whole family, and "no difference larger '
            f'than {100 * self.margin:.0f} points" with probability {100 * eq0:.0f} % (simulated, 20,000 studies); '
            f"at an sd of {100 * low:.0f} points the detectable effect is {100 * detectable_effect(low, n, m):.1f} "
            f"points and the chance of that verdict {100 * equivalence_chance(low, n, m, self.margin):.0f} %.",
            "",
            f"So *better/worse than {self.base}* licenses the sign of a difference (its size is the interval beside "
            f"it); *no difference larger than {100 * self.margin:.0f} points* licenses what it says, at the "
            f"interval's level; *inconclusive* licenses nothing: a true difference below about "
            f"{100 * mde:.0f} points is not ruled out, and is likely to end there.",
        ]

    def verdict_words(self, verdict: str) -> str:
        return {
            "better": f"better than {self.base}",
            "worse": f"worse than {self.base}",
            "equivalent": f"no difference larger than {100 * self.margin:.0f} points",
            "never_acted": f"no verdict: the remedy never acted (every seed's run is {self.base}'s, step for step: "
            "its gate never opened, or its advantages equal the baseline's)",
            "identical": f"no verdict: every seed's held-out accuracy equals {self.base}'s (the remedy acted; the "
            "score did not move)",
        }.get(verdict, verdict)

    def plan_lines(self) -> list[str]:
        """The plan's power in units of the per-seed paired sd, known before any run: what the rule
        can declare at the planned seeds, and the fewest seeds at which it can declare anything."""
        m = len(self.family)
        n = min((self.seeds.get(a, 0) for a in self.family), default=0)
        fewest = fewest_seeds(m)
        d = detectable_effect(1.0, n, m) if n >= fewest else None
        return [
            "",
            f"The plan: {m} comparison{'s' if m > 1 else ''} with {self.base} ({', '.join(self.family)}), {n} seeds "
            f"each, Holm at family-wise {ALPHA}. The rule can declare a difference only from {fewest} seeds (the "
            f"exact sign-flip p of n seeds is at least 2 / 2^n){'' if n >= fewest else ': this plan gives no verdict'}; "
            + (
                f"at {n} seeds it detects with 80 % power a true difference of {d:.2f} times the per-seed sd of "
                "the paired differences (the table below puts the measured sd in points)."
                if d is not None
                else f"at {n} seeds it has no power at all."
            ),
        ]

    def power_lines(self, summary: dict) -> list[str]:
        """What the rule can tell at the planned seeds: from the planning sd, and from each primary
        comparison's measured sd, the minimum detectable effect at 80 % power and the power at 3 and 5
        points, for the rule as coded (one real effect in the Holm family: tested at alpha / m)."""
        m = len(self.family)
        rows = []

        def row(label: str, seeds: str, sd: float, n: int, halfwidth: str) -> str:
            mde, p3, p5 = detectable_effect(sd, n, m), power_at(0.03, sd, n, m), power_at(0.05, sd, n, m)
            need = seeds_for_effect(sd, 0.05, m, floor=fewest_seeds(m))
            return (
                f"| {label} | {seeds} | {100 * sd:.1f} | {halfwidth} | {n} | "
                f"{'-' if mde is None else f'{100 * mde:.1f}'} | {'-' if p3 is None else f'{100 * p3:.0f} %'} | "
                f"{'-' if p5 is None else f'{100 * p5:.0f} %'} | {'> 1000' if need is None else need} |"
            )

        n_plan = max((self.seeds.get(a, 0) for a in self.family), default=0)
        if self.planning_sd is not None and n_plan >= 2:
            rows.append(row("the plan", "-", self.planning_sd, n_plan, "-"))
        for arm in self.family:
            c = summary.get(arm, {}).get("vs_" + self.base)
            if c is not None and c["sd"] > 0:
                rows.append(row(arm, str(c["seeds"]), c["sd"], self.seeds.get(arm, 0), f"{100 * c['halfwidth']:.1f}"))
        if not rows:
            return []
        return [
            "",
            f"What the rule can tell, per primary comparison against {self.base} (points): from the sd the seeds "
            f"were planned for and from each comparison's measured sd of its per-seed differences, at the planned "
            f"seeds, the minimum detectable effect (80 % power) and the power to detect a true difference of 3 and "
            f"of 5 points, for the rule as coded: one real effect in a Holm family of {m} is tested at "
            f"{ALPHA} / {m} (two-sided paired t; the rule's exact sign-flip p agrees within a few points, "
            "tests/test_study_design.py simulates it); and the seeds at which it detects 5 points with 80 % power "
            f"(at least {fewest_seeds(m)}, the fewest at which it can give a verdict): what to plan next",
            "",
            "| comparison | seeds now | sd | 95 % half-width now | seeds planned | detectable effect | power at 3 | "
            "power at 5 | seeds for 5 at 80 % |",
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
        v = record.get("versions")
        ran = (  # runs recorded before the loop's semantics version hashed its code instead
            f"loop semantics v{record['semantics']}, torch {v['torch']}, transformers {v['transformers']}, "
            f"CUDA {v['cuda'] or 'none'} on {record['device_kind']}"
            if v
            else f"loop and remedies code {record['code']}"
        )
        return (
            f"Model {record['model']} (content hash), training pool {record['train']}, held-out set "
            f"{record['heldout']} (distinct problems, none a training prompt; each level weighs the same); "
            f"G={s['group_size']}, {s['prompts_per_step']} prompts/step, T={s['temperature']} (log-probs at the "
            f"same T), {s['max_new_tokens']} new tokens, lr {s['lr']:g}, one AdamW step per batch; every run "
            f"stops at the step where its generated tokens reach {s['token_budget']:,}. Held-out: n={s['eval_n']} "
            f"at T={s['eval_temperature']}; mid-run evaluations every {s['mid_eval_tokens']:,} generated tokens "
            f"on the first {s['mid_eval_problems']} held-out problems (n=2). Compute precision "
            f"{record['precision']}; {ran}; commits {', '.join(commits)}. "
            f"StudySettings hash {results[0]['settings_hash']}. Device: {devices}. {tables.SD_NOTE}. Differences are "
            f"paired (same seed, same problems, common random numbers): mean [95 % t interval over seeds], "
            f"p = exact sign-flip over seeds (seeds)."
        )

    def report(
        self,
        results: list[dict],
        out: Path,
        failed: dict[str, list[str]] | None = None,
        lr_results: list[dict] | None = None,
        exclude: frozenset[str] = frozenset(),
        levels: Mapping[str, str] | None = None,
    ) -> str:
        """``results.md``, ``results.json`` (the summary, no per-problem records) and the plot in ``out``;
        ``failed``: the runs that stopped and resume when started again (:meth:`failures`); ``exclude``:
        the held-out ids of the sensitivity row (near-duplicates of training prompts); ``levels``: each
        scored problem's level (default: the study's own problems', :meth:`problem_levels`)."""
        record = check_pairable(results)
        level = level_lookup(self.problem_levels() if levels is None else levels)
        results, extra = self.split_planned(results)
        summary = self.summary(results, exclude, level)
        decision = self.decide(summary)
        failed = failed or {}
        lines = [self.header(results, record), ""]
        if not decision["complete"]:
            left = sum(max(0, n - summary.get(a, {}).get("seeds", 0)) for a, n in self.seeds.items())
            slots = (
                f" ({left} runs in all: about {math.ceil(left / self.runs_per_slot)} GPU slots of {self.runs_per_slot} runs)"
                if self.runs_per_slot
                else ""
            )
            lines += [
                "**Incomplete: no verdict yet.** Primary runs missing: "
                + ", ".join(f"{a} {m} of {self.seeds.get(a, 0)}" for a, m in decision["missing"].items())
                + slots
                + ". Every number below is provisional.",
                "",
            ]
        cut = {
            arm: statistics.mean(a["truncation_rate"])
            for arm, a in summary.items()
            if a["truncation_rate"] and statistics.mean(a["truncation_rate"]) > TRUNCATION_WARN
        }
        if cut:
            lines += [
                f"**Warning: completions cut at the answer-length limit** ({', '.join(f'{a} {100 * v:.0f} %' for a, v in cut.items())} "
                f"of them reached {results[0]['settings']['settings']['max_new_tokens']} new tokens): a cut answer scores "
                "as wrong, so these runs measure the length limit too; raise it (--max-new-tokens) unless that is the task.",
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
            f"The primary comparisons, each remedy against {b} on the planned seeds (Holm over the "
            f"{len(self.family)} of them, fixed before the runs; a comparison without runs counts as p = 1). The "
            "interval is the t interval at the level Holm tested the comparison at (1 - 0.05 / (m - rank + 1)), "
            f"the one the verdict reads: *better/worse* when it excludes 0 and the Holm p is below {ALPHA}, *no "
            f"difference larger than {100 * self.margin:.0f} points* when it lies inside ±{100 * self.margin:.0f}:",
            "",
            f"| arm | seeds (planned) | held-out pass@1 (%) | steps | vs {b} (points) [Holm-level interval] | "
            f"Holm p | P(better than {b}) [95 %] | between-arm r | verdict |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm in self.primary:
            a = summary.get(arm)
            if a is None:
                lines.append(f"| {arm} | 0 ({self.seeds.get(arm, 0)}) | - | - | - | - | - | - | no runs |")
                continue
            c, poi = a["vs_" + b], a["poi_vs_" + b]
            poi_s = "-" if poi is None else f"{poi['poi']:.2f} [{poi['ci95'][0]:.2f}, {poi['ci95'][1]:.2f}]"
            r = "-" if c is None or c["correlation"] is None else f"{c['correlation']:+.2f}"
            rr = decision["rule"].get(arm)
            diff = "-"
            if c is not None and rr is not None and rr["ci"] is not None:
                diff = (
                    f"{100 * c['diff']:+.1f} [{100 * rr['ci'][0]:+.1f}, {100 * rr['ci'][1]:+.1f}] "
                    f"at {100 * rr['level']:.1f} % ({c['seeds']})"
                )
            lines.append(
                f"| {arm} | {a['seeds']} ({a['seeds_planned']}) | {tables.mean_sd(a['heldout_pass1_paired'], 100)} | "
                f"{tables.mean_sd(a['steps'], 1, '{:.1f}')} | {diff if arm != b else '-'} | "
                f"{tables.fmt_p(decision['holm'].get(arm)) if arm != b else '-'} | {poi_s} | {r} | "
                f"{decision['verdicts'].get(arm, '-')} |"
            )
        lines += [
            "",
            f"Secondary readings of the primary comparisons, exploratory (points; mean [95 % t interval], p = exact "
            f"sign-flip (seeds)): greedy decoding (one completion per held-out problem at T = 0, where sampling at "
            f"T rewards a sharpened policy), and the held-out set without its {len(exclude)} near-duplicates of "
            "training prompts (the same operands swapped):",
            "",
            f"| arm | greedy pass@1 (%) | greedy vs {b} | vs {b} without near-duplicates |",
            "| --- | --- | --- | --- |",
        ]
        for arm in self.family:
            a = summary.get(arm)
            if a is not None:
                lines.append(
                    f"| {arm} | {tables.mean_sd(a['heldout_greedy_pass1'], 100)} | {tables.fmt_t(a['greedy_vs_' + b])} | "
                    f"{tables.fmt_t(a['near_duplicates_out_vs_' + b]) if exclude else 'none flagged'} |"
                )
        second = self.second_base if self.second_base != b else None
        lines += [
            "",
            f"Exploratory (no adjustment, no verdict): the other arms against {b}"
            + (f", and every arm against {second}:" if second else ":"),
            "",
            f"| arm | seeds (planned) | held-out pass@1 (%) | vs {b} (points) | vs {second or '-'} (points) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for arm, a in summary.items():
            lines.append(
                f"| {arm} | {a['seeds']} ({a['seeds_planned']}) | {tables.mean_sd(a['heldout_pass1'], 100)} | "
                f"{tables.fmt_t(a['vs_' + b]) if arm not in self.primary else 'above'} | "
                f"{tables.fmt_t(a['vs_' + self.second_base]) if second else '-'} |"
            )
        for x, y, why in self.contrasts:
            if x in summary and y in summary:
                lines.append(f"| {x} vs {y}: {why} | | | {tables.fmt_t(paired_t(results, x, y, level))} | |")
        budget = record["settings"]["token_budget"]
        lines += [
            "",
            f"What each arm spent and trained on. Tokens to reach {100 * self.target:.0f} % on the mid-run "
            f"held-out subset: the tokens generated by the first evaluation that reached it, the median over every "
            f"seed, a seed that never reached it counting as beyond the budget (reached/seeds). Update tokens: the "
            f"prompt and completion tokens through the training forward and backward. Collapse over every generated "
            f"group (DAPO-DS's and GRESO's dropped ones too); groups with a non-zero advantage (token advantages "
            f"count) per million generated tokens. Train minutes only from runs that ran alone or beside runs of "
            f"their own arm (runs/all): in a stacked batch of mixed arms a run waits for its companions:",
            "",
            "| arm | steps | generated tokens | update tokens | tokens to target | non-zero-advantage groups per M "
            "tokens | ACR, generated groups | effective ACR | truncated (%) | completion tokens | train (min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm, a in summary.items():
            t = a["tokens_to_target"]
            med = f"{t['median']:,.0f}" if math.isfinite(t["median"]) else f"> {budget:,}"
            lines.append(
                f"| {arm} | {tables.mean_sd(a['steps'], 1, '{:.1f}')} | "
                f"{tables.mean_sd(a['generated_tokens'], 1, '{:,.0f}')} | "
                f"{tables.mean_sd(a['update_tokens'], 1, '{:,.0f}')} | {med} ({t['reached']}/{a['seeds']}) | "
                f"{tables.mean_sd(a['signal_groups_per_mtok'], 1, '{:,.0f}')} | "
                f"{tables.mean_sd(a['acr_generated'], 1, '{:.2f}')} | {tables.mean_sd(a['acr_effective'], 1, '{:.2f}')} | "
                f"{tables.mean_sd(a['truncation_rate'], 100)} | {tables.mean_sd(a['completion_tokens_mean'], 1)} | "
                f"{tables.mean_sd(a['train_min'], 1, '{:.1f}')} ({a['train_min_runs']}) |"
            )
        lines += tables.level_table(
            {arm: [a["by_level_vs_" + b][lv] for lv in self.levels] for arm, a in summary.items()},
            self.levels,
            f"Per level against {b}, exploratory (points; mean [95 % t interval over seeds], p = exact sign-flip "
            "(seeds)):",
            label="arm",
        )
        lines += self.plan_lines()
        lines += self.power_lines(summary)
        lines += [
            "",
            "Seeds that lost steps or failed, per arm (never dropped nor replaced: a run with more than 1 % of its "
            "steps skipped for a non-finite gradient or entropy is flagged; a run that stopped resumes when started "
            f"again; one that failed on an error of its own in {FAIL_ATTEMPTS} launches failed for good and counts "
            "with its last mid-run evaluation's pass@1, or 0 before any):",
            "",
        ]
        health = []
        for arm, a in summary.items():
            if a["skipped_step_seeds"] or a["flagged_seeds"] or a["failed_for_good"] or failed.get(arm):
                health.append(
                    f"- {arm}: steps skipped {a['skipped_step_seeds'] or 'none'}; flagged seeds "
                    f"{a['flagged_seeds'] or 'none'}; failed for good {a['failed_for_good'] or 'none'}; "
                    f"stopped, to resume: {'; '.join(failed.get(arm, [])) or 'none'}"
                )
        for arm in sorted(set(failed) - set(summary)):
            health.append(f"- {arm}: stopped, to resume: {'; '.join(failed[arm])}")
        lines += health or ["- none: every run finished with every step updated."]
        if extra:
            lines += [
                "",
                "Runs beyond the planned seeds (in no table above and in no verdict):",
                "",
                "| arm | seed | held-out pass@1 (%) |",
                "| --- | --- | --- |",
                *(
                    f"| {r['method']} | {r['seed']} | {100 * r['heldout_pass1']:.1f} |"
                    for r in sorted(extra, key=lambda r: (r["method"], r["seed"]))
                ),
            ]
        if lr_results:
            lines += ["", *self.lr_lines(lr_results, level)]
        lines += tables.per_seed_table(results, list(summary))
        lines.append(f"\nRuns resumed after a kill: {sum(bool(r.get('resumed')) for r in results)}.")
        text = "\n".join(lines) + "\n"
        self._write(out, text, summary, decision, results)
        atomic_write(out / "facts.md", self.facts(results) + "\n")
        self.plot(results, out / "accuracy_vs_tokens.png")
        return text

    def facts(self, results: list[dict]) -> str:
        """What the runs measured that the design rests on (the collapse at the first step, the steps a
        run takes, its completions' length), one generated paragraph the README's design cites."""
        ok = [r for r in results if not compare.failed(r) and r.get("curve")]
        if not ok:
            return "No run has finished yet."

        def mean(values) -> float | None:  # a curve key a run of another version may lack
            values = [v for v in values if v is not None]
            return statistics.mean(values) if values else None

        first, steps = [r["curve"][0] for r in ok], [r["steps"] for r in ok]
        wrong = mean(c.get("acr_all_wrong") for c in first)
        start, end = (mean(c.get("completion_tokens_mean") for c in cs) for cs in (first, [r["curve"][-1] for r in ok]))
        return (
            f"Measured on these {len(ok)} runs ({', '.join(sorted({r['method'] for r in ok}))}): at the first step "
            f"{100 * mean(c['acr'] for c in first):.0f} % of the groups collapsed"
            + (f" ({100 * wrong:.0f} % all wrong)" if wrong is not None else "")
            + f"; a run took {min(steps)}-{max(steps)} steps (mean {statistics.mean(steps):.1f}) to its budget"
            + (
                f"; a completion averaged {start:.1f} tokens at the first step and {end:.1f} at the last."
                if start is not None and end is not None
                else "."
            )
        )

    def lr_lines(self, lr_results: list[dict], level: Callable[[str], str] | None = None) -> list[str]:
        """The learning-rate check: each checked arm's validation pass@1 per learning rate, and each rate
        against the study's own on the same seeds (paired: the seeds draw the same random numbers)."""
        level = level or level_lookup(self.problem_levels())
        by: dict[str, list[float]] = {}
        for r in lr_results:
            by.setdefault(r["method"], []).append(r["heldout_pass1"])
        rows = []
        for m, v in sorted(by.items()):
            arm, _, _ = m.partition("@lr=")
            own = f"{arm}@lr={self.settings.lr:g}"
            vs = "-" if m == own else tables.fmt_t(paired_t(lr_results, m, own, level))
            rows.append(f"| {m} | {len(v)} | {tables.mean_sd(v, 100)} | {vs} |")
        return [
            f"Learning-rate check, exploratory (validation problems, not the held-out set; the study keeps lr "
            f"{self.settings.lr:g} for every arm whatever this says, and it changes no verdict: it says whether "
            f"{', '.join(self.lr_check.get('arms', ()))} would do better at another rate):",
            "",
            f"| arm at lr | seeds | validation pass@1 (%) | vs lr {self.settings.lr:g}, same seeds (points) |",
            "| --- | --- | --- | --- |",
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
            # each milestone at the tokens the runs had generated when evaluated (a DAPO-DS step overshoots more)
            xs = np.array(
                [
                    [next((e["tokens"] for e in r["mid_evals"] if e["milestone"] == m), np.nan) for m in grid]
                    for r in rs
                ],
                dtype=float,
            )
            x, mean = np.nanmean(xs, 0), np.nanmean(ys, 0)
            ax0.plot(x, mean, color=f"C{i}", marker=".", label=f"{arm} ({len(rs)})")
            if len(rs) > 1:
                sd = np.nanstd(ys, 0, ddof=1)
                ax0.fill_between(x, mean - sd, mean + sd, color=f"C{i}", alpha=0.12, lw=0)
            final = [100 * r["heldout_pass1"] for r in rs]
            ax1.bar(i, statistics.mean(final), color=f"C{i}", alpha=0.6)
            ax1.scatter([i] * len(final), final, color="k", s=8, zorder=3)
        ax0.set(
            xlabel="generated tokens when evaluated (mean over seeds)",
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
