"""Which remedy for advantage collapse? Many seeds per arm at equal generated tokens, many runs at
once on one GPU (or the nodes of a cluster): the study loop (``study/loop.py``) run by the
scheduler (``study/scheduler.py``), compared and reported here.

Every run trains the same model on the same data with the same settings and stops at the same
generated-token budget; arms differ only in their :class:`~avspo_openrlhf.study.spec.Arm`. A
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

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study import compare, store
from avspo_openrlhf.study.compare import (
    FAIL_ATTEMPTS,
    MARGIN,
    probability_of_improvement,
    rule,
)
from avspo_openrlhf.study.fingerprint import settings_difference, settings_hash
from avspo_openrlhf.study.remedies_gpu_cli import StudyCommand
from avspo_openrlhf.study.remedies_gpu_report import (
    StudyReport,
    acted,
    greedy_view,
    paired_t,
    swapped,
    tokens_to_target,
    wall_time_is_the_arms,
)
from avspo_openrlhf.study.scheduler import Job
from avspo_openrlhf.study.spec import (
    PERFORMANCE_ONLY,
    Arm,
    RunSpec,
    StudySettings,
    check_loop_arm,
    code_commit,
    device_and_dtype,
    device_name,
)
from avspo_openrlhf.study.store import StudyError, check_pairable, level_lookup


@dataclass(frozen=True)
class GPURemediesStudy(StudyReport, StudyCommand):
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
    frozen_file: str | None = None  # a file holding the commit the study's runs must come from (--take checks it)
    runs_per_slot: int | None = None  # runs one GPU slot makes (the incomplete banner's slots still needed)
    margin: float = MARGIN  # "no difference larger than margin": an interval at its Holm level inside +-margin
    # exploratory paired contrasts beside the comparisons with the base: (arm, other, what it isolates)
    contrasts: tuple[tuple[str, str, str], ...] = ()
    planning_sd: float | None = None  # the per-seed paired sd the primary seeds were sized for (the power statement)

    def __post_init__(self):
        names = set(self.seeds) | set(self.primary) | set(self.pilot) | {self.base, self.second_base}
        unknown = (names | set(self.lr_check.get("arms", ()))) - set(self.arms)
        if unknown:
            raise ValueError(f"GPURemediesStudy: arms {sorted(unknown)} are not in arms")
        if self.base not in self.primary:
            raise ValueError(f"GPURemediesStudy: the base {self.base!r} must be one of the primary arms")
        stray = {a for x, y, _ in self.contrasts for a in (x, y)} - set(self.arms)
        if stray:
            raise ValueError(f"GPURemediesStudy.contrasts: arms {sorted(stray)} are not in arms")
        if not 0 < self.margin < 1:
            raise ValueError(f"GPURemediesStudy.margin: a difference in pass@1 in (0, 1), got {self.margin}")
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
            write_jsonl(rows, str(path))  # atomic: a study beside a --report-only reads whole files
            paths.append(str(path))
        return paths[0], paths[1], paths[2]

    def near_duplicates(self, heldout_hash: str | None) -> frozenset[str]:
        """The held-out ids whose problem is a training prompt with its operands swapped (``a + b`` for
        ``b + a``: distinct problems, one answer), for the sensitivity row; empty when the runs' held-out
        set (by its content hash) is not this study's own."""
        import tempfile

        from avspo_openrlhf.study.fingerprint import file_sha256
        from avspo_openrlhf.study.loop import read_rows

        with tempfile.TemporaryDirectory() as tmp:
            train, heldout, _ = self.make_data(Path(tmp))
            if file_sha256(heldout) != heldout_hash:
                return frozenset()
            seen = {r["problem"] for r in read_rows(train)}
            return frozenset(r["unique_id"] for r in read_rows(heldout) if swapped(r["problem"]) in seen)

    def problem_levels(self, heldout: str | None = None) -> dict[str, str]:
        """``unique_id -> level`` of every problem the study scores, its held-out set (or ``heldout``,
        a user's file in its place) and its validation set: each row's ``level`` field
        (``task.level_of``, the rule the runs' level-weighted pass@1 read too)."""
        import tempfile

        from avspo_openrlhf.study.task import levels_by_id, read_rows

        with tempfile.TemporaryDirectory() as tmp:
            _, made, validation = self.make_data(Path(tmp))
            return levels_by_id(r for path in dict.fromkeys((heldout or made, validation)) for r in read_rows(path))

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
    def keep_failure(run_dir: Path, published: Path | None, export: str | None) -> None:
        """A run's record of its own failed launches (``failure.json``), published under ``failures/`` and
        exported as ``<run>.failure.json``: the next machine starts from its count (:meth:`restore_failure`)."""
        text = (run_dir / "failure.json").read_text(encoding="utf-8")
        for path in (
            published / "failures" / f"{run_dir.name}.json" if published else None,
            Path(export) / f"{run_dir.name}.failure.json" if export else None,
        ):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, text)

    @staticmethod
    def restore_failure(run_dir: Path, published: Path | None) -> None:
        """The published count of a run's failed launches into its folder, where it is larger (a run that
        failed on one GPU slot is launched afresh on the next machine: its launches add up)."""
        src = published / "failures" / f"{run_dir.name}.json" if published else None
        if src is None or not src.exists():
            return
        here = run_dir / "failure.json"
        attempts = json.loads(here.read_text(encoding="utf-8"))["attempts"] if here.exists() else 0
        if json.loads(src.read_text(encoding="utf-8"))["attempts"] > attempts:
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(here, src.read_text(encoding="utf-8"))

    @staticmethod
    def failures(out: Path, published: Path | None = None) -> dict[str, list[str]]:
        """Runs that stopped without a result and have not failed for good (they resume when started
        again), per arm, each said in words: an error of its own (``failure.json``: launches so far,
        the error), a crash of the process it shared (``crashed.json``: exit code, the log holding it),
        or a traceback in its log (a run of an earlier version); and the published records of runs that
        stopped on another machine (``<published>/failures/``, :meth:`keep_failure`)."""
        failed: dict[str, list[str]] = {}
        done = {f"{r['method']}_seed{r['seed']}" for r in (store.read_runs(published) if published else [])}
        here = {d.name for d in out.glob("*_seed*")}
        for f in sorted((published / "failures").glob("*_seed*.json")) if published else []:
            if f.stem in done or f.stem in here:
                continue
            arm, _, seed = f.stem.rpartition("_seed")
            r = json.loads(f.read_text(encoding="utf-8"))
            failed.setdefault(arm, []).append(
                f"seed {seed}: its own error in {r['attempts']} launch(es) elsewhere, last {r['error']!r}"
            )
        for d in sorted(out.glob("*_seed*")):
            if (d / "result.json").exists() or (d / "failed.json").exists() or d.name in done:
                continue
            arm, _, seed = d.name.rpartition("_seed")
            own, crash, log = d / "failure.json", d / "crashed.json", d / "log.txt"
            if own.exists() and (not crash.exists() or own.stat().st_mtime >= crash.stat().st_mtime):
                f = json.loads(own.read_text(encoding="utf-8"))
                said = f"seed {seed}: its own error in {f['attempts']} launch(es), last {f['error']!r}"
            elif crash.exists():
                c = json.loads(crash.read_text(encoding="utf-8"))
                said = f"seed {seed}: its process crashed (exit {c['exit_code']}, see {c['log']})"
            elif log.exists() and "Traceback" in log.read_text(errors="replace"):
                said = f"seed {seed}: a traceback in {log}"
            else:
                continue
            failed.setdefault(arm, []).append(said)
        return failed

    def frozen_commit(self) -> str | None:
        """The commit the study's runs must come from (:attr:`frozen_file`), or None before the freeze."""
        if self.frozen_file is None or not Path(self.frozen_file).is_file():
            return None
        return Path(self.frozen_file).read_text(encoding="utf-8").strip()

    def take(self, folder: Path, published: Path) -> str:
        """Publish the run files of ``folder`` (runs made elsewhere: a GPU slot, another machine) after
        checking every one, all or none: its commit is the frozen one, its settings are the study's
        (the performance-only ones and the engine aside) and pair with what is published (one hash),
        its device is named, it is a planned run of the study (or of its learning-rate check, published
        under ``lr_check/``), and a run already published is skipped when identical and refused when
        not. ``<run>.failure.json`` files (a run's failed launches elsewhere) are published under
        ``failures/`` where they count more launches. Returns what it did, in words."""
        runs = sorted(f for f in folder.glob("*_seed*.json") if not f.name.endswith(".failure.json"))
        fails = sorted(folder.glob("*_seed*.failure.json"))
        if not runs and not fails:
            raise StudyError(f"--take: no <arm>_seed<k>.json run files in {folder}")
        frozen, lr_arms = self.frozen_commit(), self.lr_arms()
        own = {k: v for k, v in asdict(self.settings).items() if k not in (*PERFORMANCE_ONLY, "engine")}
        taken: dict[Path, list[dict]] = {}
        same, problems = 0, []
        for f in runs:
            r = store.read_run(f)
            method, seed = r.get("method"), r.get("seed")
            dest = published / "lr_check" if method in lr_arms else published
            planned = self.lr_check.get("seeds", 0) if method in lr_arms else self.seeds.get(method, 0)
            if not isinstance(seed, int) or not 0 <= seed < planned:
                problems.append(f"{f.name}: {method} seed {seed} is not a planned run of this study")
                continue
            if frozen is not None and r.get("commit") != frozen:
                problems.append(f"{f.name}: commit {r.get('commit')!r}, not the frozen {frozen}")
            if not r.get("device"):
                problems.append(f"{f.name}: no device recorded")
            ran = {k: v for k, v in (r.get("settings") or {}).get("settings", {}).items() if k in own}
            if ran != own:
                diff = settings_difference(own, ran)
                problems.append(f"{f.name}: not the study's settings ({'; '.join(diff[:3]) or 'no settings'})")
            old = store.run_file(dest, method, seed)
            if old.exists():
                if old.read_bytes() != f.read_bytes():
                    problems.append(f"{f.name}: {method} seed {seed} is published already with other content")
                else:
                    same += 1
                continue
            taken.setdefault(dest, []).append(r)
        for dest, rs in taken.items():
            try:
                compare.check_results(rs, str(folder))
                check_pairable(store.collect(folder / "__none__", dest) + rs)
            except ValueError as e:  # a file of another version, or runs of other settings
                problems.append(str(e))
        if problems:
            raise StudyError("--take refused every run (nothing published):\n  " + "\n  ".join(problems))
        for dest, rs in taken.items():
            for r in rs:
                self.publish_run(r, dest)
        counted = 0
        for f in fails:  # a run's failed launches: the larger count wins (each machine counts from the last)
            name = f.name.removesuffix(".failure.json")
            rec, old = json.loads(f.read_text(encoding="utf-8")), published / "failures" / f"{name}.json"
            if not old.exists() or rec["attempts"] > json.loads(old.read_text(encoding="utf-8"))["attempts"]:
                old.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(old, json.dumps(rec))
                counted += 1
        return (
            f"[study] took {sum(map(len, taken.values()))} runs into {published} ({same} published already, "
            f"identical); {counted} records of failed launches"
        )

    def failed_for_good(self, job: Job, precision: str) -> dict | None:
        """The record of a run that failed on an error of its own in :data:`FAIL_ATTEMPTS` launches,
        scored by the rule fixed before the runs (its last mid-run evaluation's pass@1, or 0 before
        any), written beside it as ``failed.json``; None while it may still be resumed."""
        path = job.run_dir / "failure.json"
        if job.done() or not path.exists():
            return None
        f = json.loads(path.read_text(encoding="utf-8"))
        if f["attempts"] < FAIL_ATTEMPTS:
            return None
        evals_file = job.run_dir / "mid_evals.json"
        evals = json.loads(evals_file.read_text(encoding="utf-8")) if evals_file.exists() else []
        last = evals[-1] if evals else None
        record = {**job.spec.settings_record(), "precision": precision}
        r = {
            "method": job.spec.method,
            "seed": job.spec.seed,
            "failed": True,
            "attempts": f["attempts"],
            "error": f["error"],
            "heldout_pass1": last["pass1"] if last else 0.0,
            "score_rule": (
                f"its last mid-run evaluation (step {last['step']}, {last['tokens']:,} tokens)"
                if last
                else "0: no mid-run evaluation before it failed"
            ),
            "mid_evals": evals,
            "arm": asdict(job.spec.arm),
            "settings": record,
            "settings_hash": settings_hash(record),
            "commit": code_commit(),
            "device": device_name(device_and_dtype(job.spec.settings)[0]),
        }
        atomic_write(job.run_dir / "failed.json", json.dumps(r, indent=1))
        return r

    def publish_run(self, r: dict, published: Path) -> None:
        store.publish_run(r, published, r.get("eval_n", self.settings.eval_n))

    def split_planned(self, results: list[dict]) -> tuple[list[dict], list[dict]]:
        """``(planned, extra)``: the runs of each arm's planned seeds 0 .. n - 1, which every table and
        the verdict read, and those beyond them (a labelled table of their own, never a verdict: a
        verdict over whatever seeds exist would allow stopping when it suits and replacing a seed)."""
        planned, extra = [], []
        for r in results:
            (planned if 0 <= r["seed"] < self.seeds.get(r["method"], 0) else extra).append(r)
        return planned, extra

    def summary(
        self, results: list[dict], exclude: frozenset[str] = frozenset(), level: Callable[[str], str] | None = None
    ) -> dict:
        """Per arm: its numbers and its paired comparisons (the report's tables, as data), from the
        planned seeds' runs (:meth:`split_planned`); ``exclude``: held-out ids left out of the
        sensitivity comparison (near-duplicates of training prompts); ``level``: a problem's level
        (default: of the study's own problems, :meth:`problem_levels`)."""
        level = level or level_lookup(self.problem_levels())
        out = {}
        base_seeds = {r["seed"] for r in results if r["method"] == self.base}
        greedy = greedy_view(results)
        for arm in self.arms:
            rs = sorted((r for r in results if r["method"] == arm), key=lambda r: r["seed"])
            if not rs:
                continue
            ok = [r for r in rs if not compare.failed(r)]
            paired = [r for r in rs if r["seed"] in base_seeds]
            ttt = [tokens_to_target(r, self.target) for r in rs]
            x = [
                [r["heldout_by_level"].get(lv, math.nan) for lv in self.levels] for r in paired if not compare.failed(r)
            ]
            y = [
                [r["heldout_by_level"].get(lv, math.nan) for lv in self.levels]
                for r in sorted(results, key=lambda r: r["seed"])
                if r["method"] == self.base and not compare.failed(r)
            ]
            # wall time is an arm's cost only where its runs ran alone or beside runs of their own arm
            alone = [r for r in ok if wall_time_is_the_arms(r)]
            out[arm] = {
                "seeds": len(rs),
                "seeds_planned": self.seeds.get(arm, 0),
                "seed_list": [r["seed"] for r in rs],
                "heldout_pass1": [r["heldout_pass1"] for r in rs],
                "heldout_pass1_paired": [r["heldout_pass1"] for r in paired],
                "vs_" + self.base: paired_t(results, arm, self.base, level),
                "vs_" + self.second_base: paired_t(results, arm, self.second_base, level),
                "greedy_vs_" + self.base: paired_t(greedy, arm, self.base, level),
                "heldout_greedy_pass1": [r["heldout_pass1"] for r in greedy if r["method"] == arm],
                "near_duplicates_out_vs_" + self.base: paired_t(
                    results, arm, self.base, level, lambda k: k not in exclude
                )
                if exclude
                else None,
                "by_level_vs_" + self.base: {
                    lv: paired_t(results, arm, self.base, level, lambda k, lv=lv: level(k) == lv) for lv in self.levels
                },
                "poi_vs_" + self.base: probability_of_improvement(x, y) if arm != self.base else None,
                "acted_vs_" + self.base: acted(results, arm, self.base) if arm != self.base else None,
                "steps": [r["steps"] for r in ok],
                "generated_tokens": [r["generated_tokens"] for r in ok],
                "update_tokens": [r["update_tokens"] for r in ok if "update_tokens" in r],
                "tokens_to_target": {"reached": sum(math.isfinite(t) for t in ttt), "median": statistics.median(ttt)},
                "signal_groups_per_mtok": [r["signal_groups_per_mtok"] for r in ok],
                "acr_generated": [r["acr_generated"] for r in ok],
                "acr_effective": [r["acr_effective"] for r in ok],
                "truncation_rate": [r["truncation_rate"] for r in ok],
                "completion_tokens_mean": [r["completion_tokens_mean"] for r in ok],
                "train_min": [r["train_s"] / 60 for r in alone],
                "train_min_runs": f"{len(alone)}/{len(ok)}",
                "flagged_seeds": [r["seed"] for r in ok if r["flagged"]],
                "skipped_step_seeds": {r["seed"]: len(r["nonfinite_steps"]) for r in ok if r["nonfinite_steps"]},
                "failed_for_good": {r["seed"]: r["score_rule"] for r in rs if compare.failed(r)},
            }
        return out

    def decide(self, summary: dict) -> dict:
        """The decision rule (:func:`rule`, fixed before the runs) on the primary family's planned
        seeds: Holm over the whole family (a comparison without runs counts as p = 1), each
        comparison's interval at its Holm level, and no verdict at all until every primary arm holds
        each of its planned seeds (a finished run or, failed for good, the rule's score)."""
        key = "vs_" + self.base
        per_seed = {a: (summary.get(a, {}).get(key) or {}).get("per_seed") for a in self.family}
        res = rule(per_seed, self.margin)
        missing_seeds = {
            a: [k for k in range(self.seeds.get(a, 0)) if k not in summary.get(a, {}).get("seed_list", [])]
            for a in self.primary
        }
        complete = not any(missing_seeds.values())
        fewest = compare.fewest_seeds(len(self.family))
        acted_by = {a: summary.get(a, {}).get("acted_vs_" + self.base) for a in self.family}

        def words(a: str, r: dict) -> str:
            if not complete:
                return "no verdict yet"
            n = self.seeds.get(a, 0)
            if acted_by.get(a) is False:  # before the seeds: a remedy that never acted says nothing at any n
                return self.verdict_words("never_acted")
            if n < fewest:  # the plan's, fixed before the runs: not what they gave
                return (
                    f"no verdict: too few seeds ({n}; the exact sign-flip p of {n} seeds is at least "
                    f"{2.0 ** (1 - n):.3g}, and Holm over {len(self.family)} needs it below "
                    f"{compare.ALPHA / len(self.family):.3g}: plan at least {fewest})"
                )
            return self.verdict_words(r["verdict"])

        return {
            "complete": complete,
            "missing": {a: len(m) for a, m in missing_seeds.items()},
            "missing_seeds": missing_seeds,
            "fewest_seeds": fewest,
            "holm": {a: r["holm"] for a, r in res.items()},
            "rule": res,
            "verdicts": {a: words(a, r) for a, r in res.items()},
        }
