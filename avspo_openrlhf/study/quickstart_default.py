"""The quickstart's default over several seeds: wall time and held-out gain with its 95 % bootstrap
interval per seed and level (docs/quickstart.md and experiments/quickstart_default/README.md include
its results.md).

Each seed is ``python -m avspo_openrlhf.cli.quickstart --seed S`` in its own folder (the seed also
draws the training and held-out problems); a finished seed is not rerun. Writes ``results.md``,
``results.json`` and ``heldout_accuracy_seed<S>.png`` to the results folder; ``--report-only``
rebuilds ``results.md`` from the ``results.json`` there (the seeds' summaries as published), running
nothing. The table ends with the CPU and each stage's precision as the runs recorded them, in the
lines every study writes (``tables.cpu_line``, ``tables.precision_lines``); the study's folder is
``experiments/quickstart_default``, whose ``run.py`` runs it."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from avspo_openrlhf.cli.quickstart import LEVELS
from avspo_openrlhf.study import tables


def training_cell(r: dict) -> str:
    """The training stage's time, its first step's and its mode (runs before these were recorded: —)."""
    if not r.get("train_s"):
        return "—"
    first = f" ({r['first_step_s']:.0f} s)" if r.get("first_step_s") else ""
    return f"{r['train_s']:.0f} s{first}, {r.get('mode', '?')}"


def table(results: dict[int, dict]) -> str:
    """One row per seed (its quickstart's ``summary.json``), then the CPU and precision lines."""
    lines = [
        "| seed | wall time | training (first step after) | held-out pass@1 before → after | gain, points [95 % bootstrap "
        "interval] | " + " | ".join(f"{lv} gain" for lv in LEVELS) + " | truncated answers before → after |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in LEVELS) + " | --- |",
    ]
    for seed, r in sorted(results.items()):
        g = r["gain_ci95"]
        lines.append(
            f"| {seed} | {r['wall_min']:.1f} min | {training_cell(r)} "
            f"| {100 * r['before']['pass@1']:.1f} % → {100 * r['after']['pass@1']:.1f} % "
            f"| **{tables.fmt_interval(g['all'])}** | "
            + " | ".join(tables.fmt_interval(g[lv]) for lv in LEVELS)
            + f" | {100 * r['before']['truncation_rate']:.0f} % → {100 * r['after']['truncation_rate']:.0f} % |"
        )
    runs = [results[seed] for seed in sorted(results)]
    lines.append(f"\nCPU: {tables.cpu_line(runs)}.")
    lines += tables.precision_lines(runs)
    return "\n".join(lines) + "\n"


def main(folder: Path, argv: list[str] | None = None) -> int:
    """The command: ``folder`` is the study's (its results go there unless ``--results`` says otherwise)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/quickstart_seeds")
    p.add_argument("--results", default=str(folder), help="where results.md/json and plots go")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild results.md from the results.json in --results (the seeds' summaries as published); runs nothing",
    )
    p.add_argument("extra", nargs="*", help="after '--': more quickstart options")
    args = p.parse_args(argv)
    out, res_dir = Path(args.out), Path(args.results)
    if args.report_only:
        published = json.loads((res_dir / "results.json").read_text())
        text = table({int(seed): r for seed, r in published.items()})
        (res_dir / "results.md").write_text(text)
        print(text)
        return 0
    results = {}
    for seed in args.seeds:
        run = out / f"seed{seed}"
        if not (run / "summary.json").exists():
            print(f"[seeds] quickstart seed {seed} -> {run}", flush=True)
            cmd = [sys.executable, "-m", "avspo_openrlhf.cli.quickstart", "--out", str(run), "--seed", str(seed)]
            subprocess.run([*cmd, *args.extra], check=True)
        results[seed] = json.loads((run / "summary.json").read_text())
        shutil.copy(run / "report" / "plots" / "heldout_accuracy.png", res_dir / f"heldout_accuracy_seed{seed}.png")
    text = table(results)
    (res_dir / "results.md").write_text(text)
    (res_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0
