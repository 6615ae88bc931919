"""Which remedy for advantage collapse? Many seeds per arm at equal generated tokens, many runs at
once on one GPU (or the nodes of a cluster): the study loop (``study/loop.py``) run by the
scheduler (``study/scheduler.py``), compared and reported here.

Every run trains the same model on the same data with the same settings and stops at the same
generated-token budget; arms differ only in their :class:`~avspo_openrlhf.study.loop.Arm`. A
finished run is written to ``<out>/<arm>_seed<k>/result.json`` and, with ``--publish DIR``, to
``DIR/runs/<arm>_seed<k>.json`` with its per-problem records; a run found in either place is not run
again, so the study resumes later, on another machine, or as a Slurm array
(``launch_scripts/slurm/remedies_study_array.sbatch``: ``--shard I/N`` gives each task its share of
the runs, all publishing into one folder). ``--report-only`` rebuilds the tables and the plot from
what is published. The primary comparison is fixed in the study's configuration
(``experiments/remedies_gpu/run.py``) before any run: each remedy against GRPO, held-out pass@1 at
equal generated tokens, paired by seed and problem, t interval over seeds and exact sign-flip p."""

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
from avspo_openrlhf.study import tables
from avspo_openrlhf.study.compare import paired_diffs
from avspo_openrlhf.study.loop import Arm, RunSpec, Settings, atomic_write
from avspo_openrlhf.study.scheduler import Job, measure_throughput, run_jobs


def seeds_for_halfwidth(sd: float, halfwidth: float, max_n: int = 1000) -> int | None:
    """The fewest seeds n whose 95 % t interval of a mean difference with standard deviation ``sd``
    has a half-width of at most ``halfwidth`` (t quantile with n - 1 degrees of freedom); None past
    ``max_n``."""
    for n in range(2, max_n + 1):
        if stats.t_quantile(0.975, n - 1) * sd / math.sqrt(n) <= halfwidth:
            return n
    return None


def paired_t(results: list[dict], method: str, base: str, keep=None) -> dict | None:
    """``method`` - ``base`` paired by seed (each seed's mean difference over the held-out problems
    both runs hold; ``keep(unique_id)`` restricts the problems): mean, sd, 95 % t interval over the
    seeds, exact sign-flip p; None for a method against itself or below two common seeds."""
    a = [r for r in results if r["method"] == method]
    b = [r for r in results if r["method"] == base]
    if keep is not None:
        a, b = ([{**r, "per_problem": {k: v for k, v in r["per_problem"].items() if keep(k)}} for r in rs]
                for rs in (a, b))  # fmt: skip
    d = paired_diffs(a, b) if a and b else None
    if method == base or d is None or d.shape[0] < 2 or d.shape[1] == 0:
        return None
    per_seed = [float(x) for x in d.mean(axis=1)]
    mean, sd, lo, hi = stats.t_interval(per_seed)
    return {"seeds": len(per_seed), "diff": mean, "sd": sd, "ci95": [lo, hi], "halfwidth": (hi - lo) / 2,
            "p_sign_flip": stats.sign_flip_p(per_seed)}  # fmt: skip


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of the p-values of a family of comparisons (name -> p)."""
    out, running = {}, 0.0
    for i, (name, v) in enumerate(sorted(p.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (len(p) - i) * v))
        out[name] = running
    return out


def fmt_t(c: dict | None) -> str:
    """A :func:`paired_t` comparison in points: mean [95 % t interval], p = exact sign-flip (seeds)."""
    if c is None:
        return "-"
    return f"{tables.fmt_interval((c['diff'], *c['ci95']))}, p={c['p_sign_flip']:.3f} ({c['seeds']})"


def tokens_to_target(r: dict, target: float) -> float | None:
    """Generated tokens at the first mid-run evaluation whose held-out pass@1 reaches ``target``."""
    return next((e["tokens"] for e in r.get("mid_evals", []) if e["pass1"] >= target), None)


def pack_run(r: dict) -> dict:
    return {**r, "per_problem": tables.pack_per_problem(r["per_problem"], r["eval_n"])}


def unpack_run(r: dict) -> dict:
    return {**r, "per_problem": tables.unpack_per_problem(r["per_problem"])}


@dataclass(frozen=True)
class GPURemediesStudy:
    """The study's configuration (fixed before the runs); its methods run and report it."""

    levels: tuple[str, ...]  # synthetic_arithmetic's levels (it cycles them: a problem's index names its level)
    train_prompts: int  # the training pool
    heldout: int  # held-out problems
    settings: Settings  # what every arm shares
    arms: dict[str, Arm]  # name: what it changes
    seeds: dict[str, int]  # seeds wanted per arm
    primary: tuple[str, ...]  # the arms of the primary comparison (run first), each against ``base``
    base: str = "GRPO"
    second_base: str = "DAPO-DS"  # the filtering baseline every remedy is also compared with
    target: float = 0.5  # the held-out pass@1 whose generated tokens to reach are reported
    pilot: dict[str, int] = field(default_factory=dict)  # arms and seeds of the pilot

    def __post_init__(self):
        unknown = (set(self.seeds) | set(self.primary) | set(self.pilot) | {self.base, self.second_base}) - set(
            self.arms
        )
        if unknown:
            raise ValueError(f"GPURemediesStudy: arms {sorted(unknown)} are not in arms")

    # ── data and jobs ──

    def make_data(self, out: Path) -> tuple[str, str]:
        """The training pool and the held-out set: the CPU remedies study's streams (pool seed 0,
        held-out seed 1000), so the two scales are evaluated on the same problems."""
        from avspo_openrlhf.data.io import write_jsonl
        from avspo_openrlhf.data.tasks import synthetic_arithmetic

        out.mkdir(parents=True, exist_ok=True)
        sets = {"train": synthetic_arithmetic(self.train_prompts, list(self.levels), seed=0),
                "heldout": synthetic_arithmetic(self.heldout, list(self.levels), seed=1000)}  # fmt: skip
        paths = []
        for name, rows in sets.items():
            path = out / f"{name}.jsonl"
            write_jsonl(rows, str(path) + ".tmp")
            Path(str(path) + ".tmp").replace(path)  # a study beside a --report-only reads whole files
            paths.append(str(path))
        return paths[0], paths[1]

    def order(self, arms: list[str], seeds: list[int] | None, pilot: bool = False) -> list[tuple[str, int]]:
        """The runs in the order they start: the pilot's, or the primary arms seed by seed up to their
        seeds, then the other arms the same way (partial results hold whole seeds of the primary arms)."""
        wanted = self.pilot if pilot else self.seeds
        arms = [a for a in arms if a in wanted]
        groups = [[a for a in arms if a in self.primary], [a for a in arms if a not in self.primary]]
        out = []
        for group in groups:
            top = max((wanted[a] for a in group), default=0)
            for s in seeds if seeds is not None else range(top):
                out += [(a, s) for a in group if seeds is not None or s < wanted[a]]
        return out

    def spec(self, arm: str, seed: int, model: str, data: tuple[str, str], settings: Settings | None = None,
             train: str | None = None, heldout: str | None = None) -> RunSpec:  # fmt: skip
        return RunSpec(method=arm, seed=seed, arm=self.arms[arm], settings=settings or self.settings, model=model,
                       train=train or data[0], heldout=heldout or data[1])  # fmt: skip

    # ── results ──

    @staticmethod
    def collect(out: Path, published: Path | None) -> list[dict]:
        """Every finished run: the published ones and those in ``out`` (one per arm and seed)."""
        runs: dict[tuple[str, int], dict] = {}
        if published is not None and (published / "runs").is_dir():
            for f in sorted((published / "runs").glob("*.json")):
                r = unpack_run(json.loads(f.read_text(encoding="utf-8")))
                runs[r["method"], r["seed"]] = r
        for f in sorted(out.glob("*_seed*/result.json")):
            r = json.loads(f.read_text(encoding="utf-8"))
            runs.setdefault((r["method"], r["seed"]), r)
        return list(runs.values())

    def publish_run(self, r: dict, published: Path) -> None:
        (published / "runs").mkdir(parents=True, exist_ok=True)
        atomic_write(published / "runs" / f"{r['method']}_seed{r['seed']}.json", json.dumps(pack_run(r), indent=None))

    def level(self, unique_id: str) -> str:
        return self.levels[int(unique_id.rsplit("/", 1)[1]) % len(self.levels)]

    def summary(self, results: list[dict]) -> dict:
        """Per arm: its numbers and its paired comparisons (the report's tables, as data)."""
        out = {}
        for arm in self.arms:
            rs = [r for r in results if r["method"] == arm]
            if not rs:
                continue
            reached = [t for t in (tokens_to_target(r, self.target) for r in rs) if t is not None]
            out[arm] = {
                "seeds": len(rs), "seeds_wanted": self.seeds.get(arm, 0),
                "heldout_pass1": [r["heldout_pass1"] for r in rs],
                "vs_" + self.base: paired_t(results, arm, self.base),
                "vs_" + self.second_base: paired_t(results, arm, self.second_base),
                "by_level_vs_" + self.base: {lv: paired_t(results, arm, self.base, lambda k, lv=lv: self.level(k) == lv)
                                             for lv in self.levels},
                "steps": [r["steps"] for r in rs], "generated_tokens": [r["generated_tokens"] for r in rs],
                "tokens_to_target": {"reached": len(reached), "median": statistics.median(reached) if reached else None},
                "accepted_per_mtok": [r["accepted_per_mtok"] for r in rs],
                "acr_raw": [r["acr_raw"] for r in rs], "acr_effective": [r["acr_effective"] for r in rs],
                "train_min": [r["train_s"] / 60 for r in rs],
            }  # fmt: skip
        return out

    def power_lines(self, summary: dict) -> list[str]:
        """Seeds needed for a 95 % half-width of 3 and 2 points, from each comparison's measured sd."""
        rows = []
        for arm, s in summary.items():
            c = s["vs_" + self.base]
            if c is None:
                continue
            n3, n2 = (seeds_for_halfwidth(c["sd"], h / 100) for h in (3, 2))
            rows.append(f"| {arm} | {c['seeds']} | {100 * c['sd']:.1f} | {100 * c['halfwidth']:.1f} | "
                        f"{n3 or '> 1000'} | {n2 or '> 1000'} |")  # fmt: skip
        if not rows:
            return []
        return ["", f"Power: the sd of the per-seed paired differences against {self.base}, the half-width it gives "
                "now, and the seeds that sd needs for a 95 % t half-width of 3 and 2 points:", "",
                "| arm | seeds | sd (points) | half-width now (points) | seeds for ≤ 3 | seeds for ≤ 2 |",
                "| --- | --- | --- | --- | --- | --- |", *rows]  # fmt: skip

    def report(self, results: list[dict], out: Path) -> str:
        """``results.md``, ``results.json`` (the summary, no per-problem records) and the plot in ``out``."""
        s = self.settings
        summary = self.summary(results)
        devices = tables.cpu_line([{"cpu": r["device"]} for r in results])
        head = (f"SmolLM2-135M-Instruct (or the model the runs name), synthetic arithmetic "
                f"({'/'.join(self.levels)}), {self.train_prompts} training prompts, G={s.group_size}, "
                f"{s.prompts_per_step} prompts/step, T={s.temperature}, {s.max_new_tokens} new tokens, lr {s.lr:g}, "
                f"one AdamW step per batch; every run stops at the step where its generated tokens reach "
                f"{s.token_budget:,}. Held-out: {self.heldout:,} problems x n={s.eval_n} (T={s.eval_temperature}). "
                f"{tables.SD_NOTE}. Differences are paired (same seed, same problems): mean [95 % t interval over "
                f"seeds], p = exact sign-flip over seeds (seeds). Device: {devices or 'no runs yet'}.")  # fmt: skip
        have = {a: sum(r["method"] == a for r in results) for a in self.arms}
        missing = ", ".join(
            f"{a} {max(0, self.seeds.get(a, 0) - have[a])} of {self.seeds.get(a, 0)}" for a in self.arms
        )
        head += f" Runs still missing per arm: {missing}."
        if not results:
            text = head + "\n\nNo run has finished yet.\n"
            out.mkdir(parents=True, exist_ok=True)
            atomic_write(out / "results.md", text)
            atomic_write(out / "results.json", json.dumps({"budget_tokens": s.token_budget, "summary": {}}, indent=1))
            return text
        # no heading: the study's README includes this file (docs/hooks.py titles it on the site)
        lines = [head, "",
                 f"| arm | seeds (wanted) | held-out pass@1 (%) | vs {self.base} (points) | vs {self.second_base} (points) |",
                 "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for arm, a in summary.items():
            lines.append(f"| {arm} | {a['seeds']} ({a['seeds_wanted']}) | {tables.mean_sd(a['heldout_pass1'], 100)} | "
                         f"{fmt_t(a['vs_' + self.base])} | {fmt_t(a['vs_' + self.second_base])} |")  # fmt: skip
        primary = {a: summary[a]["vs_" + self.base]["p_sign_flip"] for a in self.primary
                   if a in summary and summary[a]["vs_" + self.base] is not None}  # fmt: skip
        if primary:
            lines += ["", f"The primary comparisons against {self.base}, Holm-adjusted over the {len(primary)} of them "
                      "that have runs: " + ", ".join(f"{a} p={v:.3f}" for a, v in holm(primary).items()) + "."]  # fmt: skip
        lines += ["", f"What each arm spent and trained on (tokens to reach {100 * self.target:.0f} % on the mid-run "
                  f"held-out subset: median over the seeds that reached it, reached/seeds):", "",
                  "| arm | steps | generated tokens | tokens to target | accepted groups per M tokens | raw ACR | "
                  "effective ACR | train (min) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for arm, a in summary.items():
            t = a["tokens_to_target"]
            reach = (
                f"{t['median']:,.0f} ({t['reached']}/{a['seeds']})"
                if t["median"] is not None
                else f"- (0/{a['seeds']})"
            )
            lines.append(f"| {arm} | {tables.mean_sd(a['steps'], 1, '{:.1f}')} | "
                         f"{tables.mean_sd(a['generated_tokens'], 1, '{:,.0f}')} | {reach} | "
                         f"{tables.mean_sd(a['accepted_per_mtok'], 1, '{:,.0f}')} | {tables.mean_sd(a['acr_raw'], 1, '{:.2f}')} | "
                         f"{tables.mean_sd(a['acr_effective'], 1, '{:.2f}')} | {tables.mean_sd(a['train_min'], 1, '{:.1f}')} |")  # fmt: skip
        level_rows = [f"| {arm} | " + " | ".join(fmt_t(a['by_level_vs_' + self.base][lv]) for lv in self.levels) + " |"
                      for arm, a in summary.items() if any(a["by_level_vs_" + self.base].values())]  # fmt: skip
        if level_rows:
            lines += ["", f"Per level against {self.base} (points; mean [95 % t interval over seeds], p = exact "
                      "sign-flip (seeds)):", "", "| arm | " + " | ".join(self.levels) + " |",
                      "| --- |" + " --- |" * len(self.levels), *level_rows]  # fmt: skip
        lines += self.power_lines(summary)
        seeds = sorted({r["seed"] for r in results})
        arms = list(summary)
        acc = {(r["method"], r["seed"]): r["heldout_pass1"] for r in results}
        if seeds:
            lines += ["", "Held-out pass@1 per seed (%):", "", "| seed | " + " | ".join(arms) + " |",
                      "| --- |" + " --- |" * len(arms)]  # fmt: skip
            lines += [f"| {sd} | " + " | ".join(f"{100 * acc[a, sd]:.1f}" if (a, sd) in acc else "" for a in arms) + " |"
                      for sd in seeds]  # fmt: skip
        precisions = sorted({json.dumps(r["precision"], sort_keys=True) for r in results})
        lines.append("\nPrecision: " + ("; ".join(precisions) or "no runs yet") +
                     f". Runs resumed after a kill: {sum(bool(r.get('resumed')) for r in results)}.")  # fmt: skip
        text = "\n".join(lines) + "\n"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "results.md", text)
        atomic_write(out / "results.json", json.dumps({"budget_tokens": s.token_budget, "summary": summary}, indent=1))
        self.plot(results, out / "accuracy_vs_tokens.png")
        return text

    def plot(self, results: list[dict], path: Path) -> None:
        """Mid-run held-out pass@1 against generated tokens (mean ± sd over seeds) and the final
        held-out pass@1 per seed: two panels, legible at a page's width."""
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
        grid = np.linspace(0, self.settings.token_budget, 50)
        for i, arm in enumerate(arms):
            rs = [r for r in results if r["method"] == arm and r.get("mid_evals")]
            ys = np.array([np.interp(grid, [e["tokens"] for e in r["mid_evals"]],
                                     [100 * e["pass1"] for e in r["mid_evals"]]) for r in rs])  # fmt: skip
            mean = ys.mean(0)
            ax0.plot(grid, mean, color=f"C{i}", label=f"{arm} ({len(rs)})")
            if len(rs) > 1:
                sd = ys.std(0, ddof=1)
                ax0.fill_between(grid, mean - sd, mean + sd, color=f"C{i}", alpha=0.12, lw=0)
            final = [100 * r["heldout_pass1"] for r in rs]
            ax1.bar(i, statistics.mean(final), color=f"C{i}", alpha=0.6)
            ax1.scatter([i] * len(final), final, color="k", s=8, zorder=3)
        ax0.set(xlabel="generated tokens", ylabel="held-out pass@1 (%), mid-run subset",
                title="accuracy against generated tokens (mean ± sd over seeds)")  # fmt: skip
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
        p.add_argument("--publish", help="folder that receives every finished run (runs/<arm>_seed<k>.json, with its "
                       "per-problem records) and the report; runs found there are not run again")  # fmt: skip
        p.add_argument("--arms", nargs="+", default=list(self.arms), choices=list(self.arms),
                       help="arms to run (default: all; the primary ones start first)")  # fmt: skip
        p.add_argument("--seeds", type=int, nargs="+", help="seeds to run for every chosen arm (default: each arm's "
                       "wanted seeds from the study's configuration)")  # fmt: skip
        p.add_argument("--pilot", action="store_true", help="run the pilot's arms and seeds only (it measures the "
                       "between-seed sd that fixes the seeds per arm)")  # fmt: skip
        p.add_argument("--k", type=int, default=1, help="runs at once on this device (separate processes)")
        p.add_argument("--threads", type=int, help="CPU threads per run (default: the cores / K)")
        p.add_argument("--start-runs-for", type=float, metavar="MIN", help="start no run after this many minutes "
                       "(the runs in flight finish): fits a study into a job's time limit")  # fmt: skip
        p.add_argument("--shard", default="0/1", metavar="I/N", help="run only every N-th run from the I-th (a Slurm "
                       "array task: $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")  # fmt: skip
        p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
        p.add_argument("--train", help="a jsonl of training problems (problem, answer) instead of the study's pool")
        p.add_argument("--heldout", help="a jsonl of held-out problems instead of the study's set")
        p.add_argument("--reward", help="the task's verifier: arith | math | module:function (default: the study's)")
        p.add_argument("--budget", type=int, help="generated tokens per run (default: the study's)")
        p.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs only")
        p.add_argument("--dry-run", action="store_true", help="list the runs this call would start and check their "
                       "specs, model and data paths; train nothing")  # fmt: skip
        p.add_argument("--throughput", metavar="K,K,...", help="measure aggregate generated tokens/s and runs/hour "
                       "for each K (training-only runs of --throughput-budget tokens) instead of running the study")  # fmt: skip
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
        try:
            settings = replace(self.settings, **{k: v for k, v in (("token_budget", args.budget),
                                                                   ("reward", args.reward)) if v is not None})  # fmt: skip
        except ValueError as e:
            p.error(str(e))
        for flag, path in (("--train", args.train), ("--heldout", args.heldout)):
            if path and not Path(path).is_file():
                p.error(f"{flag}: no such file: {path}")
        if args.report_only:
            print(self.report(self.collect(out, published), published or out), flush=True)
            return 0
        model = args.model
        if model not in ("smollm2", "tiny") and not Path(model, "config.json").is_file():
            p.error(f"--model: {model} is not smollm2, tiny or a local HF folder with a config.json")
        data = (args.train, args.heldout) if args.train and args.heldout else None
        if data is None:
            made = self.make_data(out / "data")
            data = (args.train or made[0], args.heldout or made[1])
        if args.throughput:
            return self.throughput([int(k) for k in args.throughput.split(",")], args, settings, data, out, published)
        done = {(r["method"], r["seed"]) for r in self.collect(out, published)}
        # the shard is taken from the whole list, not from what is left: a task started again (a requeue)
        # keeps its runs, so no two tasks ever run the same one
        todo = [(a, s) for a, s in self.order(args.arms, args.seeds, args.pilot)[i::n] if (a, s) not in done]
        if args.dry_run:
            for a, s in todo:
                self.spec(a, s, model, data, settings)  # every spec builds: the arms' options are valid
            print(f"[study] {len(todo)} runs to start (shard {i}/{n}, {len(done)} finished): "
                  + ", ".join(f"{a} seed {s}" for a, s in todo), flush=True)  # fmt: skip
            return 0
        if model in ("smollm2", "tiny"):
            from avspo_openrlhf.cpu.models import prepare

            model = prepare(model)
        jobs = [Job(self.spec(a, s, model, data, settings), out / f"{a}_seed{s}") for a, s in todo]

        def finished(job: Job, rc: int) -> None:
            if job.done() and published is not None:
                self.publish_run(job.result(), published)
                self.report(self.collect(out, published), published)

        until = time.monotonic() + 60 * args.start_runs_for if args.start_runs_for is not None else None
        failed = run_jobs(jobs, args.k, threads=args.threads, on_done=finished, start_until=until)
        print(self.report(self.collect(out, published), published or out), flush=True)
        if failed:
            print(f"[study] {len(failed)} runs failed (rerun to resume them): {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0

    def throughput(self, ks: list[int], args, settings: Settings, data, out: Path, published: Path | None) -> int:
        """Aggregate throughput for each K on this device: K training-only GRPO runs at once."""
        from avspo_openrlhf.cpu.models import prepare

        model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
        short = replace(settings, token_budget=args.throughput_budget, final_eval=False, mid_eval_every=0, ckpt_every=0)

        def make_jobs(k: int) -> list[Job]:
            folder = out / "throughput" / f"k{k}"
            shutil.rmtree(folder, ignore_errors=True)
            return [Job(self.spec(self.base, s, model, data, short), folder / f"{self.base}_seed{s}") for s in range(k)]

        rows = measure_throughput(make_jobs, ks, settings.token_budget)
        base = rows[0]["tokens_per_s"] / rows[0]["k"] if rows else 1.0
        lines = [f"Device: {rows[0]['device']}; precision {json.dumps(rows[0]['precision'])}; each run GRPO on the "
                 f"study's settings, {args.throughput_budget:,} generated tokens, no evaluation; runs/hour = aggregate "
                 f"generated tokens/s x 3600 / the study's budget ({settings.token_budget:,}), training only.", "",
                 "| runs at once (K) | wall (s) | generated tokens/s | × one run | median step (s) | runs/hour |",
                 "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {r['k']} | {r['wall_s']:.0f} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f} | "
                  f"{r['median_step_s']:.2f} | {r['runs_per_hour']:.1f} |" for r in rows]  # fmt: skip
        dest = published or out
        dest.mkdir(parents=True, exist_ok=True)
        atomic_write(dest / "throughput.md", "\n".join(lines) + "\n")
        atomic_write(dest / "throughput.json", json.dumps(rows, indent=1))
        print("\n".join(lines), flush=True)
        return 0
