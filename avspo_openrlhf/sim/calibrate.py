"""From a run's ``metrics.jsonl`` to the simulator's inputs, and to a measured timeline.

Per trained step the trainer logs (avspo-openrlhf on top of OpenRLHF's ``timing/*``):

- ``timing/generation``, ``timing/make_experience``, ``timing/ppo_train``, ``timing/broadcast``;
- ``async/sync_lock_wait_s``: the part of ``timing/broadcast`` spent waiting for the generation in
  progress (async mode: the sync needs the engine lock), so the sync's own cost is the difference;
- ``timeline/gen_start``, ``timeline/gen_end``: wall-clock bounds of the batch's generation;
  ``timeline/step_start``, ``timeline/step_end``: of the trainer's step (experience making, update,
  lock wait, weight sync), all ``time.time()`` on the actors' machine.
"""

from __future__ import annotations

import statistics

from avspo_openrlhf.report import read_metrics

from .pipeline import WARMUP_STEPS, Dist, Workload, steady

TIMELINE_KEYS = ("timeline/gen_start", "timeline/gen_end", "timeline/step_start", "timeline/step_end")


def load_rows(path: str) -> list[dict]:
    """Trained steps of a metrics.jsonl (eval rows left out), in step order."""
    import os

    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    rows, _ = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no training steps (is it a run's report/metrics.jsonl?)")
    return rows


def phase_times(row: dict) -> dict:
    """One step's phases in seconds: gen, train (experience + update), sync (without lock wait)."""
    missing = [k for k in ("timing/generation", "timing/make_experience", "timing/ppo_train") if k not in row]
    if missing:
        raise ValueError(f"step {row.get('step')}: metrics lack {', '.join(missing)} (OpenRLHF's timing/* fields)")
    sync = row.get("timing/broadcast", 0.0) - row.get("async/sync_lock_wait_s", 0.0)
    return {
        "gen": row["timing/generation"],
        "train": row["timing/make_experience"] + row["timing/ppo_train"],
        "sync": max(0.0, sync),
    }


def calibrate(rows: list[dict], skip: int | None = None, tail_sigma: float = 0.0, engines: int = 1) -> Workload:
    """A :class:`Workload` whose phase times resample the measured ones; the warm-up steps are left
    out by the same rule as the rates (:func:`~avspo_openrlhf.sim.pipeline.steady`)."""
    use = steady(rows, skip)
    ph = [phase_times(r) for r in use]
    overhead = step_overhead(rows, skip)
    n = statistics.fmean(r.get("rollout/num_samples", 1.0) for r in use)
    length = statistics.fmean(r.get("rollout/response_length_mean", 0.0) for r in use)
    return Workload(
        gen=Dist(tuple(p["gen"] for p in ph), tail_sigma),
        train=Dist(tuple(p["train"] for p in ph)),
        sync=Dist(tuple(p["sync"] for p in ph)),
        engines_ref=engines,
        samples_per_step=n,
        tokens_per_step=n * length,
        overhead=overhead,
        train_warmup=train_warmup(rows, skip),
    )


def train_warmup(rows: list[dict], skip: int | None = None) -> float:
    """Seconds the first step's train phase took beyond a steady one (0 when the run is too short to
    tell): the head start the generator gets in async mode, which decides whether a deep queue fills."""
    use = steady(rows, skip)
    if len(use) == len(rows):
        return 0.0
    return max(0.0, phase_times(rows[0])["train"] - statistics.fmean(phase_times(r)["train"] for r in use))


def step_overhead(rows: list[dict], skip: int | None = None) -> float:
    """Mean seconds per steady step that no phase timer covers. Sync: the interval between step ends
    minus the generation and the trainer's step. Async: the interval minus the phases the trainer
    runs (train, weight sync with its lock wait) and the time it really waited for its batch's
    generation (from the previous step's end to that generation's end): what is left is the
    hand-over (reward, queue get, Ray round trips) and logging, which the trainer's idle time
    (``async/trainer_idle_s``) counts as waiting although the batch was done. 0 without timelines."""
    have = [r for r in rows if all(k in r for k in TIMELINE_KEYS)]
    gaps = []
    for prev, r in zip(have, have[1:]):
        if r["step"] != prev["step"] + 1:
            continue
        interval = r["timeline/step_end"] - prev["timeline/step_end"]
        if "async/trainer_idle_s" in r:  # async (only async logs it)
            ph = phase_times(r)
            waited = max(0.0, r["timeline/gen_end"] - prev["timeline/step_end"])
            covered = ph["train"] + r.get("timing/broadcast", 0.0) + waited
        else:  # sync: generation, then the trainer's step
            covered = r["timeline/step_end"] - r["timeline/gen_start"]
        gaps.append((r["step"], max(0.0, interval - covered)))
    warm = WARMUP_STEPS if skip is None else skip
    use = [g for step, g in gaps if step > warm] or [g for _, g in gaps]
    return statistics.fmean(use) if use else 0.0


def overlap_calibration(sync_rows: list[dict], async_rows: list[dict], skip: int | None = None) -> dict:
    """What only an overlapped run shows: how much slower generation and training are while the
    other runs beside them (mean async phase / mean sync phase - 1, same workload) and the async
    per-step overhead. ``async_rows``: an async run, or a short overlapped probe (3 steps are enough)."""

    def ratio(phase: str) -> float:
        a, b = (statistics.fmean(phase_times(r)[phase] for r in steady(x, skip)) for x in (async_rows, sync_rows))
        return max(0.0, a / b - 1.0) if b > 0 else 0.0

    return {
        "overlap_slowdown": ratio("gen"),
        "train_slowdown": ratio("train"),
        "overhead": step_overhead(async_rows, skip),
        "sync_overhead": step_overhead(sync_rows, skip),
    }


def measured_timeline(rows: list[dict]) -> tuple[list[dict], list[tuple[str, str, float, float]]]:
    """Steps and (lane, phase, start, end) spans of a measured run, in the simulator's shape
    (times relative to the first generation's start)."""
    have = [r for r in rows if all(k in r for k in TIMELINE_KEYS)]
    if not have:
        raise ValueError("metrics lack timeline/* fields (runs of avspo-openrlhf >= 0.4 log them)")
    t0 = min(r["timeline/gen_start"] for r in have)
    steps, spans = [], []
    prev_end = None
    for r in have:
        gs, ge = r["timeline/gen_start"] - t0, r["timeline/gen_end"] - t0
        ss, se = r["timeline/step_start"] - t0, r["timeline/step_end"] - t0
        bc = r.get("timing/broadcast", 0.0)
        lock = min(r.get("async/sync_lock_wait_s", 0.0), bc)
        spans.append(("generator", "generate", gs, ge))
        if prev_end is not None and ss > prev_end:
            spans.append(("trainer", "wait", prev_end, ss))
        spans.append(("trainer", "train", ss, se - bc))
        if lock > 0:
            spans.append(("trainer", "wait", se - bc, se - bc + lock))
        spans.append(("trainer", "sync", se - bc + lock, se))
        steps.append({"step": int(r["step"]), "end": se, "staleness": r.get("async/staleness", 0.0)})
        prev_end = se
    return steps, spans
