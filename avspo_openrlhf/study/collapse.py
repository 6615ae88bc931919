"""Collapse study: methods compared at equal steps on the quickstart's arithmetic (CPU).

Same data, steps, decoding and seeds for every method; each run is ``avspo-train --backend cpu``
(the quickstart's settings) followed by a held-out evaluation of the trained model. Reports raw ACR,
effective ACR, held-out pass@1 (mean ± sd over seeds), generated ÷ trained samples, and wall time.
Resumable per (method, seed); ``--report-only`` rebuilds the table and the plot from the finished
runs, and ``--publish`` copies them to the repository's results folder, whose runs are not run again.

The study's configuration is a ``CollapseStudy`` built by ``experiments/collapse_study/run.py``."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf.cli import quickstart as qs
from avspo_openrlhf.study import cells, tables
from avspo_openrlhf.study.tables import mean_sd


def generated_collapse(r: dict) -> float:
    """Share of generated groups that collapsed. Dynamic sampling trains only the mixed ones, so its
    trained-batch ACR is 0 by construction; the dropped share is 1 - trained/generated (groups all
    have G samples). Without a filter every generated group is trained: the raw ACR."""
    ratio = r["generated_per_trained"]
    return 1 - 1 / ratio if ratio > 1 else r["acr_raw"]


@dataclass(frozen=True)
class CollapseStudy:
    """The study's configuration; its methods run and report it."""

    settings: list[str]  # quickstart options of every run
    methods: dict[str, list[str]]  # name: its quickstart options (after '--': avspo-train flags)
    heldout: int  # held-out problems
    pool_factor: int  # training prompts per step's prompts: a pool dynamic sampling can refill from

    def quickstart_args(self, extra: list[str]) -> argparse.Namespace:
        return qs.build_parser().parse_args([*self.settings, *extra])

    def make_data(self, out: Path, steps: int) -> tuple[str, str]:
        """The training pool and the held-out set, the same for every method and seed (the seed changes
        sampling and the data order); every run stops at ``steps`` (--run.max_steps)."""
        per_step = self.quickstart_args([]).prompts_per_step
        return qs.write_data(out / "data", self.pool_factor * steps, per_step, self.heldout, 0)

    def cell_args(self, method: str, seed: int, steps: int, max_new_tokens: int) -> argparse.Namespace:
        """The quickstart options of one run: ``steps`` steps, no evaluation during training."""
        flags = self.methods[method]
        extra = flags + ([] if "--" in flags else ["--"]) + ["--run.max_steps", str(steps)]
        return self.quickstart_args(
            [
                "--steps",
                str(steps),
                "--max-new-tokens",
                str(max_new_tokens),
                "--seed",
                str(seed),
                "--eval-steps",
                "0",
                "--save-steps",
                str(steps),
                *extra,
            ]
        )

    def run_one(
        self, method: str, seed: int, steps: int, max_new_tokens: int, out: Path, model: str, train: str, heldout: str
    ) -> dict:
        run_dir = out / f"{method}_seed{seed}"
        result_file = run_dir / "result.json"
        if result_file.exists():
            return json.loads(result_file.read_text())
        qargs = self.cell_args(method, seed, steps, max_new_tokens)
        cell = cells.train_and_evaluate(qargs, model, train, heldout, run_dir)
        rows = cell.rows
        res = {
            "method": method,
            "seed": seed,
            "steps": len(rows),
            "acr_raw": statistics.mean(r["acr"] for r in rows),
            "acr_effective": statistics.mean(r["acr_effective"] for r in rows),
            "heldout_pass1": cell.after["pass@1"],
            "generated_per_trained": rows[-1].get("dynamic/generated_per_trained_cum", 1.0),
            "wall_min": cell.train_s / 60,
            "reward_last5": statistics.mean(r["rollout/reward_mean"] for r in rows[-5:]),
            "precision": qs.stage_precisions(run_dir),  # engine/policy read back, evaluation as recorded
        }
        result_file.write_text(json.dumps(res, indent=1))
        return res

    def report(self, results: list[dict], before: float, out: Path, max_new_tokens: int) -> str:
        """results.md, results.json (the runs and the accuracy before training) and the plot into ``out``."""
        a = self.quickstart_args([])
        steps = sorted({r["steps"] for r in results})
        seeds = sorted({r["seed"] for r in results})
        lines = [
            f"SmolLM2-135M-Instruct, synthetic arithmetic ({'/'.join(qs.LEVELS)}), G={a.group_size}, "
            f"{a.prompts_per_step} prompts/step, {'/'.join(map(str, steps))} steps, T={a.temperature}, {max_new_tokens} "
            f"new tokens, async, seeds {seeds}; {tables.SD_NOTE}. Held-out pass@1 ({self.heldout} problems, "
            f"n={a.eval_n}, T={a.temperature}) before training: {100 * before:.1f} %.",
            "",
            "| method | raw ACR (trained batches) | collapsed among generated groups | effective ACR | held-out pass@1 (%) "
            "| train reward, last 5 steps | generated ÷ trained | wall time (min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for m in self.methods:
            rs = [r for r in results if r["method"] == m]
            if not rs:
                continue
            lines.append(
                f"| {m} | {mean_sd([r['acr_raw'] for r in rs], 1, '{:.3f}')} | "
                f"{mean_sd([generated_collapse(r) for r in rs], 1, '{:.3f}')} | "
                f"{mean_sd([r['acr_effective'] for r in rs], 1, '{:.3f}')} | "
                f"{mean_sd([r['heldout_pass1'] for r in rs], 100, '{:.1f}')} | "
                f"{mean_sd([r['reward_last5'] for r in rs], 1, '{:.3f}')} | "
                f"{mean_sd([r['generated_per_trained'] for r in rs], 1, '{:.2f}')} | "
                f"{mean_sd([r['wall_min'] for r in rs], 1, '{:.1f}')} |"
            )
        lines += tables.precision_lines(results)
        table = "\n".join(lines) + "\n"
        (out / "results.md").write_text(table)
        published = {"before_pass1": before, "max_new_tokens": max_new_tokens, "runs": results}
        (out / "results.json").write_text(json.dumps(published, indent=1))
        self.plot(results, out / "collapse_study.png")
        return table

    def plot(self, results: list[dict], path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
        for ax, key, title in zip(
            axes, ["acr_raw", "acr_effective", "heldout_pass1"], ["raw ACR", "effective ACR", "held-out pass@1"]
        ):
            for i, m in enumerate(self.methods):
                ys = [r[key] for r in results if r["method"] == m]
                if ys:
                    ax.bar(i, statistics.mean(ys), color=f"C{i}", alpha=0.6)
                    ax.scatter([i] * len(ys), ys, color="k", s=12, zorder=3)
            ax.set_xticks(range(len(self.methods)), list(self.methods))
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def main(self, argv: list[str] | None = None) -> int:
        p = cells.study_parser(
            __doc__.split("\n\n")[0],
            "runs/collapse_study",
            list(self.methods),
            [0, 1, 2],
            "the repository's results folder: results.md/json and the plot are copied there, and "
            "the runs it holds are not run again",
        )
        p.add_argument("--steps", type=int, default=10)
        p.add_argument("--max-new-tokens", type=int, default=48)
        args = p.parse_args(argv)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.check_flags:
            train, heldout = self.make_data(out, args.steps)
            cells_ = {m: self.cell_args(m, 0, args.steps, args.max_new_tokens) for m in args.methods}
            refused = cells.check_flags(cells_, args.model, train, heldout, out / "check_flags")
            print(f"[study] flags refused: {', '.join(refused)}" if refused else "[study] every method's flags parse")
            return 1 if refused else 0
        published = {}
        if args.publish and (Path(args.publish) / "results.json").exists():
            published = json.loads((Path(args.publish) / "results.json").read_text())
            for r in published["runs"]:  # a run the folder holds is never overwritten
                run_dir = out / f"{r['method']}_seed{r['seed']}"
                if not (run_dir / "result.json").exists():
                    run_dir.mkdir(parents=True, exist_ok=True)
                    (run_dir / "result.json").write_text(json.dumps(r, indent=1))
        before, max_new_tokens = published.get("before_pass1"), published.get("max_new_tokens", args.max_new_tokens)
        if not args.report_only:
            from avspo_openrlhf.cpu.models import prepare

            model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
            train, heldout = self.make_data(out, args.steps)
            base = self.quickstart_args(["--max-new-tokens", str(args.max_new_tokens)])
            before = qs.evaluate_heldout(model, heldout, out / "eval_before", base, out / "log.txt")["pass@1"]
            max_new_tokens = args.max_new_tokens
            for seed in args.seeds:
                for m in args.methods:
                    print(f"[study] {m} seed {seed}", flush=True)
                    self.run_one(m, seed, args.steps, args.max_new_tokens, out, model, train, heldout)
        elif (out / "eval_before" / "summary.json").exists():
            before = json.loads((out / "eval_before" / "summary.json").read_text())["benchmarks"]["arith"]["pass@1"]
        if before is None:
            raise SystemExit(f"[study] {out}: no evaluation before training (eval_before/) and none published")
        order = list(self.methods)
        results = sorted(
            (json.loads(f.read_text()) for f in out.glob("*_seed*/result.json")),
            key=lambda r: (r["seed"], order.index(r["method"])),
        )
        print(self.report(results, before, out, max_new_tokens))
        if args.publish:
            dest = Path(args.publish)
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("results.md", "results.json", "collapse_study.png"):
                (dest / name).write_bytes((out / name).read_bytes())
        return 0
