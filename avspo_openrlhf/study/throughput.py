"""Async throughput: what asynchronous rollout buys on this machine, what staleness costs, and how
well the pipeline simulator (``avspo-simulate``) predicts it.

    python experiments/async_throughput/run.py --workload documented --dtype bf16   # CPU, ~17 min on 2 cores
    python experiments/async_throughput/run.py --workload untuned --dtype fp32
    python experiments/async_throughput/run.py --out runs/a --results /tmp/a --modes sync async-q1 --steps 2 --seeds 0  # smoke

Every mode trains the same workload (model, prompts, G, steps, seed) with ``avspo-train``; all but
``sync-all`` put the rollout engine and the DeepSpeed actors on disjoint cores (``--split E/T``
cores, ``--cpu.engine_cores``/``--cpu.train_cores``), the shape of a cluster job with separate
generation and training GPUs, so ``sync`` on the same split is the fair baseline. From each run's
``metrics.jsonl`` (``timing/*``, ``timeline/*``, ``async/*``): wall time per step, samples/s and
tokens/s, speedup over sync and the ideal ``(T_gen + T_train) / max(T_gen, T_train)`` from the sync
run's own phases, idle ratios, staleness, reward and ACR, start-up time and the step count where async
breaks even with sync. The simulator predicts every mode calibrated three ways, each with its error:
on the seed's sync run alone (what a user has before trying async; it cannot see the overlap terms),
on that sync run plus a short overlapped probe (the first ``PROBE_STEPS`` steps of the seed's
async-q1 run: one warm-up + 3 overlapped steps; the rest of that run is not used), and on the mode's
own phase times (the pipeline model alone). The host's load (busy share of its cores in the 5 s
before each run, from /proc/stat) is recorded beside each run. ``--learning`` adds held-out accuracy
after the quickstart's 8 steps for sync vs async modes (``--learning-seeds``; ~11 min per run on 2 cores).

On a GPU machine the same modes run with ``--backend gpu`` and the resource flags of your split,
e.g. ``-- --actor.num_gpus_per_node 4 --vllm.num_engines 4`` (documented; not run in CI).

Writes ``results.md``, ``results.json`` and plots (timeline, throughput, staleness, reward curves)
to ``--results`` (default: ``<workload>-<precision>/`` in the experiment folder, experiments/async_throughput/),
then rebuilds the experiment folder's ``results.md``: one table over every workload and precision measured so
far. ``--learning`` writes ``learning.md``/``learning.json`` there (every run kept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from avspo_openrlhf.cpu.dtype import cpu_kind, resolve_cpu_dtype
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
from avspo_openrlhf.sim.calibrate import overlap_calibration
from avspo_openrlhf.sim.pipeline import WARMUP_STEPS
from avspo_openrlhf.sim.plots import plot_curves, plot_gantt, plot_staleness, plot_throughput

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
    ),
    "async-q1-partial": (1, True, ["--train.partial_rollout_enable"], PipelineConfig("async", 1, partial_rollout=True)),
}
GPU_ONLY = {"async-q1-partial": "vLLM pause/resume for in-flight weight sync: GPU engines only"}
DEFAULT_MODES = ["sync-all", "sync", "async-q1", "async-q2", "async-q4", "async-q4-stale1"]
PROBE_STEPS = WARMUP_STEPS + 3  # the overlapped probe: warm-up + 3 overlapped steps of the async-q1 run
# "documented" was tuned on a 2-core EPYC without native bf16 so that generation and training take
# about as long on one core each (1.2-1.4 s); "untuned" is a workload nobody tuned, with short steps;
# "long" has the longest steps (1.3 s a sync step on the 2-core EPYC with native bf16, 2.5x untuned)
WORKLOADS = {
    "documented": dict(prompts_per_step=4, group_size=8, max_new_tokens=128, ppo_epochs=3, steps=14),
    "untuned": dict(prompts_per_step=8, group_size=8, max_new_tokens=96, ppo_epochs=1, steps=24),
    "long": dict(prompts_per_step=8, group_size=8, max_new_tokens=256, ppo_epochs=2, steps=10),
}


def host_busy(seconds: float = 5.0, stat: str = "/proc/stat") -> float:
    """Busy share of this process's cores over ``seconds`` (/proc/stat; nan where it is missing):
    what else ran on the host just before a run."""
    cores = sorted(os.sched_getaffinity(0))

    def sample():
        out = {}
        with open(stat) as f:
            for line in f:
                name, *vals = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                    v = [int(x) for x in vals]
                    out[name] = (sum(v), v[3] + v[4])  # total, idle + iowait
        return out

    try:
        a = sample()
        time.sleep(seconds)
        b = sample()
    except OSError:
        return float("nan")
    total = sum(b[k][0] - a[k][0] for k in b)
    idle = sum(b[k][1] - a[k][1] for k in b)
    return 1 - idle / total if total > 0 else float("nan")


def _workload_args(a, seed: int, mode: str) -> SimpleNamespace:
    q, _, _, _ = MODES[mode]
    return SimpleNamespace(
        group_size=a.group_size,
        prompts_per_step=a.prompts_per_step,
        max_new_tokens=a.max_new_tokens,
        temperature=1.0,
        lr=a.lr,
        seed=seed,
        save_steps=10**6,
        eval_steps=0,
        tau_init=0.25,
        grpo=False,
        sync=q is None,
        dtype=a.dtype,
        extra=[],
    )


def _model(a, root: Path) -> str:
    from avspo_openrlhf.cpu.models import prepare

    return (
        prepare(a.model, str(root / "tiny_model") if a.model == "tiny" else None)
        if a.model in ("smollm2", "tiny")
        else a.model
    )


def run_mode(a, model: str, mode: str, seed: int, root: Path) -> Path:
    """One avspo-train run; returns its folder (skipped when its metrics are complete)."""
    from avspo_openrlhf.cli.quickstart import train_flags, write_data

    out = root / mode / f"seed{seed}"
    if (out / "DONE").exists():
        return out
    if out.exists():  # a killed run: start over, its metrics would mix two runs
        shutil.rmtree(out)
    q, split, flags, _ = MODES[mode]
    flags = [*flags, "--train.max_epochs", str(a.ppo_epochs)]
    train, _ = write_data(root / "data" / f"seed{seed}", a.steps, a.prompts_per_step, 0, seed)
    cmd = [
        sys.executable,
        "-m",
        "avspo_openrlhf.cli.train",
        *train_flags(_workload_args(a, seed, mode), model, train, out),
        *flags,
    ]
    cmd[cmd.index("--backend") + 1] = a.backend
    if q is not None:
        cmd += ["--train.async_queue_size", str(q)]
    if split and a.backend == "cpu":
        e, t = a.split.split("/")
        cmd += ["--cpu.engine_cores", f"n{e}", "--cpu.train_cores", f"n{t}"]
    cmd += a.extra
    out.mkdir(parents=True, exist_ok=True)
    busy = host_busy()
    print(f"[async] {mode} seed {seed} -> {out} (host busy {100 * busy:.0f} % before)", flush=True)
    t0 = time.time()
    with open(out / "train.log", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if r.returncode != 0:
        raise SystemExit(f"[async] {mode} seed {seed} failed (exit {r.returncode}); see {out / 'train.log'}")
    wall = time.time() - t0
    print(f"[async] {mode} seed {seed}: {wall:.0f} s", flush=True)
    # written last: a run without it is rerun
    (out / "DONE").write_text(json.dumps({"launch": t0, "wall_s": wall, "host_busy_before": busy}) + "\n")
    return out


def measure(run: Path) -> dict:
    rows = load_rows(str(run / "report" / "metrics.jsonl"))
    try:
        done = json.loads((run / "DONE").read_text())
    except ValueError:  # a run of an earlier version of this script: its wall time only
        done = {}
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
    s["_workload"], s["_n_steps"], s["_rows"] = w, len(rows), rows  # the simulator's inputs (not in results.json)
    if done:
        # start-up: launch to the first generation (Ray, model loads, engines); fixed cost: what the run
        # took beyond its steps at the steady rate (start-up, warm-up, final save and shutdown)
        s["startup_s"] = min(r["timeline/gen_start"] for r in rows if "timeline/gen_start" in r) - done["launch"]
        s["run_wall_s"] = done["wall_s"]
        s["fixed_s"] = done["wall_s"] - len(rows) * s["step_s"]
        s["host_busy_before"] = done.get("host_busy_before", float("nan"))
    return s


def analyse(measured: dict[str, dict[int, dict]]) -> list[dict]:
    """Per mode, means over seeds: measured rates, speedup over the same seed's sync run, the ideal,
    and the simulator's prediction (calibrated on that sync run) with its error."""
    rows = []
    # (c) the overlap terms from the sync run + the first PROBE_STEPS steps of async-q1, once per seed
    probes = {
        seed: overlap_calibration(measured["sync"][seed]["_rows"], m["_rows"][:PROBE_STEPS])
        for seed, m in measured.get("async-q1", {}).items()
        if seed in measured.get("sync", {})
    }
    for mode, seeds in measured.items():
        per = []
        for seed, m in seeds.items():
            base = measured.get("sync", {}).get(seed)
            everything = measured.get("sync-all", {}).get(seed)
            o = probes.get(seed)
            r = {
                "step_s": m["step_s"],
                "samples_per_s": m["samples_per_s"],
                "tokens_per_s": m["tokens_per_s"],
                "trainer/idle_ratio": m["trainer/idle_ratio"],
                "rollouter/idle_ratio": m["rollouter/idle_ratio"],
                "staleness_mean": m["staleness_mean"],
                **{f"T_{k}": v for k, v in m["phases"].items()},
                **{k: m[k] for k in ("startup_s", "run_wall_s", "fixed_s", "host_busy_before") if k in m},
            }
            if everything is not None:
                r["speedup_vs_all"] = everything["step_s"] / m["step_s"]
            if base is not None:
                ph = base["phases"]
                r["speedup"] = base["step_s"] / m["step_s"]
                r["ideal"] = ideal_speedup(ph["gen"], ph["train"] + ph["sync"])
                r["lock_bound_ideal"] = lock_bound_speedup(ph["gen"], ph["train"], ph["sync"])
                r["efficiency"] = r["speedup"] / r["ideal"]
                # (a) what a user can do before trying async: calibrate on the sync run of the same split;
                # (b) the pipeline model alone: calibrate on this mode's own phase times; (c) the sync run
                # plus the first PROBE_STEPS steps of async-q1 (the two slowdowns and the async overhead)
                n_steps = m["_n_steps"]  # same length as measured: the pipeline's fill-up counts alike
                # sync-all runs on other cores than the sync run: only its own phases predict it
                calib = [("own_", m["_workload"])] + ([("", base["_workload"])] if mode != "sync-all" else [])
                if o is not None and mode != "sync-all":  # (c) the sync run + the overlapped probe
                    w = base["_workload"]
                    if MODES[mode][0] is not None:
                        w = replace(
                            w,
                            overlap_slowdown=o["overlap_slowdown"],
                            train_slowdown=o["train_slowdown"],
                            async_overhead=o["overhead"],
                        )
                    calib.append(("probe_", w))
                    r["probe_overlap_slowdown"], r["probe_train_slowdown"] = o["overlap_slowdown"], o["train_slowdown"]
                    r["probe_overhead_s"], r["sync_overhead_s"] = o["overhead"], o["sync_overhead"]
                for key, w in calib:
                    sims = [simulate(w, MODES[mode][3], n_steps, s).summary() for s in range(5)]
                    r[f"{key}predicted_step_s"] = statistics.fmean(x["step_s"] for x in sims)
                    r[f"{key}predicted_staleness_mean"] = statistics.fmean(x["staleness_mean"] for x in sims)
                    # + : the simulator predicts a higher throughput than measured
                    r[f"{key}throughput_error"] = m["step_s"] / r[f"{key}predicted_step_s"] - 1
                if "predicted_step_s" in r:
                    r["predicted_speedup"] = base["step_s"] / r["predicted_step_s"]
                if "probe_predicted_step_s" in r:
                    r["probe_predicted_speedup"] = base["step_s"] / r["probe_predicted_step_s"]
                if "fixed_s" in m and "fixed_s" in base and mode != "sync":
                    # steps N at which N * step + fixed cost is equal: more steps, and async is faster end to end
                    gain = base["step_s"] - m["step_s"]
                    extra = m["fixed_s"] - base["fixed_s"]
                    r["extra_startup_s"] = m["startup_s"] - base["startup_s"]
                    r["extra_fixed_s"] = extra
                    r["break_even_steps"] = max(0.0, extra / gain) if gain > 0 else float("inf")
            per.append(r)
        agg = {k: statistics.fmean(p[k] for p in per) for k in per[0] if all(k in p for p in per)}
        hist = sum((Counter(m["staleness_hist"]) for m in seeds.values()), Counter())
        for k in (
            "speedup",
            "speedup_vs_all",
            "throughput_error",
            "probe_throughput_error",
            "own_throughput_error",
            "break_even_steps",
        ):  # every seed's value, not only the mean
            if all(k in p for p in per):
                agg[f"{k}_seeds"] = [p[k] for p in per]
                vals = agg[f"{k}_seeds"]
                agg[f"{k}_sd"] = (
                    statistics.stdev(vals) if len(vals) > 1 and all(map(math.isfinite, vals)) else float("nan")
                )
        if "break_even_steps_seeds" in agg:  # the mean of a value that can be infinite says little
            agg["break_even_steps"] = statistics.median(agg["break_even_steps_seeds"])
        agg["rejected_mean"] = statistics.fmean(m.get("rejected", 0.0) for m in seeds.values())
        agg.update(
            mode=mode,
            seeds=sorted(seeds),
            staleness_hist=dict(sorted(hist.items())),
            reward_mean=statistics.fmean(v for m in seeds.values() for _, v in m["reward"]),
            acr_mean=statistics.fmean(v for m in seeds.values() for _, v in m["acr"]),
            acr_effective_mean=statistics.fmean(v for m in seeds.values() for _, v in m["acr_effective"]),
        )
        rows.append(agg)
    return rows


def _f(v, pct=False):
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "never"
    if pct == "share":
        return f"{100 * v:.0f} %"
    return f"{100 * v:+.1f} %" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))


def _seeds(r: dict, key: str, pct: bool = False) -> str:
    """``mean (a, b, c)``: the mean and every seed's value."""
    vals = r.get(f"{key}_seeds")
    if not vals:
        return _f(r.get(key), pct)
    return f"{_f(r.get(key), pct)} ({', '.join(_f(v, pct) for v in vals)})"


def results_table(rows: list[dict]) -> str:
    cols = [
        ("mode", "mode", False),
        ("s/step", "step_s", False),
        ("samples/s", "samples_per_s", False),
        ("tokens/s", "tokens_per_s", False),
        ("speedup vs sync", "speedup", False),
        ("speedup sd (seeds)", "speedup_sd", False),
        ("speedup vs sync-all", "speedup_vs_all", False),
        ("ideal (timer estimate)", "ideal", False),
        ("efficiency", "efficiency", False),
        ("trainer/idle_ratio", "trainer/idle_ratio", False),
        ("rollouter/idle_ratio", "rollouter/idle_ratio", False),
        ("staleness mean", "staleness_mean", False),
        ("simulated s/step (from sync)", "predicted_step_s", False),
        ("sim. error (from sync)", "throughput_error", True),
        ("sim. error (sync + probe)", "probe_throughput_error", True),
        ("sim. error (own phases)", "own_throughput_error", True),
        ("sim. staleness", "own_predicted_staleness_mean", False),
        ("reward", "reward_mean", False),
        ("raw ACR", "acr_mean", False),
        ("effective ACR", "acr_effective_mean", False),
        ("start-up s", "startup_s", False),
        ("break-even steps (median)", "break_even_steps", False),
        ("host busy before", "host_busy_before", "share"),
    ]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(_f(r.get(k), pct) for _, k, pct in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def phases_table(rows: list[dict]) -> str:
    lines = [
        "| mode | T_gen | T_train (experience + update) | T_sync | lock wait before sync |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['mode']} | {r.get('T_gen', 0):.2f} s | {r.get('T_train', 0):.2f} s | {r.get('T_sync', 0):.2f} s | "
        f"{r.get('T_lock_wait', 0):.2f} s |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def results_page(d: dict) -> str:
    """A ``<workload>-<precision>/results.md`` from its ``results.json`` (``--summary-only`` rebuilds
    every one that way): the workload line, the results table and the phase times. A blank line before
    each table: Markdown takes a table that follows a line of text for more of that paragraph."""
    a = d["args"]
    return (
        f"workload {d['workload']}: model {a['model']}, {a['prompts_per_step']} prompts x G={a['group_size']}, "
        f"{a['max_new_tokens']} new tokens, {a['ppo_epochs']} PPO epochs, {a['steps']} steps, seeds {a['seeds']}, "
        f"split {a['split']} (engine/training cores), backend {a['backend']}, precision {d['precision']}, "
        f"{d['cpu']}\n\n{results_table(d['modes'])}\nmean phase times per step (s):\n\n{phases_table(d['modes'])}"
    )


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
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "avspo_openrlhf.cli.quickstart",
                        "--out",
                        str(run),
                        "--seed",
                        str(seed),
                        *extra,
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
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
            lines.append(
                f"| {mode} | {seed} | {100 * s['before']['pass@1']:.1f} % → {100 * s['after']['pass@1']:.1f} % | "
                f"{g(s['gain_ci95']['all'])} | {s['wall_min']:.1f} min |"
            )
        gains = [s["gain_ci95"]["all"][0] for s in seeds.values()]
        lines.append(f"| {mode} | mean | | {100 * statistics.fmean(gains):+.1f} | |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="documented",
        help="preset of the five workload flags below (each one given overrides it): "
        + "; ".join(
            f"{k}: {v['prompts_per_step']} prompts x G={v['group_size']}, {v['max_new_tokens']} "
            f"tokens, {v['ppo_epochs']} PPO epochs, {v['steps']} steps"
            for k, v in WORKLOADS.items()
        ),
    )
    p.add_argument(
        "--out",
        default=None,
        help="run folders (a finished run is not rerun; default: runs/async_throughput/<workload>-<precision>)",
    )
    p.add_argument(
        "--results",
        default=None,
        help="where results.md/json and the plots go (default: "
        "<workload>-<precision>/ in the experiment folder, and its results.md is rebuilt)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=DEFAULT_MODES,
        choices=list(MODES),
        help="sync-all: sync on all cores; sync: sync on the split (the baseline); async-qN: queue size N; "
        "-stale1: --buffer.max_staleness 1; -iscorr: OpenRLHF's TIS off-policy correction; -partial: "
        "--train.partial_rollout_enable (GPU only). The probe calibration needs async-q1",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (each draws its own prompts)")
    p.add_argument(
        "--model", default="tiny", help="tiny (random 2-layer model: short phases), smollm2, or a path / hub id"
    )
    p.add_argument("--backend", choices=["cpu", "gpu"], default="cpu", help="avspo-train --backend")
    p.add_argument("--split", default="1/1", help="engine/training cores (CPU backend), counts")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (the first is left out of rates)")
    p.add_argument("--group-size", type=int, default=None, help="G: samples per prompt")
    p.add_argument("--prompts-per-step", type=int, default=None, help="prompt groups per step")
    p.add_argument("--max-new-tokens", type=int, default=None, help="token budget per completion")
    p.add_argument(
        "--ppo-epochs",
        type=int,
        default=None,
        help="--train.max_epochs: passes over each batch (with the "
        "tiny model, 3 made training take about as long as generation on a 1/1 split of a 2-core EPYC "
        "without native bf16; about twice as long on one with it)",
    )
    p.add_argument("--lr", type=float, default=1e-5, help="actor learning rate")
    p.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="--cpu.dtype of the throughput runs (auto: as avspo-train resolves it on this machine; the "
        "precision used names the results folder). The --learning runs are quickstarts: fp32 in every stage",
    )
    p.add_argument("--learning", action="store_true", help="also run held-out accuracy per mode (quickstart runs)")
    p.add_argument(
        "--learning-modes",
        nargs="+",
        default=["sync", "async-q1"],
        choices=DEFAULT_MODES,
        help="modes compared by held-out accuracy (--learning)",
    )
    p.add_argument("--learning-seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the --learning runs")
    p.add_argument(
        "--summary-only",
        action="store_true",
        help="only rebuild the results.md of every "
        "<workload>-<precision>/ folder and the experiment folder's summary from their results.json",
    )
    p.add_argument("extra", nargs="*", help="after '--': more avspo-train flags for every run")
    return p


SUMMARY_MODES = ("sync-all", "async-q1", "async-q2", "async-q4", "async-q4-stale1", "async-q2-iscorr")


def summary(here: Path) -> str:
    """One table over every ``<workload>-<precision>/results.json`` here: speedups with each seed,
    both baselines, the simulator's three errors, start-up and break-even, the host's load."""
    lines = [
        "Every workload and precision measured (per combination: `<workload>-<precision>/results.md`). "
        "Speedup over sync on the same core split, mean (each seed); sim. errors: + means the simulator "
        "predicted a higher throughput than measured; `from sync`: calibrated on the sync run alone; "
        "`sync + probe`: plus the first 4 steps of the async-q1 run (the overlap terms); `own`: on the "
        "mode's own phase times. Break-even: the median over seeds of the step count from which the "
        "mode is faster than sync end to end.\n\n",
        "| workload | precision | CPU | mode | sync s/step | speedup vs sync | vs sync-all | ideal (timer est.) | "
        "sim. error from sync | sim. error sync + probe | sim. error own | extra start-up s | "
        "break-even steps | host busy before (max) |\n",
        "|" + " --- |" * 14 + "\n",
    ]
    for f in sorted(here.glob("*/results.json")):
        d = json.loads(f.read_text())
        if "workload" not in d:
            continue
        modes = {m["mode"]: m for m in d["modes"]}
        busy = max((r.get("host_busy_before", 0.0) for ms in d["runs"].values() for r in ms.values()), default=0.0)
        sync = modes.get("sync", {})
        for name in SUMMARY_MODES:
            m = modes.get(name)
            if m is None or "speedup" not in m:
                continue
            lines.append(
                f"| {d['workload']} | {d['precision']} | {d['cpu']} | {name} | {_f(sync.get('step_s'))} | "
                f"{_seeds(m, 'speedup')} | {_f(m.get('speedup_vs_all'))} | {_f(m.get('ideal'))} | "
                f"{_seeds(m, 'throughput_error', True)} | {_seeds(m, 'probe_throughput_error', True)} | "
                f"{_seeds(m, 'own_throughput_error', True)} | {_f(m.get('extra_startup_s'))} | "
                f"{_f(m.get('break_even_steps'))} | {100 * busy:.0f} % |\n"
            )
    return "".join(lines)


def _fill_workload(a) -> str:
    """The workload flags not given take the preset's values; returns the workload's name."""
    custom = False
    for k, v in WORKLOADS[a.workload].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
        custom |= getattr(a, k) != v
    return f"{a.workload}-custom" if custom else a.workload


def main(here: Path, argv: list[str] | None = None) -> int:
    """The study; ``here`` is its experiment folder (the default results and the summary go there)."""
    a = build_parser().parse_args(argv)
    if a.summary_only:
        for f in sorted(here.glob("*/results.json")):  # each combination's page, from its published numbers
            d = json.loads(f.read_text())
            if "workload" in d:
                (f.parent / "results.md").write_text(results_page(d))
        (here / "results.md").write_text(summary(here))
        print((here / "results.md").read_text())
        return 0
    name = _fill_workload(a)
    base = Path(a.out or "runs/async_throughput").resolve()
    model = _model(a, base)
    precision = resolve_cpu_dtype(a.dtype, model=model) if a.backend == "cpu" else "gpu"
    combo = f"{name}-{precision}"
    root = base if a.out else base / combo
    res_dir = Path(a.results) if a.results else here / combo
    res_dir.mkdir(parents=True, exist_ok=True)
    a.dtype = precision if a.backend == "cpu" else a.dtype  # every run of this folder in the same precision
    modes = [m for m in a.modes if a.backend == "gpu" or m not in GPU_ONLY]
    for m in set(a.modes) - set(modes):
        print(f"[async] {m}: skipped on the CPU backend ({GPU_ONLY[m]})")
    measured: dict[str, dict[int, dict]] = {}
    for seed in a.seeds:
        for mode in modes:
            run = run_mode(a, model, mode, seed, root)
            measured.setdefault(mode, {})[seed] = measure(run)
    rows = analyse(measured)
    cpu = cpu_kind() if a.backend == "cpu" else "GPU"
    keep = {
        mode: {s: {k: v for k, v in m.items() if not k.startswith("_") and k != "timeline"} for s, m in seeds.items()}
        for mode, seeds in measured.items()
    }
    published = {
        "workload": name,
        "precision": precision,
        "cpu": cpu,
        "args": {k: v for k, v in vars(a).items()},
        "modes": rows,
        "runs": keep,
    }
    (res_dir / "results.json").write_text(json.dumps(published, indent=1, default=str))
    text = results_page(json.loads((res_dir / "results.json").read_text()))
    (res_dir / "results.md").write_text(text)
    seed0 = a.seeds[0]
    gantt = {
        f"measured: {m}": (measured[m][seed0]["timeline"]["steps"], measured[m][seed0]["timeline"]["spans"])
        for m in ("sync", "async-q1", "async-q2")
        if m in measured
    }
    if gantt:
        ends = [s["end"] for st, _ in gantt.values() for s in st[: WARMUP_STEPS + 6]]
        plot_gantt(
            gantt,
            str(res_dir / "timeline.png"),
            f"generator and trainer activity (warm-up and 6 steps, seed {seed0}); sync waits, async overlaps",
            max_s=max(ends) if ends else None,
            warmup_steps=WARMUP_STEPS,
        )
    plot_throughput([r for r in rows if "speedup" in r], str(res_dir / "throughput.png"))
    plot_staleness(
        {r["mode"]: r["staleness_hist"] for r in rows if r["mode"].startswith("async")},
        str(res_dir / "staleness.png"),
        {r["mode"]: r["rejected_mean"] for r in rows},
    )
    curves = {m: {k: [measured[m][s][k] for s in measured[m]] for k in ("reward", "acr")} for m in measured}
    plot_curves(
        curves,
        "reward",
        str(res_dir / "reward_curves.png"),
        "mean reward",
        f"throughput workload ({a.model}): the reward shows no learning, only that every mode ran",
    )
    print(text)
    if res_dir.resolve().parent == here:
        (here / "results.md").write_text(summary(here))
    if a.learning:
        learn = learning(a, base)
        (here / "learning.md").write_text(
            "held-out accuracy after 8 steps (quickstart workload, SmolLM2-135M, all "
            "cores, fp32 in every stage; every run kept):\n" + learning_table(learn)
        )
        (here / "learning.json").write_text(json.dumps(learn, indent=1))
    return 0
