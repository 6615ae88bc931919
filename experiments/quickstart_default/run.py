"""The quickstart's default over several seeds: wall time and held-out gain with its 95 % bootstrap
interval per seed and level (docs/quickstart.md and this folder's README.md include its results.md).

    python experiments/quickstart_default/run.py --seeds 0 1 2 --out runs/quickstart_seeds

Each seed is ``python -m avspo_openrlhf.cli.quickstart --seed S`` in its own folder (the seed also
draws the training and held-out problems); a finished seed is not rerun. Writes ``results.md``,
``results.json`` and ``heldout_accuracy_seed<S>.png`` next to ``--out``'s seed folders.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

LEVELS = ["add1", "mul1", "add2"]


def _fmt(g) -> str:
    return f"{100 * g[0]:+.1f} [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}]"


def _training(r: dict) -> str:
    """The training stage's time, its first step's and its mode (runs before these were recorded: —)."""
    if not r.get("train_s"):
        return "—"
    first = f" ({r['first_step_s']:.0f} s)" if r.get("first_step_s") else ""
    return f"{r['train_s']:.0f} s{first}, {r.get('mode', '?')}"


def table(results: dict[int, dict]) -> str:
    lines = [
        "| seed | wall time | training (first step after) | held-out pass@1 before → after | gain, points [95 % bootstrap "
        "interval] | " + " | ".join(f"{lv} gain" for lv in LEVELS) + " | truncated answers before → after |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in LEVELS) + " | --- |",
    ]  # fmt: skip
    for seed, r in sorted(results.items()):
        g = r["gain_ci95"]
        lines.append(
            f"| {seed} | {r['wall_min']:.1f} min | {_training(r)} "
            f"| {100 * r['before']['pass@1']:.1f} % → {100 * r['after']['pass@1']:.1f} % "
            f"| **{_fmt(g['all'])}** | " + " | ".join(_fmt(g[lv]) for lv in LEVELS)
            + f" | {100 * r['before']['truncation_rate']:.0f} % → {100 * r['after']['truncation_rate']:.0f} % |"
        )  # fmt: skip
    # the hardware and the precision of every stage, as the runs recorded them
    for what in sorted({r.get("cpu", "CPU not recorded") for r in results.values()}):
        lines.append(f"\nCPU: {what}.")
    for what in sorted({json.dumps(r.get("precision", {})) for r in results.values()}):
        stages = json.loads(what)
        lines.append("Precision: " + ("; ".join(f"{k} {v}" for k, v in stages.items()) or "not recorded") + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/quickstart_seeds")
    p.add_argument("--results", default=str(Path(__file__).parent), help="where results.md/json and plots go")
    p.add_argument("extra", nargs="*", help="after '--': more quickstart options")
    args = p.parse_args(argv)
    out, res_dir = Path(args.out), Path(args.results)
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


if __name__ == "__main__":
    sys.exit(main())
