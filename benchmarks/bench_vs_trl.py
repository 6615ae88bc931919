"""Our CPU pipeline against TRL's ``GRPOTrainer`` on the quickstart's work, side by side in one run.

The work is the quickstart's (SmolLM2-135M-Instruct, its 16 training prompts, G = 8, 2 prompts per
step, 32 new tokens, T = 0.7, lr 1e-5 cosine, no KL, 8 steps, fp32), without mid-run evaluation or
checkpoints for either side:

- **ours**: ``avspo-train --backend cpu`` with the flags ``bash quickstart.sh`` passes (the
  quickstart's own ``build_parser`` / ``train_flags``; AVSPO on, as there; ``--grpo`` for plain GRPO),
  in the quickstart's rollout mode for the machine or in each of ``--modes sync,async``;
- **TRL**: ``trl.GRPOTrainer`` (plain GRPO, sync, HF ``generate``, ``loss_type="dapo"``: OpenRLHF's
  ``token-mean``, the loss normalized by the step's action tokens), the same model, data, G, token
  budget, temperature, optimizer (AdamW betas 0.9/0.95, clip 1.0, cosine to 10 % of lr) and steps.

Each side runs in a fresh process timed from its start: **start-up** (process start to the first
step's generation), **first step logged**, **steady step** (median interval between steps 2..N)
and the **training stage** (process start to the last step logged). ``--repeats N`` runs each side
N times, alternating (ours in each mode, then TRL; again), and reports each timing's median: the
machine's load drifts over minutes, and alternating lets the drift reach both sides alike. Then the
held-out gain of each with the quickstart's evaluation (90 problems x 2, paired 95 % bootstrap
interval) and the paired difference of the two trained models. Writes ``bench_vs_trl.md`` / ``.json`` to
``--results`` (docs/cpu.md includes the markdown) and the logs and models under ``--out``.
Skips TRL, with a note, when it is not installed (``pip install -e .[trl]``).

    python benchmarks/bench_vs_trl.py [--modes sync,async] [--repeats 1] [--seed 0] [--skip-eval] [--only ours|trl] [-- flags]

``results/`` here holds the committed table; the TRL side runs in its own process, this file with
``--trl-worker SPEC``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from avspo_openrlhf.cli import quickstart
from avspo_openrlhf.cpu.dtype import cpu_kind
from avspo_openrlhf.study.tables import fmt_interval

HERE = Path(__file__).resolve().parent


def quickstart_args(seed: int, grpo: bool, extra: list[str], mode: str | None = None) -> argparse.Namespace:
    """The quickstart's options, its defaults, with mid-run evaluation and checkpoints off; ``mode``
    (sync/async) overrides the quickstart's choice for this machine."""
    argv = ["--seed", str(seed), "--eval-steps", "0", "--save-steps", "-1"] + (["--grpo"] if grpo else [])
    argv += [f"--{mode}"] if mode else []
    return quickstart.build_parser().parse_args([*argv, "--", *extra] if extra else argv)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def step_times(t0: float, begins: list[float], ends: list[float]) -> dict:
    """Start-up, first step, steady step and training stage from each step's begin/end times."""
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return {
        "startup_s": begins[0] - t0,
        "first_step_logged_s": ends[0] - t0,
        "steady_step_s": statistics.median(gaps) if gaps else ends[0] - begins[0],
        "training_stage_s": ends[-1] - t0,
        "steps": len(ends),
    }


# ── ours ──


def run_ours(qargs, model: str, train: str, out: Path) -> dict:
    """``avspo-train --backend cpu`` with the quickstart's flags; times from its metrics.jsonl
    (``timeline/gen_start`` / ``timeline/step_end`` of each step) and its start-up record."""
    from avspo_openrlhf.report import read_metrics

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train", *quickstart.train_flags(qargs, model, train, out)]
    load = load_average()
    with open(out / "train.log", "wb") as log:
        t0 = time.time()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "AVSPO_VERBOSE": "1"})
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"[bench] avspo-train failed (exit {proc.returncode}); log: {out / 'train.log'}")
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    times = step_times(t0, [r["timeline/gen_start"] for r in rows], [r["timeline/step_end"] for r in rows])
    phases = {
        k.removeprefix("timing/"): statistics.median(r[k] for r in rows[1:] or rows)
        for k in rows[0]
        if k.startswith("timing/") and k != "timing/step_total"
    }
    return {
        **times,
        "process_wall_s": wall,
        "phases_median_s": phases,
        "final": str(out / "final"),
        "load_before": load,
        "load_after": load_average(),
        "flags": quickstart.train_flags(qargs, model, train, out),
    }


# ── TRL ──


def trl_worker(spec_path: str) -> int:
    """The TRL side, in its own process (``--trl-worker SPEC``): GRPOTrainer on the same work,
    each optimizer step's begin/end time appended to ``<out>/steps.jsonl``."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from avspo_openrlhf.data.io import read_jsonl
    from avspo_openrlhf.rewards.arith_reward import score_arith
    from datasets import Dataset

    out = Path(spec["out"])

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.time()

        def on_step_end(self, args, state, control, **kw):
            with open(out / "steps.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, "begin": self.begin, "end": time.time()}) + "\n")

    def arith(completions, answer, **kw):
        return [
            float(score_arith(c[0]["content"] if isinstance(c, list) else c, a) == "correct")
            for c, a in zip(completions, answer)
        ]

    rows = read_jsonl(spec["train"])
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    g, per_step = spec["group_size"], spec["prompts_per_step"]
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        seed=spec["seed"],
        max_steps=spec["steps"],
        num_generations=g,
        per_device_train_batch_size=g * per_step,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        learning_rate=spec["lr"],
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        bf16=False,
        fp16=False,
        use_cpu=True,
        use_vllm=False,
        dataloader_pin_memory=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=arith, args=config, train_dataset=data, processing_class=tok, callbacks=[StepClock()]
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    tok.save_pretrained(str(out / "final"))
    with open(out / "log_history.json", "w", encoding="utf-8") as f:
        json.dump(trainer.state.log_history, f, indent=1)
    return 0


def run_trl(qargs, model: str, train: str, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = {
        "out": str(out),
        "model": model,
        "train": train,
        "seed": qargs.seed,
        "steps": qargs.steps,
        "group_size": qargs.group_size,
        "prompts_per_step": qargs.prompts_per_step,
        "lr": qargs.lr,
        "max_new_tokens": qargs.max_new_tokens,
        "temperature": qargs.temperature,
    }
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    load = load_average()
    with open(out / "train.log", "wb") as log:
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, str(HERE / "bench_vs_trl.py"), "--trl-worker", str(out / "spec.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"[bench] TRL failed (exit {proc.returncode}); log: {out / 'train.log'}")
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {
        **step_times(t0, [s["begin"] for s in steps], [s["end"] for s in steps]),
        "process_wall_s": wall,
        "final": str(out / "final"),
        "load_before": load,
        "load_after": load_average(),
        "config": spec,
    }


# ── report ──

ROWS = [
    ("startup_s", "start-up (process start → step 1 begins)"),
    ("first_step_logged_s", "first step logged (from process start)"),
    ("steady_step_s", "steady step (median, steps 2..N)"),
    ("training_stage_s", "training stage (process start → last step logged)"),
]
TIMINGS = tuple(key for key, _ in ROWS)


def median_runs(runs: list[dict]) -> dict:
    """One side's runs as one: each timing of the table, and each phase of our step, the median over
    the runs; every run's timings and loads kept under ``runs``; the rest (the trained model the
    evaluation scores, the flags) the last run's. One run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    out = {**runs[-1], "runs": [{k: r[k] for k in (*TIMINGS, "load_before", "load_after")} for r in runs]}
    out.update({k: statistics.median(r[k] for r in runs) for k in TIMINGS})
    if "phases_median_s" in runs[-1]:
        out["phases_median_s"] = {
            k: statistics.median(r["phases_median_s"][k] for r in runs if k in r["phases_median_s"])
            for k in runs[-1]["phases_median_s"]
        }
    return out


def _brief(side: dict) -> str:
    return ", ".join(f"{name.split(' (')[0]} {side[key]:.1f} s" for key, name in ROWS)


def _gain(g) -> str:
    return fmt_interval(g) if g else "not evaluated"


def report(res: dict) -> str:
    """The markdown table: one column per mode of ours that ran, TRL, and each mode's ratio to TRL."""
    ours, trl, gains = res.get("ours", {}), res.get("trl"), res.get("gains", {})
    modes = list(ours)
    lines = [
        f"CPU: {res['cpu']}; every stage in {res['precision']} (both sides); seed {res['seed']}; "
        f"{res['label']}; the quickstart's mode on this machine: {res['default_mode']}.",
        "",
    ]
    cols = [f"ours, {m}" for m in modes] + ["TRL `GRPOTrainer`"] + [f"ours {m} / TRL" for m in modes if trl]
    lines += ["| | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for key, name in ROWS:
        cells = [f"{ours[m][key]:.1f} s" for m in modes] + [f"{trl[key]:.1f} s" if trl else "not run"]
        cells += [f"**{ours[m][key] / trl[key]:.2f}×**" for m in modes if trl]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if gains:
        cells = [_gain(gains.get(m)) for m in modes] + [_gain(gains.get("trl"))]
        cells += [f"ours − TRL: {_gain(gains.get(f'{m}_minus_trl'))}" for m in modes if trl]
        lines.append("| held-out gain, points [95 %] | " + " | ".join(cells) + " |")
    runs = [(f"ours {m}", ours[m]) for m in modes] + ([("TRL", trl)] if trl else [])
    load = "; ".join(
        f"{side} " + ", ".join(f"{x['load_before']} → {x['load_after']}" for x in r.get("runs", [r]))
        for side, r in runs
    )
    if res.get("repeats", 1) > 1:
        order = ", ".join([f"ours {m}" for m in modes] + (["TRL"] if trl else []))
        lines += [
            "",
            f"Each side ran {res['repeats']} times, alternating ({order}; then again): each time above is the "
            "median of its runs, each ratio the ratio of the medians.",
        ]
    lines += ["", f"1-minute load average before → after each run ({res['cpu'].split(', ')[1]}): {load}."]
    for m in modes:
        ph = ours[m]["phases_median_s"]
        lines += [
            "",
            f"Our step ({m}), median per phase over steps 2..N (`timing/*` of metrics.jsonl; in async the "
            "generation overlaps the update): " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items()) + ".",
        ]
    if res.get("trl_note"):
        lines += ["", res["trl_note"]]
    return "\n".join(lines) + "\n"


def portable(obj, paths: dict[str, str]):
    """``obj`` with each machine path (run folder, model, repository) replaced by its placeholder:
    the committed results name no one's folders."""
    if isinstance(obj, dict):
        return {k: portable(v, paths) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v, paths) for v in obj]
    if isinstance(obj, str):
        for path, name in paths.items():
            obj = obj.replace(path, name)
    return obj


def main(argv: list[str] | None = None, results: str | Path = HERE / "results", repo: str | Path = HERE.parent) -> int:
    """The benchmark's command: ``results`` is ``--results``'s default, ``repo`` the repository folder
    the committed json names ``<repo>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--trl-worker"]:
        return trl_worker(argv[1])
    from avspo_openrlhf.cpu.cores import default_rollout_mode

    p = argparse.ArgumentParser(prog="bench_vs_trl.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench_vs_trl", help="logs, trained models, evaluations")
    p.add_argument("--results", default=str(results), help="where bench_vs_trl.md/.json go")
    p.add_argument("--seed", type=int, default=0, help="the seed of both sides, of the data and of the bootstrap")
    p.add_argument("--grpo", action="store_true", help="ours in plain GRPO too (default: AVSPO, as the quickstart)")
    p.add_argument("--only", choices=["ours", "trl"], help="run one side")
    p.add_argument(
        "--modes",
        default=default_rollout_mode(),
        help="our rollout modes, comma-separated (sync,async: both, one after the other); default: the "
        "quickstart's for this machine",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each side, alternating ours and TRL; the table reports each timing's median (the "
        "held-out evaluation scores the last run's models)",
    )
    p.add_argument("--skip-eval", action="store_true", help="timings only (no held-out evaluation)")
    p.add_argument("extra", nargs="*", help="after '--': more avspo-train flags for our side")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if bad := [m for m in modes if m not in ("sync", "async")]:
        p.error(f"--modes: {', '.join(bad)}: expected sync and/or async")
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats}: expected 1 or more runs of each side")
    from avspo_openrlhf.cpu.models import prepare

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    qargs = {m: quickstart_args(args.seed, args.grpo, args.extra, m) for m in modes}
    first = qargs[modes[0]]
    model = prepare("smollm2")
    train, heldout = quickstart.write_data(out / "data", first.steps, first.prompts_per_step, first.heldout, first.seed)
    res: dict = {
        "cpu": cpu_kind(),
        "precision": first.dtype,
        "seed": args.seed,
        "default_mode": default_rollout_mode(),
        "label": f"ours {'GRPO' if args.grpo else 'GRPO + AVSPO'}, TRL GRPO",
        "repeats": args.repeats,
        "ours": {},
    }
    with_trl = args.only != "ours" and importlib.util.find_spec("trl") is not None
    if args.only != "ours" and not with_trl:
        res["trl_note"] = "TRL is not installed (`pip install -e .[trl]`): its side was skipped."
        print(f"[bench] {res['trl_note']}")
    runs: dict[str, list[dict]] = {}
    for r in range(args.repeats):
        of = f" (run {r + 1} of {args.repeats})" if args.repeats > 1 else ""
        for m in modes if args.only != "trl" else []:
            print(f"[bench] ours, {m}{of}: avspo-train --backend cpu", flush=True)
            runs.setdefault(m, []).append(run_ours(qargs[m], model, train, out / f"ours_{m}"))
            print(f"[bench] ours, {m}{of}: {_brief(runs[m][-1])}", flush=True)
        if with_trl:
            print(f"[bench] TRL{of}: GRPOTrainer", flush=True)
            runs.setdefault("trl", []).append(run_trl(first, model, train, out / "trl"))
            print(f"[bench] TRL{of}: {_brief(runs['trl'][-1])}", flush=True)
    res["ours"] = {m: median_runs(runs[m]) for m in modes if m in runs}
    if "trl" in runs:
        res["trl"] = median_runs(runs["trl"])
    if not args.skip_eval:
        from avspo_openrlhf.stats import bootstrap_gain

        log = out / "eval.log"
        quickstart.evaluate_heldout(model, heldout, out / "eval_before", first, log)
        recs = {"before": quickstart.eval_records(out / "eval_before")}
        finals = {m: r["final"] for m, r in res["ours"].items()} | (
            {"trl": res["trl"]["final"]} if "trl" in res else {}
        )
        for side, final in finals.items():
            shutil.rmtree(out / f"eval_after_{side}", ignore_errors=True)
            quickstart.evaluate_heldout(final, heldout, out / f"eval_after_{side}", first, log)
            recs[side] = quickstart.eval_records(out / f"eval_after_{side}")
        res["gains"] = {side: bootstrap_gain(recs["before"], recs[side], seed=args.seed)["all"] for side in finals}
        for m in res["ours"]:  # the same problems: ours after minus TRL's after, paired
            if "trl" in recs:
                res["gains"][f"{m}_minus_trl"] = bootstrap_gain(recs["trl"], recs[m], seed=args.seed)["all"]
    text = report(res)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench_vs_trl.md").write_text(text, encoding="utf-8")
    paths = {str(out.resolve()): "<out>", str(out): "<out>", model: "<model>"} | ({str(repo): "<repo>"} if repo else {})
    (results / "bench_vs_trl.json").write_text(json.dumps(portable(res, paths), indent=1), encoding="utf-8")
    print("\n" + text)
    return 0


if __name__ == "__main__":  # the benchmark, and the TRL side's process (run_trl: --trl-worker SPEC)
    sys.exit(main())
