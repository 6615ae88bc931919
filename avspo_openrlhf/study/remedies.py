"""Which remedy for advantage collapse? Methods compared on one task at equal generated tokens.

Every run is ``avspo-train --backend cpu`` through the quickstart's flags with the same model, data,
decoding, optimizer and seed list, stopped by ``--run.max_generated_tokens`` (dynamic sampling
spends extra generation per step, GRESO saves some: equal steps would be unfair both ways), then a
held-out evaluation of its final model on the held-out set and its extension. Resumable per
(method, seed): a finished run leaves ``<method>_seed<k>/result.json``; a run killed midway resumes
from its checkpoint when the command is repeated. With ``--publish`` every finished run is written
to the repository's results folder with its per-problem records, and a run found there is not run
again, so the study also resumes on a machine whose run folder is gone. ``--report-only`` rebuilds
the tables, the p-values, the plots and the relation of early raw ACR to final accuracy from what is
there, saying how many seeds and held-out problems each cell holds; with an earlier pass's published
results, the report also pools both passes on the problems both evaluated (each run a draw, paired
within its seed and pass). ``--per-seed-json`` also writes both passes' numbers per method and seed
with every comparison, the per-problem records left out.

The study's configuration (methods and their flags, settings, budget, seeds wanted) is a
``RemediesStudy`` built by ``experiments/remedies/run.py``."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from avspo_openrlhf.cli import quickstart as qs
from avspo_openrlhf.stats import t_halfwidth
from avspo_openrlhf.study import acr, cells, store, tables
from avspo_openrlhf.study.compare import check_results, paired, pooled_compare
from avspo_openrlhf.study.spec import Arm
from avspo_openrlhf.study.tables import cpu_line, fmt_t, mean_sd, precisions


def _option_flags(group: str, options: dict) -> list[str]:
    """``--GROUP.KEY VALUE`` per option (a true bool is the bare flag, a false one none; a pair, two values)."""
    out: list[str] = []
    for key, value in options.items():
        if value is True:
            out.append(f"--{group}.{key}")
        elif value is not False:
            out += [f"--{group}.{key}", *(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))]
    return out


def arm_flags(name: str, arm: Arm) -> list[str]:
    """An :class:`Arm`, the GPU study's language for a method, as the ``avspo-train`` flags this
    study's runs take: ``--remedy`` and its ``--NAME.*`` options, ``--dynamic.std_filter`` for DAPO
    dynamic sampling, ``--greso.enable`` and its ``--greso.*`` options. The study loop's controls
    (a coin or format reward, the random-sign control) and a per-arm learning rate have no
    ``avspo-train`` flag: refused, naming the arm and the field."""
    for field_, set_ in (
        ("reward", arm.reward != "task"),
        ("control", arm.control is not None),
        ("lr", arm.lr is not None),
    ):
        if set_:
            raise ValueError(
                f"arm {name!r}: Arm.{field_} is the study loop's (experiments/remedies_gpu); avspo-train has no flag for it"
            )
    flags = [] if arm.estimator == "grpo" else ["--remedy", arm.estimator]
    flags += _option_flags(arm.estimator, arm.options)
    if arm.greso is not None:
        flags += ["--greso.enable", *_option_flags("greso", arm.greso)]
    if arm.dynamic:
        flags.append("--dynamic.std_filter")
    return flags


def restore_before_eval(out: Path, published: Path) -> list[str]:
    """Put the evaluations before training that ``published``/results.json holds back into ``out``,
    where ``out`` lacks them (the runs themselves are read from ``published``/runs: ``store.collect``):
    the study resumes from the repository on a machine whose run folder is gone. Returns those restored."""
    path = published / "results.json"
    restored = []
    for name, summary in (json.loads(path.read_text()) if path.exists() else {}).get("before_eval", {}).items():
        if not (out / name / "summary.json").exists():
            (out / name).mkdir(parents=True, exist_ok=True)
            cells.write_json(out / name / "summary.json", summary)
            restored.append(name)
    return restored


def _summary_precision(eval_dir: Path) -> str:
    return json.loads((eval_dir / "summary.json").read_text()).get("precision") or "not recorded"


def _mid_pass1(e: dict) -> float | None:
    per = [v for k, v in e.items() if k.endswith("/pass1")]
    return sum(per) / len(per) if per else None


# what the report writes that the repository keeps
PUBLISHED = ("results.md", "results.json", "remedies.png", "acr_vs_accuracy.md", "acr_vs_accuracy.json")
# what a reader needs per run; the per-problem records and curves stay in the published runs/
PER_SEED_KEYS = (
    "heldout_pass1",
    "heldout_pass1_first",
    "heldout_problems",
    "heldout_by_level",
    "steps",
    "generated_tokens",
    "trained_samples",
    "generated_per_trained",
    "acr_start",
    "acr_raw",
    "acr_effective",
    "acr_all_wrong",
    "acr_all_right",
    "train_wall_min",
    "resumed",
    "cpu",
)


def _heldout_points(r: dict, before: float) -> list[tuple[float, float, float]]:
    """(generated tokens, wall s, held-out pass@1) along a run: before training, the in-training
    evaluations, the final evaluation."""
    tok = {c["step"]: c["tokens"] for c in r["curve"]}
    wall = {c["step"]: c["wall_s"] for c in r["curve"]}
    pts = [(0.0, 0.0, before)] + [(tok.get(e["step"], 0), wall.get(e["step"], 0), e["pass1"]) for e in r["mid_evals"]]
    return pts + [(r["generated_tokens"], r["curve"][-1]["wall_s"], r["heldout_pass1"])]


def _mean_band(ax, xs_runs, ys_runs, grid, color, label, scale=1.0):
    """Mean over seeds (line) and ± one standard deviation (band) of runs interpolated on ``grid``;
    beyond a run's last point its last value holds."""
    import numpy as np

    ys = np.array([np.interp(grid, x, y) for x, y in zip(xs_runs, ys_runs)]) * scale
    mean = ys.mean(axis=0)
    ax.plot(grid, mean, color=color, lw=1.6, label=label)
    if len(ys) > 1:
        sd = ys.std(axis=0, ddof=1)
        ax.fill_between(grid, mean - sd, mean + sd, color=color, alpha=0.12, lw=0)


@dataclass(frozen=True)
class RemediesStudy:
    """The study's configuration; its methods run, compare and report it."""

    levels: tuple[str, ...]  # the task's levels; synthetic_arithmetic cycles them, so a problem's id names its level
    train_prompts: int  # the training pool
    heldout: int  # the held-out set
    heldout_extra: int  # its extension: the same seeded stream continued
    settings: dict  # quickstart options of every run (the keys of ``quickstart.build_parser``)
    token_budget: int  # generated tokens per run
    methods: dict[str, Arm]  # name: what it changes (the GPU study's arms; ``arm_flags`` makes its flags)
    min_seeds: dict[str, int]  # seeds each method gets
    baselines: tuple[str, ...]  # the methods every other one is compared with
    # name: avspo-train flags beyond its arm, for settings the study loop has no counterpart of
    # (NGRPO's asymmetric clip: with one optimizer step per batch the loop's ratio is 1)
    extra_flags: dict[str, list[str]] = field(default_factory=dict)
    first_pass: Path | None = None  # an earlier pass's published results.json, pooled on the held-out set
    # (name, published results.json) of other studies whose runs join the ACR-vs-accuracy relation
    related: tuple[tuple[str, Path], ...] = ()

    def __post_init__(self):
        for name, arm in self.methods.items():
            arm_flags(name, arm)  # an arm avspo-train cannot run is refused when the study is built

    # ── runs ──

    def make_data(self, out: Path) -> tuple[str, str, str]:
        """The training pool, the held-out set and its extension, the same for every method and seed
        (written atomically: a study running beside a ``--report-only`` reads them)."""
        from avspo_openrlhf.data.io import write_jsonl
        from avspo_openrlhf.data.tasks import make_prompt

        out.mkdir(parents=True, exist_ok=True)
        train, heldout = self.streams(self.heldout + self.heldout_extra)
        sets = {
            "train": train,
            "heldout": heldout[: self.heldout],
            "heldout_extra": heldout[self.heldout :],
        }
        for name, rows in sets.items():
            for r in rows:
                r["prompt"] = make_prompt(r["problem"], "user")
            write_jsonl(rows, str(out / f"{name}.jsonl"))
        return tuple(str(out / f"{name}.jsonl") for name in sets)

    def streams(self, heldout_rows: int) -> tuple[list[dict], list[dict]]:
        """The training pool and the first ``heldout_rows`` of the held-out stream, drawn independently
        (seeds 0 and 1000; a longer stream begins with a shorter one)."""
        from avspo_openrlhf.data.tasks import synthetic_arithmetic

        train = synthetic_arithmetic(self.train_prompts, list(self.levels), seed=0)
        return train, synthetic_arithmetic(heldout_rows, list(self.levels), seed=1000)

    @cached_property
    def level(self) -> Callable[[str], str]:
        """``unique_id -> level`` of the held-out problems (the first set and its extension): each row's
        ``level`` field (``task.level_of``), the rule the GPU study's report reads too."""
        from avspo_openrlhf.study.task import levels_by_id

        return store.level_lookup(levels_by_id(self.streams(self.heldout + self.heldout_extra)[1]))

    def merge_extra(self, res: dict, records: list[dict], precision: str | None = None) -> dict:
        """``res`` (a run's result) with the extra held-out problems' records added: pass@1 over all the
        problems it now holds, per level too; the first set's pass@1 kept as ``heldout_pass1_first``."""
        per = dict(res["per_problem"])
        per.update({r["unique_id"]: sum(r["correct"]) / len(r["correct"]) for r in records})
        by_level = {lv: [v for k, v in per.items() if self.level(k) == lv] for lv in self.levels}
        out = {
            **res,
            "per_problem": per,
            "heldout_problems": len(per),
            "heldout_pass1_first": res.get("heldout_pass1_first", res["heldout_pass1"]),
            "heldout_pass1": statistics.mean(per.values()),
            "heldout_by_level": {lv: statistics.mean(v) for lv, v in by_level.items() if v},
        }
        if precision is not None:
            out["precision"] = {**res.get("precision", {}), "evaluation after (extra problems)": precision}
        return out

    def extend_eval(self, run_dir: Path, extra: str) -> dict:
        """Evaluate a finished run's final model on the extra held-out problems and merge them into its
        result (once: a run that holds them is returned as it is)."""
        res = json.loads((run_dir / "result.json").read_text())
        held = res.get("heldout_problems", self.heldout)
        if held >= self.heldout + self.heldout_extra:
            return res
        if not (run_dir / "final" / "config.json").exists():
            raise RuntimeError(
                f"{run_dir}: holds {held} held-out problems and no final "
                "model to evaluate the rest with; delete the folder to run it again"
            )
        args = self.study_args(res["method"], res["seed"], self.token_budget)
        qs.evaluate_heldout(str(run_dir / "final"), extra, run_dir / "eval_after_extra", args, run_dir / "log.txt")
        records = qs.eval_records(run_dir / "eval_after_extra")
        if len(records) != self.heldout_extra:
            raise RuntimeError(f"{run_dir / 'eval_after_extra'}: {len(records)} records, expected {self.heldout_extra}")
        res = self.merge_extra(res, records, _summary_precision(run_dir / "eval_after_extra"))
        cells.write_json(run_dir / "result.json", res)
        return res

    def study_args(self, method: str, seed: int, budget: int) -> argparse.Namespace:
        """The quickstart options of one run (its parser: what the quickstart itself would run)."""
        flags = [*arm_flags(method, self.methods[method]), *self.extra_flags.get(method, [])]
        extra = [*flags, "--run.max_generated_tokens", str(budget), "--train.num_episodes", "50"]
        settings = [f"--{k.replace('_', '-')}={v}" for k, v in self.settings.items()]
        return qs.build_parser().parse_args(
            ["--grpo", "--seed", str(seed), "--save-steps", "8", *settings, "--", *extra]
        )

    def run_one(self, method: str, seed: int, out: Path, model: str, data: tuple[str, str, str], budget: int) -> dict:
        run_dir = out / f"{method}_seed{seed}"
        result_file = run_dir / "result.json"
        train, heldout, extra = data
        if result_file.exists():
            return self.extend_eval(run_dir, extra)
        cell = cells.train_and_evaluate(self.study_args(method, seed, budget), model, train, heldout, run_dir)
        rows, after = cell.rows, cell.after
        start = rows[0].get("timeline/gen_start", cell.t0)
        last = rows[-1]
        res = {
            "method": method,
            "seed": seed,
            "steps": len(rows),
            "heldout_pass1": after["pass@1"],
            "heldout_problems": self.heldout,
            "heldout_by_level": after.get("pass@1_by_level", {}),
            "per_problem": cells.per_problem(run_dir / "eval_after"),
            "generated_tokens": last.get("tokens/generated_cum", 0.0),
            "trained_samples": len(rows) * self.settings["group_size"] * self.settings["prompts_per_step"],
            "generated_per_trained": last.get("dynamic/generated_per_trained_cum", 1.0),
            "acr_raw": statistics.mean(r["acr"] for r in rows),
            "acr_effective": statistics.mean(r["acr_effective"] for r in rows),
            "acr_start": statistics.mean(r["acr"] for r in rows[:3]),
            "acr_all_wrong": statistics.mean(r["acr_all_wrong"] for r in rows),
            "acr_all_right": statistics.mean(r["acr_all_right"] for r in rows),
            "greso": {k: v for k, v in last.items() if k.startswith("greso/")},
            "train_wall_min": cell.train_s / 60,
            "resumed": cell.resumed,  # wall time of a resumed run is not comparable
            "cpu": qs.cpu_kind(),  # the machine that ran it, not the one that writes the report
            "curve": [
                {
                    "step": r["step"],
                    "tokens": r.get("tokens/generated_cum", 0.0),
                    "wall_s": r.get("timeline/step_end", start) - start,
                    "reward": r["rollout/reward_mean"],
                    "acr": r["acr"],
                    "acr_effective": r["acr_effective"],
                }
                for r in rows
            ],
            "mid_evals": [{"step": e["step"], "pass1": _mid_pass1(e)} for e in cell.evals if _mid_pass1(e) is not None],
            "precision": qs.stage_precisions(run_dir),
            "load_avg": os.getloadavg(),
        }
        cells.write_json(result_file, res)
        shutil.rmtree(run_dir / "ckpt", ignore_errors=True)  # 1.6 GB per run; the final model stays
        return self.extend_eval(run_dir, extra)

    def before_pass1(self, out: Path, extended: bool) -> float:
        """Held-out pass@1 of the model before training, on the set the runs hold (``extended``: the
        extension too)."""
        sets = [("eval_before", self.heldout)] + ([("eval_before_extra", self.heldout_extra)] if extended else [])
        parts = [
            (json.loads((out / d / "summary.json").read_text())["benchmarks"]["arith"], n)
            for d, n in sets
            if (out / d / "summary.json").exists()
        ]
        if not parts:
            return math.nan
        return sum(s["pass@1"] * n for s, n in parts) / sum(n for _, n in parts)

    def order(self, methods: list[str], seeds: list[int] | None) -> list[tuple[str, int]]:
        """Seed-major (``store.seed_major``, the GPU study's order), so partial results hold complete
        seeds of every method; each method up to its ``min_seeds`` unless ``seeds`` names them."""
        return store.seed_major([methods], self.min_seeds, seeds)

    # ── comparisons ──

    def first_set_pass1(self, runs: list[dict], tag: str) -> dict[tuple[str, str, int], float]:
        """Each run's pass@1 on the first held-out set, the one every pass evaluated, keyed by
        (pass, method, seed): a run is a fresh draw (asynchronous rollouts and vLLM's sampling are not
        bit-reproducible), so a seed run in both passes gives two pairs."""
        out = {}
        for r in runs:
            if "heldout_pass1_first" in r or r.get("heldout_problems", self.heldout) == self.heldout:
                out[tag, r["method"], r["seed"]] = r.get("heldout_pass1_first", r["heldout_pass1"])
        return out

    def pooled_table(self, results: list[dict], first_pass: list[dict], methods: list[str]) -> list[str]:
        """Both passes together on the first held-out set: about twice the draws of either pass alone,
        since the spread between runs, not the evaluation set, is what limits each pass."""
        acc = {**self.first_set_pass1(first_pass, "first"), **self.first_set_pass1(results, "second")}
        rows = []
        for m in methods:
            cmp = [pooled_compare(acc, m, b) for b in self.baselines]
            if any(cmp):
                cells_ = [
                    f"{tables.fmt_interval((c['diff'], *c['ci95']))}, sd {100 * c['sd']:.1f}, "
                    f"p={c['p_sign_flip']:.3f} ({c['pairs']})"
                    if c
                    else "-"
                    for c in cmp
                ]
                rows.append(f"| {m} | " + " | ".join(cells_) + " |")
        if not rows:
            return []
        return [
            "",
            f"Both passes together, on the first {self.heldout} held-out problems (the set both evaluated): "
            "each (pass, seed) run is a draw, paired within the draw; mean [95 % t interval over the draws], sd "
            "of the paired differences, p = exact sign-flip (draws):",
            "",
            "| method | " + " | ".join(f"vs {b} (points)" for b in self.baselines) + " |",
            "| --- |" + " --- |" * len(self.baselines),
            *rows,
        ]

    def level_compare_table(self, results: list[dict], methods: list[str], base: str = "GRPO") -> list[str]:
        """Paired differences against ``base`` level by level (the main table's comparison on one
        level's problems): which levels a method's overall difference comes from."""
        with_records = [r for r in results if r.get("per_problem")]
        rows = {
            m: [paired(with_records, m, base, self.level, lambda k, lv=lv: self.level(k) == lv) for lv in self.levels]
            for m in methods
        }
        title = f"Per level against {base} (points; mean [95 % t interval over seeds], p = exact sign-flip (seeds)):"
        return tables.level_table(rows, self.levels, title)

    # ── the report ──

    def heldout_line(self, results: list[dict], before: float) -> str:
        """What the held-out numbers stand on: problems per run, the half-width of one run's evaluation
        interval (``stats.t_halfwidth`` over its per-problem accuracies)."""
        full = self.heldout + self.heldout_extra
        n_full = sum(r.get("heldout_problems", self.heldout) >= full for r in results)
        if n_full == len(results):
            held = f"{full:,} problems x n=4 (T=0.7)"
        elif n_full == 0:
            held = f"{self.heldout} problems x n=4 (T=0.7; the first pass's set, without the {self.heldout_extra} added later)"
        else:
            held = (
                f"{full:,} problems x n=4 (T=0.7) for {n_full} of {len(results)} runs, the first "
                f"{self.heldout} for the others (a difference is over the problems both runs hold)"
            )
        # a half-width, not a ±: in the tables ± is the standard deviation over seeds (tables.SD_NOTE)
        hw = [100 * t_halfwidth(list(r["per_problem"].values())) for r in results if len(r.get("per_problem", {})) > 1]
        interval = (
            f"; one run's 95 % evaluation interval (t, over problems) has a half-width of {min(hw):.1f}–"
            f"{max(hw):.1f} points"
            if hw
            else ""
        )
        rows = full if n_full == len(results) else self.heldout
        repeats, distinct = self.heldout_repeats(rows)
        return (
            f"Held-out: {held}; before training {100 * before:.1f} %{interval}. Of its {rows:,} rows {repeats} are "
            f"training prompts and {distinct:,} are distinct problems (single-digit levels have few; the GPU "
            "study's held-out set is distinct and disjoint from training)."
        )

    def heldout_repeats(self, rows: int) -> tuple[int, int]:
        """(rows that are training prompts, distinct problems) among the first ``rows`` of the held-out
        stream (:meth:`streams`: drawn independently of the training pool)."""
        train, heldout = self.streams(rows)
        prompts = {r["problem"] for r in train}
        return sum(r["problem"] in prompts for r in heldout), len({r["problem"] for r in heldout})

    def seed_and_level_tables(self, results: list[dict], methods: list[str]) -> list[str]:
        """Held-out pass@1 per seed (the paired tests' inputs, an empty cell for a run not yet done) and
        per level as a mean over seeds, with the collapsed share split all-wrong / all-right: where a
        method wins or loses, not only by how much."""
        lines = tables.per_seed_table(results, methods)
        lines += [
            "",
            "Per level (held-out pass@1, %) and the trained groups' collapsed share (all-wrong, all-right), "
            "means over seeds:",
            "",
            "| method | seeds | " + " | ".join(self.levels) + " | all-wrong | all-right |",
            "| --- | --- |" + " --- |" * (len(self.levels) + 2),
        ]
        for m in methods:
            rs = [r for r in results if r["method"] == m]
            lv = [
                tables.mean([r["heldout_by_level"][k] for r in rs if k in r.get("heldout_by_level", {})], 100)
                for k in self.levels
            ]
            split = [tables.mean([r[k] for r in rs if k in r], 1, "{:.2f}") for k in ("acr_all_wrong", "acr_all_right")]
            lines.append(f"| {m} | {len(rs)} | " + " | ".join(lv + split) + " |")
        return lines

    def per_seed_summary(
        self, results: list[dict], summary: dict, first_pass: dict | None, budget: int, before: float
    ) -> dict:
        """Both passes' numbers per method and seed, with their paired comparisons (each pass's and the
        pooled ones), in a file small enough to read: the study's answer without its per-problem
        records. ``summary`` is the report's (second-pass comparisons); ``first_pass`` the first pass's
        published results.json, whose comparisons were computed while its records existed."""

        def block(runs: list[dict], comparisons: dict, m: str) -> dict:
            rs = sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"])
            rows = [{"seed": r["seed"], **{k: r[k] for k in PER_SEED_KEYS if k in r}} for r in rs]
            vs = {k: v for k, v in comparisons.get(m, {}).items() if k.startswith("vs_")}
            return {"seeds": len(rows), "target_seeds": self.min_seeds[m], "runs": rows, **vs}

        def machine(runs: list[dict]) -> dict:  # every number names its CPU and precision
            return {"cpu": cpu_line(runs), "precision": precisions(runs)}

        first_runs = first_pass["runs"] if first_pass else []
        acc = {**self.first_set_pass1(first_runs, "first"), **self.first_set_pass1(results, "second")}
        out = {
            "budget_tokens": budget,
            "second_pass": {
                "before_pass1": before,
                **machine(results),
                "methods": {m: block(results, summary, m) for m in self.methods if m in summary},
            },
            "pooled_first_300": {
                m: {f"vs_{b}": c for b in self.baselines if (c := pooled_compare(acc, m, b))}
                for m in self.methods
                if any(k[1] == m for k in acc)
            },
        }
        if first_pass:
            done = [m for m in self.methods if any(r["method"] == m for r in first_runs)]
            out["first_pass"] = {
                "before_pass1": first_pass.get("before_pass1"),
                **machine(first_runs),
                "methods": {m: block(first_runs, first_pass.get("summary", {}), m) for m in done},
            }
        return out

    def load_first_pass(self) -> dict | None:
        return json.loads(self.first_pass.read_text()) if self.first_pass and self.first_pass.exists() else None

    def report(self, results: list[dict], before: float, out: Path, budget: int) -> str:
        """The tables (results.md), the comparisons and the evaluations before training (results.json),
        both passes per seed (per_seed.json), the plot and the ACR-vs-accuracy relation, into ``out``
        (the runs themselves are published one file each: ``store.publish_run``); returns the tables."""
        check_results(results, str(out))
        s = self.settings
        methods = [m for m in self.methods if any(r["method"] == m for r in results)]
        lr = f"{s['lr']:g}".replace("e-0", "e-")
        lines = [
            f"SmolLM2-135M-Instruct, synthetic arithmetic ({'/'.join(self.levels)}), {self.train_prompts} training "
            f"prompts, G={s['group_size']}, {s['prompts_per_step']} prompts/step, T={s['temperature']}, "
            f"{s['max_new_tokens']} new tokens, lr {lr}, async, {s['dtype']}; every run stops at the step where its "
            f"generated tokens reach {budget:,}. {self.heldout_line(results, before)} "
            f"{tables.SD_NOTE}. Differences are paired (same seeds, same problems, each level weighing the same): "
            "mean [95 % t interval over seeds], p = exact sign-flip over seeds (seeds).",
            "",
            "| method | seeds (target) | held-out pass@1 (%) | "
            + "".join(f"vs {b} (points) | " for b in self.baselines)
            + "steps | generated tokens | generated ÷ trained samples | raw ACR (first 3 steps) | raw ACR (trained) "
            "| effective ACR | train wall (min) |",
            "| --- | --- | --- |" + " --- |" * len(self.baselines) + " --- | --- | --- | --- | --- | --- | --- |",
        ]
        summary = {}
        for m in methods:
            rs = [r for r in results if r["method"] == m]
            cmp = {base: paired(results, m, base, self.level) for base in self.baselines}
            summary[m] = {
                "seeds": sorted(r["seed"] for r in rs),
                "heldout_pass1": [r["heldout_pass1"] for r in rs],
                "heldout_problems": [r.get("heldout_problems", self.heldout) for r in rs],
                **{f"vs_{b}": c for b, c in cmp.items()},
            }
            lines.append(
                f"| {m} | {len(rs)} ({self.min_seeds[m]}) | {mean_sd([r['heldout_pass1'] for r in rs], 100)} | "
                + "".join(f"{fmt_t(cmp[b])} | " for b in self.baselines)
                + f"{mean_sd([r['steps'] for r in rs], 1, '{:.1f}')} | "
                f"{mean_sd([r['generated_tokens'] for r in rs], 1, '{:.0f}')} | "
                f"{mean_sd([r['generated_per_trained'] for r in rs], 1, '{:.2f}')} | "
                f"{mean_sd([r['acr_start'] for r in rs], 1, '{:.2f}')} | {mean_sd([r['acr_raw'] for r in rs], 1, '{:.2f}')} | "
                f"{mean_sd([r['acr_effective'] for r in rs], 1, '{:.2f}')} | "
                f"{mean_sd([r['train_wall_min'] for r in rs], 1, '{:.1f}')} |"
            )
        lines += self.seed_and_level_tables(results, methods)
        lines += self.level_compare_table(results, methods)
        first_pass = self.load_first_pass()
        if first_pass:
            lines += self.pooled_table(results, first_pass["runs"], methods)
        greso = [r for r in results if r["greso"]]
        if greso:
            lines += [
                "",
                "| GRESO run | skipped / visited prompts | audited | false skips (mixed when audited) | "
                "p_easy, p_hard at the end |",
                "| --- | --- | --- | --- | --- |",
            ]
            for r in greso:
                g = r["greso"]
                visited = g.get("greso/skipped_cum", 0) + g.get("greso/kept_cum", 0)
                lines.append(
                    f"| {r['method']} seed {r['seed']} | {g.get('greso/skipped_cum', 0):.0f} / {visited:.0f} | "
                    f"{g.get('greso/audited_cum', 0):.0f} | {g.get('greso/false_skips_cum', 0):.0f} | "
                    f"{g.get('greso/p_easy', float('nan')):.2f}, {g.get('greso/p_hard', float('nan')):.2f} |"
                )
        lines += tables.precision_lines(results)
        lines.append(
            f"\nCPU: {cpu_line(results)}. Runs resumed after a kill (wall time not comparable): "
            f"{sum(r.get('resumed', False) for r in results)}."
        )
        table = "\n".join(lines) + "\n"
        (out / "results.md").write_text(table, encoding="utf-8")
        before_eval = {
            d: json.loads((out / d / "summary.json").read_text())
            for d in ("eval_before", "eval_before_extra")
            if (out / d / "summary.json").exists()
        }
        cells.write_json(
            out / "results.json",
            {
                "budget_tokens": budget,
                "before_pass1": before,
                "before_eval": before_eval,
                "summary": summary,
            },
        )
        cells.write_json(out / "per_seed.json", self.per_seed_summary(results, summary, first_pass, budget, before))
        self.write_acr_relation(results, first_pass, out)
        self.plot(results, before, out / "remedies.png")
        return table

    def write_acr_relation(self, results: list[dict], first_pass: dict | None, out: Path) -> None:
        """``acr_vs_accuracy.md``/``.json`` in ``out``: early raw ACR against final held-out accuracy
        over this study's runs (both passes on the first held-out set, the second pass on all of it)
        and the related studies' runs (``acr.relation``)."""
        order = list(self.methods)
        both = sorted([*(first_pass or {}).get("runs", []), *results], key=lambda r: order.index(r["method"]))
        first_set = [
            {**r, "heldout_pass1_first": r.get("heldout_pass1_first", r["heldout_pass1"])}
            for r in both
            if "heldout_pass1_first" in r or r.get("heldout_problems", self.heldout) == self.heldout
        ]
        full = self.heldout + self.heldout_extra
        samples = [
            acr.Sample(
                f"remedies, both passes, accuracy on the first {self.heldout} held-out problems (the set both "
                "evaluated)",
                first_set,
                "heldout_pass1_first",
            ),
            acr.Sample(
                f"remedies, second pass, accuracy on all {full:,} held-out problems",
                [r for r in both if r.get("heldout_problems", self.heldout) >= full],
                "heldout_pass1",
            ),
        ]
        for name, path in self.related:
            if path.exists():
                samples.append(acr.Sample.from_published(name, json.loads(path.read_text())))
        rel = acr.relation(samples)
        cells.write_json(out / "acr_vs_accuracy.json", rel)
        (out / "acr_vs_accuracy.md").write_text(acr.markdown(rel), encoding="utf-8")

    def plot(self, results: list[dict], before: float, path: Path) -> None:
        """Learning curves per method (mean over seeds, band ± sd) against generated tokens and wall
        time, the training reward and effective ACR against generated tokens, and the final held-out
        accuracy per seed."""
        import matplotlib
        import numpy as np

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        if not results:
            return
        methods = [m for m in self.methods if any(r["method"] == m for r in results)]
        # three rows of two (the sixth panel holds the legend), 1000 px wide: one row of five was 2400 px
        # and showed at under a third of its size on the docs page (about 700 px of content), unreadable
        fig, grid = plt.subplots(3, 2, figsize=(10, 11.5))
        axes, legend_ax = grid.flat[:5], grid.flat[5]
        tok_end = min(r["generated_tokens"] for r in results)
        tok_grid = np.linspace(0, tok_end, 60)
        for i, m in enumerate(methods):
            rs = [r for r in results if r["method"] == m]
            color, label = f"C{i}", f"{m} ({len(rs)})"
            pts = [np.array(_heldout_points(r, before)) for r in rs]
            _mean_band(axes[0], [q[:, 0] for q in pts], [q[:, 2] for q in pts], tok_grid, color, label, 100)
            wall_end = min(q[-1, 1] for q in pts) / 60  # the method's curve ends with its shortest run
            _mean_band(
                axes[1],
                [q[:, 1] / 60 for q in pts],
                [q[:, 2] for q in pts],
                np.linspace(0, wall_end, 60),
                color,
                label,
                100,
            )
            axes[1].scatter(
                [statistics.mean(q[-1, 1] / 60 for q in pts)],
                [statistics.mean(100 * q[-1, 2] for q in pts)],
                color=color,
                s=25,
                zorder=3,
            )
            curves = [([c["tokens"] for c in r["curve"]], [c["reward"] for c in r["curve"]]) for r in rs]
            _mean_band(axes[2], *zip(*curves), tok_grid, color, label)
            acr_curves = [([c["tokens"] for c in r["curve"]], [c["acr_effective"] for c in r["curve"]]) for r in rs]
            _mean_band(axes[3], *zip(*acr_curves), tok_grid, color, label)
            ys = [100 * r["heldout_pass1"] for r in rs]
            axes[4].bar(i, statistics.mean(ys), color=color, alpha=0.6)
            axes[4].scatter([i] * len(ys), ys, color="k", s=10, zorder=3)
        axes[0].set(
            xlabel="generated tokens",
            ylabel="held-out pass@1 (%)",
            title="held-out vs generated tokens (mean ± sd over seeds)\nmiddle points: 60-problem subset, n=2",
        )
        axes[1].set(
            xlabel="wall time since the first generation (min)",
            ylabel="held-out pass@1 (%)",
            title="held-out vs wall time\n(dot: mean end of the method's runs)",
        )
        axes[2].set(xlabel="generated tokens", ylabel="mean training reward", title="training reward (trained batches)")
        axes[3].set(xlabel="generated tokens", ylabel="effective ACR", title="effective ACR (trained batches)")
        axes[4].set_xticks(range(len(methods)), methods, rotation=30)
        axes[4].set(ylabel="held-out pass@1 (%)", title="final held-out (dots: seeds)")
        for ax in axes:
            ax.grid(alpha=0.3)
        for ax in (axes[0], axes[2], axes[3]):  # "16000" beside "14000" ran together at this width
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))
        legend_ax.axis("off")
        legend_ax.legend(
            *axes[0].get_legend_handles_labels(), loc="center", title="method (seeds)", fontsize=11, title_fontsize=11
        )
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)

    # ── the command ──

    def main(self, argv: list[str] | None = None) -> int:
        p = cells.study_parser(
            __doc__.split("\n\n")[0],
            "runs/remedies",
            list(self.methods),
            None,
            "the repository's results folder: each finished run (runs/<method>_seed<k>.json, with its "
            "per-problem records), results.md/json, the plot and the ACR relation are written there "
            "after every finished run, and the runs it holds are not run again (a study resumes from "
            "it when the run folder is gone)",
        )
        p.add_argument("--budget", type=int, default=self.token_budget, help="generated tokens per run")
        p.add_argument(
            "--per-seed-json",
            help="also write both passes' numbers per method and seed, with the "
            "paired comparisons, to this file (no per-problem records: small enough to read)",
        )
        args = p.parse_args(argv)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.check_flags:
            train, heldout, _ = self.make_data(out / "data")
            cells_ = {m: self.study_args(m, 0, args.budget) for m in args.methods}
            refused = cells.check_flags(cells_, args.model, train, heldout, out / "check_flags")
            print(
                f"[remedies] flags refused: {', '.join(refused)}"
                if refused
                else "[remedies] every method's flags parse"
            )
            return 1 if refused else 0
        published = Path(args.publish) if args.publish else None
        if published:
            restored = restore_before_eval(out, published)
            if restored:
                print(f"[remedies] restored from {published}: {', '.join(restored)}", flush=True)
        data = self.make_data(out / "data")
        full = self.heldout + self.heldout_extra

        def publish() -> None:
            if published:  # this folder's runs (an extended evaluation included), then every published one
                for f in sorted(out.glob("*_seed*/result.json")):
                    store.publish_run(json.loads(f.read_text()), published, self.settings["eval_n"])
            results = store.collect(out, published)
            before = self.before_pass1(out, all(r.get("heldout_problems", self.heldout) >= full for r in results))
            print(self.report(results, before, out, args.budget), flush=True)
            if published:
                for name in PUBLISHED:
                    if (out / name).exists():
                        shutil.copy(out / name, published / name)
            if args.per_seed_json and (out / "per_seed.json").exists():
                shutil.copy(out / "per_seed.json", args.per_seed_json)

        if not args.report_only:
            from avspo_openrlhf.cpu.models import prepare

            model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
            base = self.study_args(next(iter(self.methods)), 0, args.budget)
            qs.evaluate_heldout(model, data[1], out / "eval_before", base, out / "log.txt")
            qs.evaluate_heldout(model, data[2], out / "eval_before_extra", base, out / "log.txt")
            # a run published (from another machine) and absent here is finished: not run again
            elsewhere = {(r["method"], r["seed"]) for r in store.read_runs(published)} if published else set()
            todo = [
                (m, s)
                for m, s in self.order(args.methods, args.seeds)
                if (m, s) not in elsewhere or (out / f"{m}_seed{s}" / "result.json").exists()
            ]
            for i, (m, s) in enumerate(todo):
                print(f"[remedies] {i + 1}/{len(todo)}: {m} seed {s}", flush=True)
                fresh = not (out / f"{m}_seed{s}" / "result.json").exists()
                self.run_one(m, s, out, model, data, args.budget)
                if fresh:
                    publish()  # partial results as they come, each cell with its seed count
        publish()
        return 0
