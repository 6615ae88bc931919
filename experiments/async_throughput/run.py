"""Async throughput: what asynchronous rollout buys on this machine, what staleness costs, and how
well the pipeline simulator (``avspo-simulate``) predicts it.

    python experiments/async_throughput/run.py --out runs/async_throughput          # CPU, ~30 min on 2 cores
    python experiments/async_throughput/run.py --out runs/a --modes sync async-q1 --steps 2 --seeds 0  # smoke

Every mode trains the same workload (model, prompts, G, steps, seed) with ``avspo-train``; all but
``sync-all`` put the rollout engine and the DeepSpeed actors on disjoint cores (``--split E/T``
cores, ``--cpu.engine_cores``/``--cpu.train_cores``), the shape of a cluster job with separate
generation and training GPUs, so ``sync`` on the same split is the fair baseline. From each run's
``metrics.jsonl`` (``timing/*``, ``timeline/*``, ``async/*``): wall time per step, samples/s and
tokens/s, speedup over sync and the ideal ``(T_gen + T_train) / max(T_gen, T_train)`` from the sync
run's own phases, idle ratios, staleness, reward and ACR; the simulator, calibrated on each seed's
sync run, predicts every mode, and its error is reported. ``--learning`` adds held-out accuracy
after the quickstart's 8 steps for sync vs async modes (``--learning-seeds``; ~11 min per run on 2 cores).

On a GPU machine the same modes run with ``--backend gpu`` and the resource flags of your split,
e.g. ``-- --actor.num_gpus_per_node 4 --vllm.num_engines 4`` (documented; not run in CI).

Writes ``results.md``, ``results.json`` and plots (timeline, throughput, staleness, learning
curves) to ``--results`` (default: this folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from avspo_openrlhf.sim import (
    PipelineConfig,
    calibrate,
    ideal_speedup,
    load_rows,
    lock_bound_speedup,
    measured_timeline,
    simulate,
    summarize,
)
from avspo_openrlhf.sim.pipeline import WARMUP_STEPS
from avspo_openrlhf.sim.plots import plot_curves, plot_gantt, plot_staleness, plot_throughput

HERE = Path(__file__).resolve().parent

# name: (async queue size or None for sync, use the core split, extra avspo-train flags, simulator config)
MODES = {
    "sync-all": (None, False, [], PipelineConfig("sync")),
    "sync": (None, True, [], PipelineConfig("sync")),
    "async-q1": (1, True, [], PipelineConfig("async", 1)),
    "async-q2": (2, True, [], PipelineConfig("async", 2)),
    "async-q4": (4, True, [], PipelineConfig("async", 4)),
    "async-q4-stale1": (4, True, ["--buffer.max_staleness", "1"], PipelineConfig("async", 4, max_staleness=1)),
    # OpenRLHF 0.11.2's off-policy correction (TIS: token-level IS weights clipped to [0.5, 5])
    "async-q2-iscorr": (
        2,
        True,
        ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"],
        PipelineConfig("async", 2),
    ),  # fmt: skip
    "async-q1-partial": (1, True, ["--train.partial_rollout_enable"], PipelineConfig("async", 1, partial_rollout=True)),
}
GPU_ONLY = {"async-q1-partial": "vLLM pause/resume for in-flight weight sync: GPU engines only"}
DEFAULT_MODES = [m for m in MODES if m not in GPU_ONLY]


def _workload_args(a, seed: int, mode: str) -> SimpleNamespace:
    q, _, _, _ = MODES[mode]
    return SimpleNamespace(group_size=a.group_size, prompts_per_step=a.prompts_per_step, max_new_tokens=a.max_new_tokens,
                           temperature=1.0, lr=a.lr, seed=seed, save_steps=10**6, eval_steps=0, tau_init=0.25,
                           grpo=False, sync=q is None, dtype=a.dtype, extra=[])  # fmt: skip


def _model(a, root: Path) -> str:
    from avspo_openrlhf.cpu.models import prepare

    return (
        prepare(a.model, str(root / "tiny_model") if a.model == "tiny" else None)
        if a.model in ("smollm2", "tiny")
        else a.model
    )


def run_mode(a, model: str, mode: str, seed: int, root: Path) -> Path:
    """One avspo-train run; returns its folder (skipped when its metrics are complete)."""
    from avspo_openrlhf.cli.quickstart import _data, train_flags

    out = root / mode / f"seed{seed}"
    if (out / "DONE").exists():
        return out
    if out.exists():  # a killed run: start over, its metrics would mix two runs
        shutil.rmtree(out)
    q, split, flags, _ = MODES[mode]
    flags = [*flags, "--train.max_epochs", str(a.ppo_epochs)]
    train, _ = _data(root / "data" / f"seed{seed}", a.steps, a.prompts_per_step, 0, seed)
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train",
           *train_flags(_workload_args(a, seed, mode), model, train, out), *flags]  # fmt: skip
    cmd[cmd.index("--backend") + 1] = a.backend
    if q is not None:
        cmd += ["--train.async_queue_size", str(q)]
    if split and a.backend == "cpu":
        e, t = a.split.split("/")
        cmd += ["--cpu.engine_cores", f"n{e}", "--cpu.train_cores", f"n{t}"]
    cmd += a.extra
    out.mkdir(parents=True, exist_ok=True)
    print(f"[async] {mode} seed {seed} -> {out}", flush=True)
    t0 = time.time()
    with open(out / "train.log", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if r.returncode != 0:
        raise SystemExit(f"[async] {mode} seed {seed} failed (exit {r.returncode}); see {out / 'train.log'}")
    print(f"[async] {mode} seed {seed}: {time.time() - t0:.0f} s", flush=True)
    (out / "DONE").write_text(f"{time.time() - t0:.1f} s\n")
    return out


def measure(run: Path) -> dict:
    rows = load_rows(str(run / "report" / "metrics.jsonl"))
    steps, spans = measured_timeline(rows)
    n = statistics.fmean(r.get("rollout/num_samples", 0.0) for r in rows)
    toks = n * statistics.fmean(r.get("rollout/response_length_mean", 0.0) for r in rows)
    s = summarize(steps, spans, n, toks)  # WARMUP_STEPS, the rule calibrate uses
    w = calibrate(rows)
    s["phases"] = {"gen": w.gen.mean, "train": w.train.mean, "sync": w.sync.mean}
    s["phases"]["lock_wait"] = statistics.fmean(r.get("async/sync_lock_wait_s", 0.0) for r in rows[1:] or rows)
    s["reward"] = [(r["step"], r.get("rollout/reward_mean", 0.0)) for r in rows]
    s["acr"] = [(r["step"], r.get("acr", 0.0)) for r in rows]
    s["acr_effective"] = [(r["step"], r.get("acr_effective", 0.0)) for r in rows]
    s["rejected"] = float(rows[-1].get("async/dropped_stale_batches_cum", 0.0))
    binding = run / "report" / "cpu_binding.json"
    s["cpu_binding"] = json.loads(binding.read_text()) if binding.exists() else None
    s["timeline"] = {"steps": steps, "spans": spans}
    s["_workload"], s["_n_steps"] = w, len(rows)  # the simulator's inputs (left out of results.json)
    return s


def analyse(measured: dict[str, dict[int, dict]]) -> list[dict]:
    """Per mode, means over seeds: measured rates, speedup over the same seed's sync run, the ideal,
    and the simulator's prediction (calibrated on that sync run) with its error."""
    rows = []
    for mode, seeds in measured.items():
        per = []
        for seed, m in seeds.items():
            base = measured.get("sync", {}).get(seed)
            r = {"step_s": m["step_s"], "samples_per_s": m["samples_per_s"], "tokens_per_s": m["tokens_per_s"],
                 "trainer/idle_ratio": m["trainer/idle_ratio"], "rollouter/idle_ratio": m["rollouter/idle_ratio"],
                 "staleness_mean": m["staleness_mean"], **{f"T_{k}": v for k, v in m["phases"].items()}}  # fmt: skip
            if base is not None:
                ph = base["phases"]
                r["speedup"] = base["step_s"] / m["step_s"]
                r["ideal"] = ideal_speedup(ph["gen"], ph["train"] + ph["sync"])
                r["lock_bound_ideal"] = lock_bound_speedup(ph["gen"], ph["train"], ph["sync"])
                r["efficiency"] = r["speedup"] / r["ideal"]
                # (a) what a user can do before trying async: calibrate on the sync run of the same split;
                # (b) the pipeline model alone: calibrate on this mode's own phase times
                n_steps = m["_n_steps"]  # same length as measured: the pipeline's fill-up counts alike
                for key, w in (("", base["_workload"]), ("own_", m["_workload"])):
                    sims = [simulate(w, MODES[mode][3], n_steps, s).summary() for s in range(5)]
                    r[f"{key}predicted_step_s"] = statistics.fmean(x["step_s"] for x in sims)
                    r[f"{key}predicted_staleness_mean"] = statistics.fmean(x["staleness_mean"] for x in sims)
                    # + : the simulator predicts a higher throughput than measured
                    r[f"{key}throughput_error"] = m["step_s"] / r[f"{key}predicted_step_s"] - 1
                r["predicted_speedup"] = base["step_s"] / r["predicted_step_s"]
            per.append(r)
        agg = {k: statistics.fmean(p[k] for p in per) for k in per[0] if all(k in p for p in per)}
        hist = sum((Counter(m["staleness_hist"]) for m in seeds.values()), Counter())
        if all("speedup" in p for p in per):  # every seed's value, not only the mean
            agg["speedup_seeds"] = [p["speedup"] for p in per]
            agg["speedup_sd"] = statistics.stdev(agg["speedup_seeds"]) if len(per) > 1 else float("nan")
        agg["rejected_mean"] = statistics.fmean(m.get("rejected", 0.0) for m in seeds.values())
        agg.update(mode=mode, seeds=sorted(seeds), staleness_hist=dict(sorted(hist.items())),
                   reward_mean=statistics.fmean(v for m in seeds.values() for _, v in m["reward"]),
                   acr_mean=statistics.fmean(v for m in seeds.values() for _, v in m["acr"]),
                   acr_effective_mean=statistics.fmean(v for m in seeds.values() for _, v in m["acr_effective"]))  # fmt: skip
        rows.append(agg)
    return rows


def _f(v, pct=False):
    if v is None or v == "":
        return "-"
    return f"{100 * v:+.1f} %" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))


def results_table(rows: list[dict]) -> str:
    cols = [("mode", "mode", False), ("s/step", "step_s", False), ("samples/s", "samples_per_s", False),
            ("tokens/s", "tokens_per_s", False), ("speedup vs sync", "speedup", False),
            ("speedup sd (seeds)", "speedup_sd", False), ("ideal (timer estimate)", "ideal", False),
            ("efficiency", "efficiency", False), ("trainer/idle_ratio", "trainer/idle_ratio", False),
            ("rollouter/idle_ratio", "rollouter/idle_ratio", False), ("staleness mean", "staleness_mean", False),
            ("simulated s/step (from sync)", "predicted_step_s", False),
            ("sim. error (from sync)", "throughput_error", True),
            ("sim. error (own phases)", "own_throughput_error", True),
            ("sim. staleness", "own_predicted_staleness_mean", False), ("reward", "reward_mean", False),
            ("raw ACR", "acr_mean", False), ("effective ACR", "acr_effective_mean", False)]  # fmt: skip
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(_f(r.get(k), pct) for _, k, pct in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def phases_table(rows: list[dict]) -> str:
    lines = [
        "| mode | T_gen | T_train (experience + update) | T_sync | lock wait before sync |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r['mode']} | {r.get('T_gen', 0):.2f} s | {r.get('T_train', 0):.2f} s | {r.get('T_sync', 0):.2f} s | "
              f"{r.get('T_lock_wait', 0):.2f} s |" for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def learning(a, root: Path) -> dict:
    """Held-out accuracy after the quickstart's 8 steps (SmolLM2, all cores) per mode and seed."""
    out = {}
    for mode in a.learning_modes:
        q = MODES[mode][0]
        for seed in a.learning_seeds:
            run = root / "learning" / mode / f"seed{seed}"
            if not (run / "summary.json").exists():
                extra = ["--sync"] if q is None else ["--", "--train.async_queue_size", str(q), *MODES[mode][2]]
                print(f"[async] learning {mode} seed {seed} -> {run}", flush=True)
                subprocess.run([sys.executable, "-m", "avspo_openrlhf.cli.quickstart", "--out", str(run), "--seed",
                                str(seed), *extra], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            out.setdefault(mode, {})[seed] = json.loads((run / "summary.json").read_text())
    return out


def learning_table(res: dict) -> str:
    def g(x):
        return f"{100 * x[0]:+.1f} [{100 * x[1]:+.1f}, {100 * x[2]:+.1f}]"

    lines = [
        "| mode | seed | held-out before → after | gain, points [95 % CI] | wall time |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode, seeds in res.items():
        for seed, s in sorted(seeds.items()):
            lines.append(f"| {mode} | {seed} | {100 * s['before']['pass@1']:.1f} % → {100 * s['after']['pass@1']:.1f} % | "
                         f"{g(s['gain_ci95']['all'])} | {s['wall_min']:.1f} min |")  # fmt: skip
        gains = [s["gain_ci95"]["all"][0] for s in seeds.values()]
        lines.append(f"| {mode} | mean | | {100 * statistics.fmean(gains):+.1f} | |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default="runs/async_throughput", help="run folders (a finished run is not rerun)")
    p.add_argument("--results", default=str(HERE), help="where results.md/json and the plots go")
    p.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES),
                   help="sync-all: sync on all cores; sync: sync on the split (the baseline); async-qN: queue size N; "
                   "-stale1: --buffer.max_staleness 1; -iscorr: OpenRLHF's TIS off-policy correction; -partial: "
                   "--train.partial_rollout_enable (GPU only)")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds (each draws its own prompts)")
    p.add_argument("--model", default="tiny", help="tiny (random 2-layer model: phases of comparable length), "
                   "smollm2, or a path / hub id")  # fmt: skip
    p.add_argument("--backend", choices=["cpu", "gpu"], default="cpu", help="avspo-train --backend")
    p.add_argument("--split", default="1/1", help="engine/training cores (CPU backend), counts")
    p.add_argument("--steps", type=int, default=14, help="training steps per run (the first is left out of rates)")
    p.add_argument("--group-size", type=int, default=8, help="G: samples per prompt")
    p.add_argument("--prompts-per-step", type=int, default=4, help="prompt groups per step")
    p.add_argument("--max-new-tokens", type=int, default=128, help="token budget per completion")
    p.add_argument("--ppo-epochs", type=int, default=3, help="--train.max_epochs: passes over each batch; with the "
                   "tiny model 3 make training take about as long as generation on a 1/1 core split")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-5, help="actor learning rate")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="--cpu.dtype of the throughput runs (auto: the machine's fast precision; throughput only). "
                   "The --learning runs are quickstarts: fp32 in every stage")  # fmt: skip
    p.add_argument("--learning", action="store_true", help="also run held-out accuracy per mode (quickstart runs)")
    p.add_argument(
        "--learning-modes",
        nargs="+",
        default=["sync", "async-q1"],
        choices=DEFAULT_MODES,
        help="modes compared by held-out accuracy (--learning)",
    )
    p.add_argument("--learning-seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the --learning runs")
    p.add_argument("extra", nargs="*", help="after '--': more avspo-train flags for every run")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    root, res_dir = Path(a.out).resolve(), Path(a.results)
    res_dir.mkdir(parents=True, exist_ok=True)
    modes = [m for m in a.modes if a.backend == "gpu" or m not in GPU_ONLY]
    for m in set(a.modes) - set(modes):
        print(f"[async] {m}: skipped on the CPU backend ({GPU_ONLY[m]})")
    model = _model(a, root)
    measured: dict[str, dict[int, dict]] = {}
    for seed in a.seeds:
        for mode in modes:
            run = run_mode(a, model, mode, seed, root)
            measured.setdefault(mode, {})[seed] = measure(run)
    rows = analyse(measured)
    text = [f"workload: model {a.model}, {a.prompts_per_step} prompts x G={a.group_size}, {a.max_new_tokens} new tokens, "
            f"{a.ppo_epochs} PPO epochs, {a.steps} steps, seeds {a.seeds}, split {a.split} (engine/training cores), backend {a.backend}\n",
            results_table(rows), "\nmean phase times per step (s):\n", phases_table(rows)]  # fmt: skip
    learn = learning(a, root) if a.learning else {}
    if learn:
        text += [
            "\nheld-out accuracy after 8 steps (quickstart workload, SmolLM2-135M, all cores):\n",
            learning_table(learn),
        ]
    (res_dir / "results.md").write_text("".join(text))
    keep = {mode: {s: {k: v for k, v in m.items() if not k.startswith("_") and k != "timeline"} for s, m in seeds.items()}
            for mode, seeds in measured.items()}  # fmt: skip
    (res_dir / "results.json").write_text(json.dumps({"args": {k: v for k, v in vars(a).items()}, "modes": rows,
                                                      "runs": keep, "learning": learn}, indent=1, default=str))  # fmt: skip
    seed0 = a.seeds[0]
    gantt = {f"measured: {m}": (measured[m][seed0]["timeline"]["steps"], measured[m][seed0]["timeline"]["spans"])
             for m in ("sync", "async-q1", "async-q2") if m in measured}  # fmt: skip
    if gantt:
        ends = [s["end"] for st, _ in gantt.values() for s in st[: WARMUP_STEPS + 6]]
        plot_gantt(gantt, str(res_dir / "timeline.png"), "generator and trainer activity (warm-up and 6 steps, seed "
                   f"{seed0}); sync waits, async overlaps", max_s=max(ends) if ends else None,
                   warmup_steps=WARMUP_STEPS)  # fmt: skip
    plot_throughput([r for r in rows if "speedup" in r], str(res_dir / "throughput.png"))
    plot_staleness({r["mode"]: r["staleness_hist"] for r in rows if r["mode"].startswith("async")},
                   str(res_dir / "staleness.png"), {r["mode"]: r["rejected_mean"] for r in rows})  # fmt: skip
    curves = {m: {k: [measured[m][s][k] for s in measured[m]] for k in ("reward", "acr")} for m in measured}
    plot_curves(curves, "reward", str(res_dir / "reward_curves.png"), "mean reward",
                f"throughput workload ({a.model}): the reward shows no learning, only that every mode ran")  # fmt: skip
    print("".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
