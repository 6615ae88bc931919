"""``avspo-simulate``: predict what async rollout buys before spending GPU hours.

    avspo-simulate --from-metrics runs/sync/report/metrics.jsonl --queue-size 1 2 4
    avspo-simulate --phase-times 30 20 2 --queue-size 1 2 --max-staleness 1 --tail-sigma 0.5
    avspo-simulate --cluster experiments/async_throughput/cluster_qwen2.5-math-1.5b.csv --queue-size 1 2

Phase times come from a measured run (``timing/*`` in its metrics.jsonl; best from a sync run on the
split you plan, where nothing overlaps) or are given in seconds. See docs/async.md for the model.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import sys
from collections import Counter

from avspo_openrlhf.sim.calibrate import calibrate, load_rows, overlap_calibration
from avspo_openrlhf.sim.pipeline import (
    WARMUP_STEPS,
    Dist,
    PipelineConfig,
    Workload,
    ideal_speedup,
    lock_bound_speedup,
    simulate,
)

COLUMNS = [
    "mode",
    "step_s",
    "samples_per_s",
    "speedup",
    "ideal",
    "efficiency",
    "trainer/idle_ratio",
    "rollouter/idle_ratio",
    "staleness_mean",
    "staleness_max",
    "rejected_batches",
]


def configs(queue_sizes, max_staleness, partial: bool, engines=None) -> list[PipelineConfig]:
    out = [PipelineConfig("sync", engines=engines)]
    for q in queue_sizes:
        for st in max_staleness:
            out.append(PipelineConfig("async", q, st, False, engines))
            if partial:
                out.append(PipelineConfig("async", q, st, True, engines))
    return out


def predict(workload: Workload, cfgs: list[PipelineConfig], steps: int = 200, seeds: int = 3) -> list[dict]:
    """Mean summary over ``seeds`` simulations per config, with speedups over the sync config. The
    ideal (perfect overlap of generation with training + sync) uses the generation time of the
    engines simulated, as the simulator does (``engines`` of the configs)."""
    if seeds < 1 or steps < 2:
        raise ValueError(f"--seeds must be >= 1 and --steps >= 2, got {seeds} and {steps}")
    rows = []
    for cfg in cfgs:
        runs = [simulate(workload, cfg, steps, seed).summary() for seed in range(seeds)]
        row = {k: statistics.fmean(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
        hist = sum((Counter(r["staleness_hist"]) for r in runs), Counter())
        row.update(
            mode=cfg.label,
            staleness_hist=dict(sorted(hist.items())),
            staleness_max=max(r["staleness_max"] for r in runs),
        )
        rows.append(row)
    base = next(r for r in rows if r["mode"] == "sync")["step_s"]
    engines = next((c.engines for c in cfgs if c.engines), None) or workload.engines_ref
    tg, tt, ts = workload.gen.mean * workload.engines_ref / engines, workload.train.mean, workload.sync.mean
    ideal = ideal_speedup(tg, tt + ts)
    for r in rows:
        r["speedup"] = base / r["step_s"]
        r["ideal"] = ideal
        r["lock_bound_ideal"] = lock_bound_speedup(tg, tt, ts)
        r["efficiency"] = r["speedup"] / ideal
    return rows


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def read_cluster(path: str) -> list[dict]:
    """Rows ``name,gen_gpus,train_gpus,gen_s,train_s,sync_s,source`` (``train_gpus`` 0: colocated,
    i.e. the same GPUs do both phases, so only sync applies)."""
    with open(path, encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.lstrip().startswith("#"))]
    need = {"name", "gen_gpus", "train_gpus", "gen_s", "train_s", "sync_s"}
    if not rows:
        raise ValueError(f"{path}: no rows (a header and one row per GPU split: {', '.join(sorted(need))})")
    for i, r in enumerate(rows, start=2):
        if not need <= set(k for k in r if r[k] not in (None, "")):
            raise ValueError(f"{path}:{i}: needs the columns {', '.join(sorted(need))}")
        try:
            times = [float(r[k]) for k in ("gen_s", "train_s", "sync_s")]
        except ValueError:
            raise ValueError(f"{path}:{i}: gen_s, train_s and sync_s must be numbers") from None
        _check_phase_times(times, f"{path}:{i}")
    return rows


def _check_phase_times(times, where: str) -> None:
    g, t, s = times
    if min(times) < 0 or g + t + s <= 0 or g + t <= 0:
        raise ValueError(f"{where}: phase times must be >= 0 with some generation or training time, got {g} {t} {s}")


def predict_cluster(rows: list[dict], queue_sizes, tail_sigma: float, steps: int, seeds: int) -> list[dict]:
    out = []
    for r in rows:
        w = Workload(
            Dist((float(r["gen_s"]),), tail_sigma), Dist.const(float(r["train_s"])), Dist.const(float(r["sync_s"]))
        )
        colocated = int(r["train_gpus"]) == 0
        cfgs = [PipelineConfig("sync")] + ([] if colocated else [PipelineConfig("async", q) for q in queue_sizes])
        for p in predict(w, cfgs, steps, seeds):
            out.append(
                {
                    "split": r["name"],
                    "mode": p["mode"],
                    "step_s": p["step_s"],
                    "steps_per_hour": 3600 / p["step_s"],
                    "trainer/idle_ratio": p["trainer/idle_ratio"],
                    "rollouter/idle_ratio": p["rollouter/idle_ratio"],
                    "staleness_mean": p["staleness_mean"],
                }
            )
    best = min(o["step_s"] for o in out)
    for o in out:
        o["vs_best"] = o["step_s"] / best
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="avspo-simulate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-metrics", metavar="PATH", help="calibrate phase times from a run's report/metrics.jsonl")
    src.add_argument(
        "--phase-times",
        nargs=3,
        type=float,
        metavar=("GEN", "TRAIN", "SYNC"),
        help="seconds per step: generation, training (experience making + update), weight sync",
    )
    src.add_argument(
        "--cluster",
        metavar="CSV",
        help="one row per GPU split: name,gen_gpus,train_gpus,gen_s,train_s,"
        "sync_s[,source] (train_gpus 0 = colocated); prints the predicted step time of each split and mode",
    )
    p.add_argument("--queue-size", type=int, nargs="+", default=[1, 2, 4], help="async queue sizes to simulate")
    p.add_argument(
        "--max-staleness",
        type=int,
        nargs="+",
        default=None,
        help="staleness bounds to simulate (default: none, i.e. only the queue bounds it)",
    )
    p.add_argument("--partial-rollout", action="store_true", help="also simulate OpenRLHF's partial rollout")
    p.add_argument("--engines", type=int, default=None, help="generation engines (default: as measured / 1)")
    p.add_argument("--engines-ref", type=int, default=1, help="engines of the measured run (--from-metrics)")
    p.add_argument(
        "--tail-sigma",
        type=float,
        default=0.0,
        help="mean-preserving lognormal noise on generation times (long-tailed response lengths)",
    )
    p.add_argument(
        "--overlap-from",
        metavar="PATH",
        help="with --from-metrics SYNC_RUN: an async run's (or a 3-step overlapped probe's) metrics.jsonl, "
        "to calibrate what a sync run cannot show: generation and training slowed by each other beside "
        "them, and the async per-step overhead",
    )
    p.add_argument(
        "--overhead", type=float, default=None, help="seconds per step beyond the phases (default: calibrated, else 0)"
    )
    p.add_argument(
        "--overlap-slowdown",
        type=float,
        default=None,
        help="generation slowdown while training overlaps it, e.g. 0.12 (default: calibrated, else 0)",
    )
    p.add_argument(
        "--train-slowdown",
        type=float,
        default=None,
        help="training slowdown while a generation overlaps it, e.g. 0.04 (default: calibrated, else 0)",
    )
    p.add_argument(
        "--train-warmup",
        type=float,
        default=None,
        help="seconds the first train phase takes beyond a steady one (DeepSpeed warm-up); the generator runs "
        "ahead meanwhile, which decides whether a deep queue fills (default: calibrated, else 0)",
    )
    p.add_argument(
        "--skip-steps",
        type=int,
        default=WARMUP_STEPS,
        help="warm-up steps left out of the calibration and of every rate (one rule for both)",
    )
    p.add_argument("--steps", type=int, default=200, help="simulated training steps per run")
    p.add_argument("--seeds", type=int, default=3, help="simulations per mode (averaged)")
    p.add_argument("--json", metavar="PATH", help="also write the predictions as JSON")
    p.add_argument("--gantt", metavar="PNG", help="plot a timeline of the first steps of sync vs the first async mode")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.seeds < 1 or args.steps < 2 or args.skip_steps < 0:
            raise ValueError(
                f"--seeds must be >= 1, --steps >= 2 and --skip-steps >= 0, got {args.seeds}, {args.steps}, "
                f"{args.skip_steps}"
            )
        if args.engines is not None and args.engines < 1 or args.engines_ref < 1:
            raise ValueError(f"--engines and --engines-ref must be >= 1, got {args.engines} and {args.engines_ref}")
        if args.phase_times:
            _check_phase_times(args.phase_times, "--phase-times")
        if args.from_metrics and not os.path.exists(args.from_metrics):
            raise ValueError(f"--from-metrics {args.from_metrics}: no such file")
        if args.json:  # before minutes of simulation, not after
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        if args.cluster:
            if args.gantt:
                raise ValueError("--gantt draws one workload's timeline: use it with --from-metrics or --phase-times")
            rows = predict_cluster(read_cluster(args.cluster), args.queue_size, args.tail_sigma, args.steps, args.seeds)
            print(
                table(
                    rows,
                    [
                        "split",
                        "mode",
                        "step_s",
                        "steps_per_hour",
                        "vs_best",
                        "trainer/idle_ratio",
                        "rollouter/idle_ratio",
                        "staleness_mean",
                    ],
                )
            )
        else:
            if args.from_metrics:
                rows = load_rows(args.from_metrics)
                w = calibrate(rows, args.skip_steps, args.tail_sigma, args.engines_ref)
                if args.overlap_from:
                    o = overlap_calibration(rows, load_rows(args.overlap_from), args.skip_steps)
                    w = dataclasses.replace(
                        w,
                        overlap_slowdown=o["overlap_slowdown"],
                        train_slowdown=o["train_slowdown"],
                        async_overhead=o["overhead"],
                    )
                elif args.overlap_slowdown is None:
                    print(
                        "note: calibrated from one run: how much generation and training slow each other when they "
                        "overlap and the async per-step overhead are not in it (the sync run's overhead and no "
                        "slowdown assumed, so async is predicted optimistically); add --overlap-from <an async "
                        "run's metrics.jsonl>"
                    )
            else:
                if args.overlap_from:
                    raise ValueError("--overlap-from needs --from-metrics (the sync run it is compared with)")
                g, t, s = args.phase_times
                w = Workload(Dist((g,), args.tail_sigma), Dist.const(t), Dist.const(s))
            given = [
                ("overhead", args.overhead),
                ("async_overhead", args.overhead),
                ("overlap_slowdown", args.overlap_slowdown),
                ("train_slowdown", args.train_slowdown),
                ("train_warmup", args.train_warmup),
            ]
            w = dataclasses.replace(w, **{k: v for k, v in given if v is not None})
            o_async = w.overhead if w.async_overhead is None else w.async_overhead
            print(
                f"phase means: gen {w.gen.mean:.2f} s, train {w.train.mean:.2f} s, sync {w.sync.mean:.2f} s; "
                f"overhead {w.overhead:.3f} s/step (async {o_async:.3f}), generation {100 * w.overlap_slowdown:.0f} % "
                f"slower beside training, training {100 * w.train_slowdown:.0f} % slower beside generation; "
                f"first train phase +{w.train_warmup:.2f} s"
            )
            cfgs = configs(args.queue_size, args.max_staleness or [None], args.partial_rollout, args.engines)
            rows = predict(w, cfgs, args.steps, args.seeds)
            print(table(rows))
            if args.gantt:
                from avspo_openrlhf.sim.plots import plot_gantt

                runs = {c.label: simulate(w, c, 6, 0) for c in cfgs[:2]}
                plot_gantt({k: (r.steps, r.spans) for k, r in runs.items()}, args.gantt, "simulated")
                print(f"timeline: {args.gantt}")
    except (ValueError, OSError) as e:
        print(f"avspo-simulate: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
