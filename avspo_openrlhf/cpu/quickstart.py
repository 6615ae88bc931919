"""The embedded CPU default (``bash quickstart.sh``): SmolLM2-135M-Instruct learns synthetic
arithmetic with GRPO + AVSPO, async, on one CPU machine, through the same ``avspo-train`` a cluster
uses; held-out accuracy before and after, plots, a summary table. Rerunning resumes.

Steps: prepare the model (the PyPI-packaged GGUF -> HF folder, cached) and the data (seeded train
and held-out arithmetic, levels add1 / mul1 / add2) -> evaluate the initial model on the held-out
set -> ``avspo-train --backend cpu`` -> evaluate the trained model -> summary.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

LEVELS = ["add1", "mul1", "add2"]


def _run(cmd: list[str], log: Path) -> None:
    print(f"[quickstart] $ {' '.join(cmd[:4])} ... (log: {log})", flush=True)
    with open(log, "a", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        # Ctrl-C reaches the child too: let it checkpoint and exit (130) while we keep relaying its output
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _relay(proc, f)
        finally:
            signal.signal(signal.SIGINT, previous)
        if proc.wait() in (130, -signal.SIGINT):
            raise KeyboardInterrupt
        if proc.returncode != 0:
            raise SystemExit(f"[quickstart] failed (exit {proc.returncode}); see {log}")


def _relay(proc, f) -> None:
    for line in proc.stdout:  # keep progress bars and step lines visible, everything in the log
        f.write(line)
        if any(s in line for s in ("Global step", "Episode", "[avspo", "problems (", "| ", "Error", "error:")):
            sys.stdout.write(line if len(line) < 400 else line[:400] + " ...\n")
            sys.stdout.flush()


def _data(out: Path, steps: int, per_step: int, heldout: int, seed: int) -> tuple[str, str]:
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n, s in [("train", steps * per_step, seed), ("heldout", heldout, seed + 1000)]:
        path = out / f"{name}.jsonl"
        rows = synthetic_arithmetic(n, LEVELS, seed=s)
        for r in rows:
            r["prompt"] = make_prompt(r["problem"], "user")
        write_jsonl(rows, str(path))  # deterministic: rewriting on a rerun gives the same file
        paths.append(str(path))
    return paths[0], paths[1]


def _eval(model: str, heldout: str, out: Path, args, log: Path) -> dict:
    if not (out / "summary.json").exists():
        _run([sys.executable, "-m", "avspo_openrlhf.evaluation.cli", "--model", model, "--benchmarks", "arith",
              "--data", f"arith={heldout}", "--backend", "vllm-cpu", "--n", "4", "--temperature", "0.7",
              "--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed), "--output", str(out)], log)  # fmt: skip
    return json.loads((out / "summary.json").read_text())["benchmarks"]["arith"]


def train_flags(args, model: str, train: str, out: Path, heldout: str | None = None) -> list[str]:
    from avspo_openrlhf.rewards import arith_reward

    flags = [
        "--backend", "cpu", "--actor.model_name_or_path", model,
        "--data.prompt_dataset", train, "--data.input_key", "prompt", "--data.label_key", "answer",
        "--data.apply_chat_template", "--reward.remote_url", arith_reward.__file__,
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", str(args.group_size),
        "--rollout.batch_size", str(args.prompts_per_step), "--rollout.micro_batch_size", "8",
        "--train.batch_size", str(args.group_size * args.prompts_per_step), "--train.micro_batch_size", "8",
        "--rollout.max_new_tokens", str(args.max_new_tokens), "--data.max_len", str(args.max_new_tokens + 128),
        "--rollout.temperature", str(args.temperature), "--actor.adam.lr", str(args.lr), "--actor.lr_warmup_ratio", "0",
        "--algo.kl.init_coef", "0", "--acr.window", "5", "--ds.zero_stage", "2", "--train.seed", str(args.seed),
        "--ckpt.path", str(out / "ckpt"), "--ckpt.save_steps", str(args.save_steps), "--ckpt.max_num", "1",
        "--ckpt.load_enable", "--ckpt.output_dir", str(out / "final"),
        "--logger.tensorboard_dir", str(out / "tensorboard"), "--report.dir", str(out / "report"), "--report.wandb",
    ]  # fmt: skip
    if heldout and args.eval_steps > 0:  # OpenRLHF's own evaluation: logs eval/<level>/pass1 curves
        flags += ["--eval.dataset", heldout, "--eval.steps", str(args.eval_steps), "--eval.temperature", "0.7",
                  "--eval.n_samples_per_prompt", "2"]  # fmt: skip
    if not args.grpo:
        flags += ["--avspo.enable", "--avspo.tau_init", str(args.tau_init)]
    if not args.sync:
        flags.append("--train.async_enable")
    return flags + list(args.extra)


def summary_table(before: dict, after: dict, rows: list[dict], wall_s: float, label: str) -> str:
    from statistics import mean

    def lvl(s, lv):
        return s.get("pass@1_by_level", {}).get(lv)

    lines = [
        f"## CPU quickstart: {label}",
        "",
        "| held-out accuracy (pass@1, n=4, T=0.7) | before | after |",
        "| --- | --- | --- |",
        f"| all levels | {100 * before['pass@1']:.1f} % | {100 * after['pass@1']:.1f} % |",
    ]
    for lv in LEVELS:
        if lvl(before, lv) is not None:
            lines.append(f"| {lv} | {100 * lvl(before, lv):.1f} % | {100 * lvl(after, lv):.1f} % |")
    if rows:
        lines += [
            "",
            "| training | value |",
            "| --- | --- |",
            f"| steps | {len(rows)} |",
            f"| mean raw ACR (correctness) | {mean(r['acr'] for r in rows):.3f} |",
            f"| mean effective ACR (advantages all zero) | {mean(r['acr_effective'] for r in rows):.3f} |",
            f"| mean reward, first 5 / last 5 steps | {mean(r['rollout/reward_mean'] for r in rows[:5]):.3f} / "
            f"{mean(r['rollout/reward_mean'] for r in rows[-5:]):.3f} |",
            f"| generated / trained samples | {rows[-1].get('dynamic/generated_per_trained_cum', 1.0):.2f} |",
            f"| wall time (this invocation) | {wall_s / 60:.1f} min |",
        ]
    return "\n".join(lines) + "\n"


def plot_heldout(before: dict, after: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["all", *[lv for lv in LEVELS if lv in before.get("pass@1_by_level", {})]]

    def vals(s):
        return [100 * s["pass@1"]] + [100 * s["pass@1_by_level"][lv] for lv in names[1:]]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], vals(before), 0.4, label="before training")
    ax.bar([x + 0.2 for x in xs], vals(after), 0.4, label="after training")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("held-out pass@1 (%)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quickstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/quickstart", help="run folder (rerun with the same folder to resume)")
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
    p.add_argument("--steps", type=int, default=10, help="training steps (one pass over the training prompts)")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=3e-6)
    p.add_argument(
        "--tau-init",
        type=float,
        default=0.25,
        help="AVSPO's initial threshold: this small-batch task sits at ACR ~0.3, below the paper's 0.5, "
        "where the gate would stay closed",
    )
    p.add_argument("--heldout", type=int, default=60, help="held-out problems (20 per level)")
    p.add_argument("--save-steps", type=int, default=5, help="checkpoint interval (Ctrl-C resumes from the last one)")
    p.add_argument(
        "--eval-steps", type=int, default=5, help="held-out evaluation every N steps during training (0: off)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo", action="store_true", help="plain GRPO (AVSPO off; ACR still measured)")
    p.add_argument("--sync", action="store_true", help="synchronous instead of async rollouts")
    p.add_argument("extra", nargs="*", help="after '--': more avspo-train flags")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from avspo_openrlhf.cpu.models import prepare
    from avspo_openrlhf.report import read_metrics

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "quickstart.log"
    model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
    train, heldout = _data(out / "data", args.steps, args.prompts_per_step, args.heldout, args.seed)
    try:
        before = _eval(model, heldout, out / "eval_before", args, log)
        final = out / "final"
        if not (final / "config.json").exists():
            _run(
                [sys.executable, "-m", "avspo_openrlhf.cli.train", *train_flags(args, model, train, out, heldout)], log
            )
        else:
            print(f"[quickstart] training already finished ({final}); delete it to train again")
        after = _eval(str(final), heldout, out / "eval_after", args, log)
    except KeyboardInterrupt:
        print(f"\n[quickstart] stopped; the checkpoint is in {out / 'ckpt'}. Run the same command again to resume.",
              file=sys.stderr)  # fmt: skip
        return 130
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    label = f"{Path(model).name}, {'GRPO' if args.grpo else 'GRPO + AVSPO'}, {'sync' if args.sync else 'async'}"
    table = summary_table(before, after, rows, time.time() - t0, label)
    plot_heldout(before, after, out / "report" / "plots" / "heldout_accuracy.png")
    (out / "summary.md").write_text(table, encoding="utf-8")
    print("\n" + table)
    plots = out / "report" / "plots"
    print(f"plots: {plots}/training_curves.png   metrics: {out / 'report' / 'metrics.jsonl'}   "
          f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}   wandb (offline): {out / 'report' / 'wandb'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
