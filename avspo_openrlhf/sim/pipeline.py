"""A discrete-event model of the rollout/training pipeline (pure Python: no Ray, vLLM or torch).

It follows OpenRLHF 0.11.2's trainers as this project runs them (docs/async.md has the details):

- ``sync``: generate, train (experience making + policy update), sync weights; one after the other.
  Step time = T_gen + T_train + T_sync.
- ``async`` with queue size ``q``: the generator takes one of ``q`` slots, generates a batch while
  holding the engine lock, and puts it in the queue; the trainer takes a batch (returning its slot),
  trains, then syncs weights *holding the same lock*, so a sync waits for the generation in progress
  and the next generation waits for the sync. In steady state a step takes max(T_gen, T_train) + T_sync.
- ``partial_rollout``: generation does not hold the lock; a weight sync pauses the generation in
  progress for T_sync instead of waiting for it (``--train.partial_rollout_enable``).
- ``max_staleness``: a batch generated more than this many versions before the step that would train
  it is rejected (no training, no sync): its generation was wasted (``--buffer.max_staleness``).

Three terms no phase timer covers (measured on shared CPUs, docs/async.md): ``overhead``, seconds
each trained step costs beyond its phases (queue get, lock round trips, batch hand-over, logging),
and how much slower each phase runs while the other runs beside it (shared cores, memory
bandwidth): a generation progresses at rate 1 / (1 + overlap_slowdown) whenever the trainer is in
its train phase, a train phase at rate 1 / (1 + train_slowdown) whenever a generation runs, each at
rate 1 otherwise. A fourth, ``train_warmup``, lengthens the first train phase (DeepSpeed warm-up): the
generator's head start then decides whether a queue deeper than 1 fills.

Staleness is the project's ``async/staleness``: the trainer's step count minus the policy version the
engine held when the batch's generation started.

Phase times are :class:`Dist` objects: measured values resampled (calibrated from a run, see
:mod:`avspo_openrlhf.sim.calibrate`), optionally with a mean-preserving lognormal tail for
long-tailed response lengths. With ``engines`` different from the workload's ``engines_ref``, each
engine generates its share of the batch in ``draw * engines_ref / engines`` and the batch ends with
the slowest engine (stragglers cost more as engines are added).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field

# steps left out of every rate and calibration: the first pays for engine start, DeepSpeed
# warm-up and filling the pipeline (one rule, so the simulator is judged on the steps it was fed)
WARMUP_STEPS = 1


@dataclass(frozen=True)
class Dist:
    """Seconds for one phase: ``values`` resampled uniformly (one value: deterministic), times a
    mean-1 lognormal factor with ``tail_sigma`` when > 0."""

    values: tuple[float, ...]
    tail_sigma: float = 0.0

    def __post_init__(self):
        if not self.values or any(not (v >= 0 and math.isfinite(v)) for v in self.values):
            raise ValueError(f"phase times must be finite and >= 0, got {self.values!r}")
        if self.tail_sigma < 0:
            raise ValueError(f"tail_sigma must be >= 0, got {self.tail_sigma}")

    @classmethod
    def const(cls, seconds: float) -> Dist:
        return cls((float(seconds),))

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def sample(self, rng: random.Random) -> float:
        v = self.values[0] if len(self.values) == 1 else rng.choice(self.values)
        if self.tail_sigma > 0:
            v *= rng.lognormvariate(-(self.tail_sigma**2) / 2, self.tail_sigma)
        return v


@dataclass(frozen=True)
class Workload:
    """What one training step costs: generation of one batch (on ``engines_ref`` engines), training
    on it (experience making + update) and the weight sync; samples and tokens per step for rates."""

    gen: Dist
    train: Dist
    sync: Dist = Dist((0.0,))
    engines_ref: int = 1
    samples_per_step: float = 1.0
    tokens_per_step: float = 0.0
    overhead: float = 0.0  # seconds per trained step beyond the phases
    overlap_slowdown: float = 0.0  # generation is this much slower while training runs beside it
    train_slowdown: float = 0.0  # training is this much slower while a generation runs beside it
    # async steps pay more than sync ones (queue, batch hand-over between actors); None: ``overhead``
    async_overhead: float | None = None
    # the first train phase takes this much longer (DeepSpeed and allocator warm-up): in async mode
    # the generator runs ahead meanwhile, and a queue that fills then can stay full
    train_warmup: float = 0.0

    def __post_init__(self):
        for name in ("overhead", "overlap_slowdown", "train_slowdown", "async_overhead", "train_warmup"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")


@dataclass(frozen=True)
class PipelineConfig:
    mode: str = "async"  # "sync" | "async"
    queue_size: int = 1
    max_staleness: int | None = None
    partial_rollout: bool = False
    engines: int | None = None  # None: the workload's engines_ref

    def __post_init__(self):
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {self.mode!r}")
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {self.queue_size}")
        if self.max_staleness is not None and self.max_staleness < 1 and self.mode == "async":
            raise ValueError("max_staleness must be >= 1 in async mode (the next batch is always 1 version behind)")

    @property
    def label(self) -> str:
        if self.mode == "sync":
            return "sync"
        s = f"async q={self.queue_size}"
        if self.max_staleness is not None:
            s += f" max_staleness={self.max_staleness}"
        if self.partial_rollout:
            s += " partial"
        return s


@dataclass
class SimResult:
    config: PipelineConfig
    steps: list[dict] = field(default_factory=list)  # one per trained step
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)  # (lane, phase, start, end)
    rejected: int = 0  # over-stale batches generated and thrown away
    samples_per_step: float = 1.0
    tokens_per_step: float = 0.0

    def summary(self, warmup: int = None) -> dict:
        """Rates over the steady state: the steps after the first ``warmup`` (default
        :data:`WARMUP_STEPS`; the first also pays for filling the pipeline), like the measured runs."""
        return summarize(self.steps, self.spans, self.samples_per_step, self.tokens_per_step, warmup) | {
            "rejected_batches": self.rejected
        }


def summarize(
    steps: list[dict], spans, samples_per_step: float, tokens_per_step: float, warmup: int | None = None
) -> dict:
    """Throughput, idle ratios and staleness of a timeline (simulated or measured: same keys).

    ``steps``: dicts with ``end`` (time the step's weight sync finished) and ``staleness``;
    ``spans``: (lane, phase, start, end) with lanes ``generator``/``trainer``. Step k lasts from
    the end of step k-1 (step 1: from the first span's start) to its own end; the rates average the
    steps after the first ``warmup`` (:data:`WARMUP_STEPS`, the rule calibration uses too)."""
    warmup = WARMUP_STEPS if warmup is None else warmup
    ends = [s["end"] for s in steps]
    t0 = min((s for _, _, s, _ in spans), default=0.0)
    durations = [b - a for a, b in zip([t0, *ends], ends)]
    # a run too short to leave any step after the warm-up keeps what it has
    intervals = durations[warmup:] or durations
    step_s = sum(intervals) / len(intervals) if intervals else float("nan")
    t1 = ends[-1] if ends else t0
    wall = max(t1 - t0, 1e-12)

    def busy(lane):
        return sum(min(e, t1) - max(s, t0) for ln, ph, s, e in spans if ln == lane and ph != "wait" and e > s)

    stal = [int(s["staleness"]) for s in steps if s.get("staleness") is not None]
    return {
        "steps": len(steps),
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s if step_s > 0 else float("nan"),
        "samples_per_s": samples_per_step / step_s if step_s > 0 else float("nan"),
        "tokens_per_s": tokens_per_step / step_s if step_s > 0 else float("nan"),
        "wall_s": wall,
        "trainer/idle_ratio": max(0.0, 1 - busy("trainer") / wall),
        "rollouter/idle_ratio": max(0.0, 1 - busy("generator") / wall),
        "staleness_mean": sum(stal) / len(stal) if stal else 0.0,
        "staleness_max": max(stal) if stal else 0,
        "staleness_hist": dict(sorted(Counter(stal).items())),
    }


def steady(rows: list, warmup: int | None = None) -> list:
    """The steps after the warm-up: the one rule rates (:func:`summarize`) and calibration
    (``sim/calibrate.py``) share; a run too short for it keeps everything."""
    warmup = WARMUP_STEPS if warmup is None else warmup
    return rows[warmup:] if len(rows) > warmup else rows


def ideal_speedup(t_gen: float, t_train: float) -> float:
    """(T_gen + T_train) / max(T_gen, T_train): what perfect overlap of the two phases buys."""
    return (t_gen + t_train) / max(t_gen, t_train, 1e-12)


def lock_bound_speedup(t_gen: float, t_train: float, t_sync: float) -> float:
    """The same when the weight sync cannot overlap generation (OpenRLHF's lock, no partial rollout):
    (T_gen + T_train + T_sync) / (max(T_gen, T_train) + T_sync)."""
    return (t_gen + t_train + t_sync) / max(max(t_gen, t_train) + t_sync, 1e-12)


# ── a minimal process-based discrete-event engine ──


class _Sim:
    def __init__(self):
        self.now = 0.0
        self._events: list = []
        self._seq = 0

    def at(self, t: float, fn) -> None:
        heapq.heappush(self._events, (t, self._seq, fn))
        self._seq += 1

    def soon(self, fn) -> None:
        self.at(self.now, fn)

    def run(self) -> None:
        while self._events:
            self.now, _, fn = heapq.heappop(self._events)
            fn()

    def process(self, gen) -> None:
        """Run a generator that yields seconds to wait, or a request ``callable(continuation)``."""

        def resume(value=None):
            try:
                req = gen.send(value)
            except StopIteration:
                return
            if isinstance(req, (int, float)):
                self.at(self.now + req, resume)
            else:
                req(resume)

        self.soon(resume)


class _Store:
    """FIFO store with a capacity; ``get``/``put`` block like ``ray.util.queue.Queue``."""

    def __init__(self, sim: _Sim, capacity: float = math.inf, items=()):
        self.sim, self.capacity = sim, capacity
        self.items, self.getters, self.putters = deque(items), deque(), deque()

    def get(self):
        def req(k):
            if self.items:
                item = self.items.popleft()
                if self.putters:
                    it, pk = self.putters.popleft()
                    self.items.append(it)
                    self.sim.soon(pk)
                self.sim.soon(lambda: k(item))
            else:
                self.getters.append(k)

        return req

    def put(self, item):
        def req(k):
            if self.getters:
                g = self.getters.popleft()
                self.sim.soon(lambda: g(item))
                self.sim.soon(k)
            elif len(self.items) < self.capacity:
                self.items.append(item)
                self.sim.soon(k)
            else:
                self.putters.append((item, k))

        return req


def simulate(workload: Workload, config: PipelineConfig, steps: int = 100, seed: int = 0) -> SimResult:
    """Simulate ``steps`` trained steps; returns the timeline and per-step records."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    rng = random.Random(seed)
    engines = config.engines or workload.engines_ref

    def gen_time() -> float:
        if engines == workload.engines_ref:
            return workload.gen.sample(rng)
        share = workload.engines_ref / engines
        return max(workload.gen.sample(rng) * share for _ in range(engines))

    res = SimResult(config, samples_per_step=workload.samples_per_step, tokens_per_step=workload.tokens_per_step)
    spans = res.spans
    if config.mode == "sync":
        t = 0.0
        for i in range(steps):
            g, tr, sy = gen_time(), workload.train.sample(rng), workload.sync.sample(rng)
            tr += workload.train_warmup if i == 0 else 0.0
            spans += [
                ("generator", "generate", t, t + g),
                ("trainer", "train", t + g, t + g + tr),
                ("trainer", "sync", t + g + tr, t + g + tr + sy),
            ]
            t += g + tr + sy + workload.overhead
            res.steps.append({"step": i + 1, "end": t, "staleness": 0, "version": i})
        return res

    sim = _Sim()
    q = config.queue_size
    slots = _Store(sim, items=[0] * q)
    queue = _Store(sim, capacity=q)
    lock = _Store(sim, capacity=1, items=[None])
    # gen / train: the generation / train phase in progress. A job's end moves when the other phase
    # starts or stops beside it (overlap_slowdown, train_slowdown) or a sync pauses it (partial rollout)
    state = {"version": 0, "done": False, "gen": None, "train": None}
    slow = {"gen": 1.0 + workload.overlap_slowdown, "train": 1.0 + workload.train_slowdown}
    other = {"gen": "train", "train": "gen"}
    overhead = workload.overhead if workload.async_overhead is None else workload.async_overhead

    def rate(kind: str) -> float:
        return 1.0 / slow[kind] if state[other[kind]] is not None else 1.0

    def reschedule(kind: str) -> None:
        job = state[kind]
        job["left"] -= (sim.now - job["since"]) * job["rate"]
        job["since"], job["rate"] = sim.now, rate(kind)
        job["end"] = sim.now + max(job["left"], 0.0) / job["rate"] + job.pop("pause", 0.0)
        job["epoch"] += 1

    def run_job(kind: str, work: float):
        """Wait until ``work`` seconds of this phase are done (at the rates above)."""
        job = state[kind] = {"left": work, "since": sim.now, "rate": rate(kind), "epoch": 0}
        job["end"] = sim.now + work / job["rate"]
        if state[other[kind]] is not None and slow[other[kind]] != 1.0:
            reschedule(other[kind])
        while True:
            epoch = job["epoch"]
            yield job["end"] - sim.now
            if job["epoch"] == epoch:
                break
        state[kind] = None
        if state[other[kind]] is not None and slow[other[kind]] != 1.0:
            reschedule(other[kind])

    def generator():
        while not state["done"]:
            yield slots.get()
            if state["done"]:
                return
            t_wait = sim.now
            if not config.partial_rollout:
                yield lock.get()
            if sim.now > t_wait:
                spans.append(("generator", "wait", t_wait, sim.now))
            start, version = sim.now, state["version"]
            yield from run_job("gen", gen_time())
            if not config.partial_rollout:
                yield lock.put(None)
            spans.append(("generator", "generate", start, sim.now))
            yield queue.put({"version": version, "gen_start": start, "gen_end": sim.now})

    def pause_generation(seconds: float) -> None:
        job = state["gen"]
        if job is not None:
            job["pause"] = job.get("pause", 0.0) + seconds
            reschedule("gen")
            job["left"] += seconds * job["rate"]  # the pause costs wall time, not work: keep it in "left"
            job.pop("pause", None)

    def trainer():
        step = 0
        while step < steps:
            t_wait = sim.now
            batch = yield queue.get()
            yield slots.put(0)
            if sim.now > t_wait:
                spans.append(("trainer", "wait", t_wait, sim.now))
            staleness = step - batch["version"]
            if config.max_staleness is not None and staleness > config.max_staleness:
                res.rejected += 1
                continue
            start = sim.now
            yield from run_job("train", workload.train.sample(rng) + (workload.train_warmup if step == 0 else 0.0))
            spans.append(("trainer", "train", start, sim.now))
            t_wait = sim.now
            yield lock.get()
            if sim.now > t_wait:
                spans.append(("trainer", "wait", t_wait, sim.now))
            sy = workload.sync.sample(rng)
            if config.partial_rollout:
                pause_generation(sy)
            s0 = sim.now
            yield sy
            spans.append(("trainer", "sync", s0, sim.now))
            step += 1
            state["version"] = step
            yield lock.put(None)
            if overhead:
                yield overhead
            res.steps.append({"step": step, "end": sim.now, "staleness": staleness, "version": batch["version"]})
        state["done"] = True

    sim.process(generator())
    sim.process(trainer())
    sim.run()
    return res
