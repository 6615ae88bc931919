"""Collapse study: GRPO vs AVSPO vs DAPO dynamic sampling on SmolLM2-135M arithmetic (CPU).

Same data, steps, decoding and seeds for every method; each run is ``avspo-train --backend cpu``
(the quickstart's settings) followed by a held-out evaluation of the trained model. Reports raw ACR,
effective ACR, held-out pass@1 (mean ± spread over seeds), generated ÷ trained samples, and wall time.

    python experiments/collapse_study/run.py --seeds 0 1 2 --steps 10 --out runs/collapse_study
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from avspo_openrlhf.cli import quickstart as qs
from avspo_openrlhf.report import read_metrics

# the settings the study was measured with (the quickstart's defaults when it ran; pinned here so a
# retuned quickstart does not silently change the study)
STUDY_SETTINGS = ["--prompts-per-step", "4", "--lr", "3e-6", "--eval-n", "4"]

METHODS = {
    "GRPO": ["--grpo"],
    "AVSPO": [],
    "DAPO-DS": ["--grpo", "--", "--dynamic.std_filter"],  # dynamic sampling on the correctness std
}


def run_one(method: str, seed: int, args, out: Path, model: str, train: str, heldout: str) -> dict:
    run_dir = out / f"{method}_seed{seed}"
    result_file = run_dir / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    extra = METHODS[method] + ([] if "--" in METHODS[method] else ["--"]) + ["--run.max_steps", str(args.steps)]
    qargs = qs.build_parser().parse_args(
        [
            "--steps",
            str(args.steps),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--seed",
            str(seed),
            "--eval-steps",
            "0",
            *STUDY_SETTINGS,
            "--save-steps",
            str(args.steps),
            *extra,
        ]  # fmt: skip
    )
    t0 = time.time()
    qs._run([sys.executable, "-m", "avspo_openrlhf.cli.train", *qs.train_flags(qargs, model, train, run_dir)],
            run_dir / "log.txt")  # fmt: skip
    wall = time.time() - t0
    after = qs._eval(str(run_dir / "final"), heldout, run_dir / "eval_after", qargs, run_dir / "log.txt")
    rows, _ = read_metrics(str(run_dir / "report" / "metrics.jsonl"))
    res = {
        "method": method,
        "seed": seed,
        "steps": len(rows),
        "acr_raw": statistics.mean(r["acr"] for r in rows),
        "acr_effective": statistics.mean(r["acr_effective"] for r in rows),
        "heldout_pass1": after["pass@1"],
        "generated_per_trained": rows[-1].get("dynamic/generated_per_trained_cum", 1.0),
        "wall_min": wall / 60,
        "reward_last5": statistics.mean(r["rollout/reward_mean"] for r in rows[-5:]),
        "precision": qs.stage_precisions(run_dir),  # engine/policy read back, evaluation as recorded
    }
    result_file.write_text(json.dumps(res, indent=1))
    return res


def _generated_collapse(r: dict) -> float:
    """Share of generated groups that collapsed. Dynamic sampling trains only the mixed ones, so its
    trained-batch ACR is 0 by construction; the dropped share is 1 - trained/generated (groups all
    have G samples). Without a filter every generated group is trained: the raw ACR."""
    ratio = r["generated_per_trained"]
    return 1 - 1 / ratio if ratio > 1 else r["acr_raw"]


def _ms(xs: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    m = statistics.mean(xs) * scale
    half = (max(xs) - min(xs)) / 2 * scale
    return f"{fmt.format(m)} ± {fmt.format(half)}"


def report(results: list[dict], before: float, out: Path, args) -> str:
    lines = [
        f"SmolLM2-135M-Instruct, synthetic arithmetic (add1/mul1/add2), G=8, 4 prompts/step, {args.steps} steps, "
        f"T=0.7, {args.max_new_tokens} new tokens, async, seeds {args.seeds}; ± is half the min-max range over seeds. "
        f"Held-out pass@1 (60 problems, n=4, T=0.7) before training: {100 * before:.1f} %.",
        "",
        "| method | raw ACR (trained batches) | collapsed among generated groups | effective ACR | held-out pass@1 (%) "
        "| train reward, last 5 steps | generated ÷ trained | wall time (min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in METHODS:
        rs = [r for r in results if r["method"] == m]
        if not rs:
            continue
        lines.append(
            f"| {m} | {_ms([r['acr_raw'] for r in rs])} | {_ms([_generated_collapse(r) for r in rs])} | "
            f"{_ms([r['acr_effective'] for r in rs])} | {_ms([r['heldout_pass1'] for r in rs], 100, '{:.1f}')} | "
            f"{_ms([r['reward_last5'] for r in rs])} | "
            f"{_ms([r['generated_per_trained'] for r in rs], 1, '{:.2f}')} | {_ms([r['wall_min'] for r in rs], 1, '{:.1f}')} |"
        )
    precisions = {json.dumps(r.get("precision", {}), sort_keys=True) for r in results}
    for p in sorted(precisions):
        stages = json.loads(p)
        lines.append("\nPrecision: " + ("; ".join(f"{k} {v}" for k, v in stages.items()) or "not recorded") + ".")
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    _plot(results, out / "collapse_study.png")
    return table


def _plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, title in zip(axes, ["acr_raw", "acr_effective", "heldout_pass1"],
                              ["raw ACR", "effective ACR", "held-out pass@1"]):  # fmt: skip
        for i, m in enumerate(METHODS):
            ys = [r[key] for r in results if r["method"] == m]
            if ys:
                ax.bar(i, statistics.mean(ys), color=f"C{i}", alpha=0.6)
                ax.scatter([i] * len(ys), ys, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(METHODS)), list(METHODS))
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/collapse_study")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--model", default="smollm2")
    args = p.parse_args(argv)
    from avspo_openrlhf.cpu.models import prepare

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
    # the same prompts for every method and seed (the seed changes sampling and the data order); a 3x
    # pool so dynamic sampling can refill dropped groups, every run stops at --steps (--run.max_steps)
    train, heldout = qs._data(out / "data", 3 * args.steps, 4, 60, 0)
    base = qs.build_parser().parse_args(["--max-new-tokens", str(args.max_new_tokens), *STUDY_SETTINGS])
    before = qs._eval(model, heldout, out / "eval_before", base, out / "log.txt")["pass@1"]
    results = []
    for seed in args.seeds:
        for m in args.methods:
            print(f"[study] {m} seed {seed}", flush=True)
            results.append(run_one(m, seed, args, out, model, train, heldout))
    print(report(results, before, out, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
