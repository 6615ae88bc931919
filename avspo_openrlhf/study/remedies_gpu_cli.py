"""The GPU remedies study's command line (``GPURemediesStudy``'s command half, mixed into it): its
flags, the run of the planned (arm, seed) runs through the scheduler under a deadline, rebuilding the
report from what is published, and the throughput measurement that sizes K."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study import store
from avspo_openrlhf.study.fingerprint import settings_difference, settings_hash
from avspo_openrlhf.study.scheduler import Job, measure_throughput, run_jobs
from avspo_openrlhf.study.spec import (
    StudySettings,
    device_and_dtype,
)
from avspo_openrlhf.study.store import StudyError

STARTED = time.monotonic()  # when this command started (its imports first): --finish-by counts from here


class StudyCommand:
    """The command's methods of :class:`~avspo_openrlhf.study.remedies_gpu.GPURemediesStudy`."""

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
        levels = self.problem_levels(args.heldout)  # a user's --heldout in place of the study's set
        return self.report(results, published or out, self.failures(out, published), lr, exclude, levels)

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
