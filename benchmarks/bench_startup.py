"""Where ``avspo-train --backend cpu``'s start-up goes: one short run of the tiny random model (the
test suite's shape: 8 prompts, G = 4, 12 new tokens, 2 steps, fp32), in a fresh process, and its
``startup.json`` (``avspo_openrlhf/startup.py``) as a table: the driver's phases in order, what the
other processes did beside them. ``--repeats N`` runs it N times and reports each phase's median;
``--async`` starts the async mode instead (its generator and training actors, queue and lock).

    python benchmarks/bench_startup.py                       # writes benchmarks/results/startup_tiny.md
    python benchmarks/bench_startup.py --async               # writes benchmarks/results/startup_tiny_async.md
    python benchmarks/bench_startup.py --repeats 3 --out /tmp/startup.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from avspo_openrlhf.cpu import tiny  # noqa: E402
from avspo_openrlhf.cpu.dtype import cpu_kind  # noqa: E402


def one_run(assets: dict, out: Path, async_mode: bool = False) -> dict:
    flags = [
        "--backend", "cpu", "--actor.model_name_or_path", assets["model"], "--data.prompt_dataset", assets["data"],
        "--data.input_key", "prompt", "--data.label_key", "answer", "--data.apply_chat_template",
        "--reward.remote_url", str(ROOT / "tests" / "fixtures" / "hash_reward.py"),
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4",
        "--rollout.micro_batch_size", "8", "--train.batch_size", "16", "--train.micro_batch_size", "8",
        "--rollout.max_new_tokens", "12", "--data.max_len", "96", "--algo.kl.init_coef", "0", "--remedy", "avspo",
        "--data.max_samples", "8", "--cpu.dtype", "fp32", "--report.dir", str(out),
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        *(["--train.async_enable"] if async_mode else []),
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WANDB_MODE": "offline", "AVSPO_VERBOSE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags], capture_output=True, text=True, env=env
    )
    if r.returncode:
        raise SystemExit(f"the run failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    state = json.loads((out / "startup.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    state["first_step_s"] = rows[0]["timeline/gen_start"] - state["process_start"]
    return state


def table(states: list[dict], async_mode: bool = False) -> str:
    med = statistics.median
    phases: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in states:
        for span in s["spans"]:
            phases.setdefault((span["phase"], span["where"]), []).append((span["start_s"], span["end_s"]))
    lines = [
        f"`python benchmarks/bench_startup.py{' --async' if async_mode else ''}` ({len(states)} run{'s' if len(states) > 1 else ''}, medians). "
        f"CPU: {cpu_kind()}; the tiny random model, fp32. Seconds from the process's start.",
        "",
        "| phase | process | from | to | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (phase, where), spans in sorted(phases.items(), key=lambda kv: med(e for _, e in kv[1])):
        start, end = med(a for a, _ in spans), med(b for _, b in spans)
        lines.append(f"| {phase} | {where} | {start:.1f} | {end:.1f} | {med(b - a for a, b in spans):.1f} |")
    lines.append(f"| **start-up (to the first step's generation)** | driver | 0.0 | "
                 f"{med(s['first_step_s'] for s in states):.1f} | **{med(s['first_step_s'] for s in states):.1f}** |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=1, help="runs, one after another (each phase's median is reported)")
    p.add_argument("--async", dest="async_mode", action="store_true", help="the async mode's start-up")
    p.add_argument("--out", help="the table (Markdown); default benchmarks/results/startup_tiny[_async].md")
    args = p.parse_args(argv)
    out = args.out or str(ROOT / "benchmarks" / "results" / f"startup_tiny{'_async' if args.async_mode else ''}.md")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        assets = tiny.tiny_assets(os.path.join(tmp, "assets"), 32)
        states = [one_run(assets, Path(tmp) / f"run{i}", args.async_mode) for i in range(args.repeats)]
    text = table(states, args.async_mode)
    Path(out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
