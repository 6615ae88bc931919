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

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study import compare, store, tables
from avspo_openrlhf.study.compare import (
    ALPHA,
    MARGIN,
    detectable_effect,
    equivalence_chance,
    power_at,
    probability_of_improvement,
    rule,
)
from avspo_openrlhf.study.fingerprint import settings_difference, settings_hash
from avspo_openrlhf.study.scheduler import Job, measure_throughput, run_jobs
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

STARTED = time.monotonic()  # when this command started (its imports first): --finish-by counts from here
# a run that fails on an error of its own in this many launches has failed for good: it is scored by the
# rule (its last mid-run evaluation, or 0) and never run again nor replaced; a crash of the process it
# shared with others (out of memory, a kill) is not its failure and does not count
FAIL_ATTEMPTS = 2


class StudyError(ValueError):
    """A study's runs cannot be compared as they are (mixed settings): the message says why."""


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


def wall_time_is_the_arms(r: dict) -> bool:
    """Whether a run's wall time measures its arm: it ran alone, or beside runs of its own arm only
    (in a stacked batch the runs advance in lockstep, so a run waits for its companions' refills)."""
    b = r.get("batch") or {}
    return b.get("runs_at_once") == 1 or b.get("methods") == [r["method"]]


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
            write_jsonl(rows, str(path) + ".tmp")
            Path(str(path) + ".tmp").replace(path)  # a study beside a --report-only reads whole files
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

    def summary(self, results: list[dict], exclude: frozenset[str] = frozenset()) -> dict:
        """Per arm: its numbers and its paired comparisons (the report's tables, as data), from the
        planned seeds' runs (:meth:`split_planned`); ``exclude``: held-out ids left out of the
        sensitivity comparison (near-duplicates of training prompts)."""
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
                "vs_" + self.base: paired_t(results, arm, self.base),
                "vs_" + self.second_base: paired_t(results, arm, self.second_base),
                "greedy_vs_" + self.base: paired_t(greedy, arm, self.base),
                "heldout_greedy_pass1": [r["heldout_pass1"] for r in greedy if r["method"] == arm],
                "near_duplicates_out_vs_" + self.base: paired_t(results, arm, self.base, lambda k: k not in exclude)
                if exclude
                else None,
                "by_level_vs_" + self.base: {
                    lv: paired_t(results, arm, self.base, lambda k, lv=lv: level_of(k) == lv) for lv in self.levels
                },
                "poi_vs_" + self.base: probability_of_improvement(x, y) if arm != self.base else None,
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
            "identical": f"identical to {self.base} (the remedy changed no run)",
        }.get(verdict, verdict)

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
        return {
            "complete": complete,
            "missing": {a: len(m) for a, m in missing_seeds.items()},
            "missing_seeds": missing_seeds,
            "holm": {a: r["holm"] for a, r in res.items()},
            "rule": res,
            "verdicts": {a: self.verdict_words(r["verdict"]) if complete else "no verdict yet" for a, r in res.items()},
        }

    def power_lines(self, summary: dict) -> list[str]:
        """What the rule can tell at the planned seeds: from the planning sd, and from each primary
        comparison's measured sd, the minimum detectable effect at 80 % power and the power at 3 and 5
        points, for the rule as coded (one real effect in the Holm family: tested at alpha / m)."""
        m = len(self.family)
        rows = []

        def row(label: str, seeds: str, sd: float, n: int, halfwidth: str) -> str:
            mde, p3, p5 = detectable_effect(sd, n, m), power_at(0.03, sd, n, m), power_at(0.05, sd, n, m)
            return (
                f"| {label} | {seeds} | {100 * sd:.1f} | {halfwidth} | {n} | "
                f"{'-' if mde is None else f'{100 * mde:.1f}'} | {'-' if p3 is None else f'{100 * p3:.0f} %'} | "
                f"{'-' if p5 is None else f'{100 * p5:.0f} %'} |"
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
            "tests/test_study_design.py simulates it):",
            "",
            "| comparison | seeds now | sd | 95 % half-width now | seeds planned | detectable effect | power at 3 | "
            "power at 5 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
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
    ) -> str:
        """``results.md``, ``results.json`` (the summary, no per-problem records) and the plot in ``out``;
        ``failed``: the runs that stopped and resume when started again (:meth:`failures`); ``exclude``:
        the held-out ids of the sensitivity row (near-duplicates of training prompts)."""
        record = check_pairable(results)
        results, extra = self.split_planned(results)
        summary = self.summary(results, exclude)
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
        for x, y, why in self.contrasts:
            if x in summary and y in summary:
                lines.append(f"| {x} vs {y}: {why} | | | {tables.fmt_t(paired_t(results, x, y))} | |")
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
            lines += ["", *self.lr_lines(lr_results)]
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

    def lr_lines(self, lr_results: list[dict]) -> list[str]:
        """The learning-rate check: each checked arm's validation pass@1 per learning rate, and each rate
        against the study's own on the same seeds (paired: the seeds draw the same random numbers)."""
        by: dict[str, list[float]] = {}
        for r in lr_results:
            by.setdefault(r["method"], []).append(r["heldout_pass1"])
        rows = []
        for m, v in sorted(by.items()):
            arm, _, _ = m.partition("@lr=")
            own = f"{arm}@lr={self.settings.lr:g}"
            vs = "-" if m == own else tables.fmt_t(paired_t(lr_results, m, own))
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
            "--finish-by",
            type=float,
            metavar="MIN",
            help="start a run (a batch, with the stacked engine) only if it is expected to end within MIN minutes "
            "of this command's start: as long as the longest one so far in this call, or --batch-minutes for the "
            "first. A call with a hard time limit (a GPU slot) then ends with its runs finished, not cut",
        )
        p.add_argument(
            "--batch-minutes",
            type=float,
            metavar="EST",
            help="the expected minutes of the first run (batch) for --finish-by (default: unknown, it starts)",
        )
        p.add_argument(
            "--export",
            metavar="DIR",
            help="also write each finished run's file into DIR as soon as it finishes (what a time-limited "
            "call brings back: DIR/<arm>_seed<k>.json, as --publish keeps it under runs/; a call killed at its "
            "limit keeps those already written)",
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
            "--design",
            action="store_true",
            help="write what the verdict licenses at the planned seeds (design.md in --publish or --out: the power "
            "and detectable effect of the rule as coded, the chance of each verdict) and exit",
        )
        p.add_argument(
            "--take",
            metavar="DIR",
            help="publish the run files in DIR (<arm>_seed<k>.json, as a GPU slot or another machine returns "
            "them) into --publish after checking each: made from the study's frozen commit, of the settings hash "
            "the published runs share, on a named device, one of the study's planned runs, and not published "
            "already with other content (nothing is run twice, nothing of another commit or hash mixed in)",
        )
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
        for flag in ("finish_by", "batch_minutes", "start_runs_for"):
            if getattr(args, flag) is not None and not getattr(args, flag) > 0:
                p.error(f"--{flag.replace('_', '-')} must be > 0 minutes, got {getattr(args, flag)}")
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
            if args.design:
                dest = published or out
                dest.mkdir(parents=True, exist_ok=True)
                atomic_write(dest / "design.md", "\n".join(self.design_lines()) + "\n")
                print((dest / "design.md").read_text(encoding="utf-8"), end="", flush=True)
                return 0
            if args.take:
                if published is None:
                    p.error("--take needs --publish (the folder the runs go into)")
                print(self.take(Path(args.take), published), flush=True)
                return self._report_only(args, out, published)
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
        results = self.collect(out, published)
        exclude = self.near_duplicates(results[0]["settings"].get("heldout")) if results else frozenset()
        return self.report(results, published or out, self.failures(out, published), lr, exclude)

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
            except Exception as e:  # noqa: BLE001  the runs are published: a report is made again with --report-only
                return f"[study] no report here ({type(e).__name__}: {e}); rebuild it with --report-only"

        def keep(r: dict) -> None:
            """A finished run, or one that failed for good: published, and exported at once (a call killed at
            its limit has returned it); no report per run (it would delay the next one's export)."""
            if published is not None:
                self.publish_run(r, published)
            if args.export:
                store.write_run(r, Path(args.export) / f"{r['method']}_seed{r['seed']}.json", r.get("eval_n", 1))

        def on_done(job: Job, rc: int) -> None:
            r = job.result() if job.done() else self.failed_for_good(job, precision)
            if r is not None:
                keep(r)
            elif (job.run_dir / "failure.json").exists():  # its own error, to resume: its launches travel too
                self.keep_failure(job.run_dir, published, args.export)

        # runs finished here and not published (a call killed while its engine went on): kept now
        have = {(r["method"], r["seed"]) for r in (store.read_runs(published) if published else [])}
        for r in finished:
            if (r["method"], r["seed"]) not in have:
                keep(r)
        # a run's failed launches so far, wherever they were (published from another machine): its rule counts all
        for job in jobs:
            self.restore_failure(job.run_dir, published)
        started = STARTED  # the deadline counts the command's own start-up: the model's conversion, the data
        failed = run_jobs(
            jobs,
            args.k,
            threads=args.threads,
            on_done=on_done,
            start_until=started + 60 * args.start_runs_for if args.start_runs_for is not None else None,
            finish_by=started + 60 * args.finish_by if args.finish_by is not None else None,
            first_launch_s=60 * args.batch_minutes if args.batch_minutes is not None else None,
            engine=args.engine,
        )
        print(report(), flush=True)
        failed = [name for name in failed if not (out / name / "failed.json").exists()]
        if failed:
            print(
                f"[study] {len(failed)} runs stopped without a result (started again, each resumes from its "
                f"checkpoint; the report says why each stopped): {', '.join(failed)}",
                file=sys.stderr,
            )
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
