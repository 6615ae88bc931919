"""Disjoint core sets for the CPU backend's engine and training actors (``--cpu.engine_cores`` /
``--cpu.train_cores``): a CPU run shaped like a cluster job with separate generation and training
GPUs, so async rollout can overlap the two instead of making them share every core."""

from __future__ import annotations

import os


def parse_cpulist(text: str, allowed: list[int], taken: frozenset = frozenset(), flag: str = "cores") -> list[int]:
    """``0-3,8`` (core ids) or ``n2`` (the first 2 allowed cores not in ``taken``) -> sorted ids."""
    text = str(text).strip()
    if text[:1] in ("n", "N") and text[1:].isdigit():
        count = int(text[1:])
        free = [c for c in allowed if c not in taken]
        if not 1 <= count <= len(free):
            raise ValueError(f"--cpu.{flag} {text}: asks for {count} cores, {len(free)} free of allowed {allowed}")
        return free[:count]
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if a > b:
                raise ValueError
            out.update(range(a, b + 1))
    except ValueError:
        raise ValueError(
            f"--cpu.{flag} {text!r}: expected a cpulist like 0 | 0-3 | 0,2-3, or a count like n2"
        ) from None
    bad = sorted(out - set(allowed))
    if bad:
        raise ValueError(f"--cpu.{flag} {text}: cores {bad} are not available to this process (allowed: {allowed})")
    return sorted(out)


def resolve_split(engine: str | None, train: str | None, allowed: list[int] | None = None):
    """``(engine_cores, train_cores)`` or ``(None, None)`` without a split; one side alone gets the
    other the remaining allowed cores. Raises ValueError on overlap or an empty side."""
    if not engine and not train:
        return None, None
    allowed = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    e = parse_cpulist(engine, allowed, flag="engine_cores") if engine else None
    t = parse_cpulist(train, allowed, frozenset(e or ()), flag="train_cores") if train else None
    if e is None:
        e = [c for c in allowed if c not in t]
    if t is None:
        t = [c for c in allowed if c not in e]
    if not e or not t:
        raise ValueError(f"--cpu.engine_cores / --cpu.train_cores: a side has no core left (allowed: {allowed})")
    both = sorted(set(e) & set(t))
    if both:
        raise ValueError(f"--cpu.engine_cores {e} and --cpu.train_cores {t} share cores {both}; they must be disjoint")
    return e, t


def cpulist(cores: list[int]) -> str:
    return ",".join(str(c) for c in cores)


def pin_process(cores: list[int]) -> dict:
    """Bind every thread of this process (and those it starts later) to ``cores`` and size torch's
    intra-op pool to match; returns what the process reads back."""
    import torch

    mask = set(cores)
    for tid in os.listdir("/proc/self/task"):  # sched_setaffinity(0) would bind the calling thread only
        try:
            os.sched_setaffinity(int(tid), mask)
        except OSError:  # a thread that exited meanwhile
            pass
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    torch.set_num_threads(len(cores))
    return binding()


def binding() -> dict:
    import torch

    return {"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}


def thread_env(async_enable: bool, split: bool, environ: dict | None = None) -> dict[str, str]:
    """OpenMP settings for the Ray workers. ``OMP_WAIT_POLICY=PASSIVE`` only where the engine and
    the trainer run at the same time on the same cores (async without a core split): spinning
    threads then steal each other's cores (generation 2-4x slower on 2 cores). A process running
    alone (sync, or its own cores) keeps OpenMP's default short spin: PASSIVE made a SmolLM2
    forward + backward 1.6x slower there (each of its many small ops waits for a sleeping thread).
    A policy set in the environment is kept."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_WAIT_POLICY"):
        return {"OMP_WAIT_POLICY": environ["OMP_WAIT_POLICY"]}
    return {"OMP_WAIT_POLICY": "PASSIVE"} if async_enable and not split else {}


ASYNC_MIN_CORES = 4  # below it the quickstart and the studies default to sync (docs/cpu.md#sync-or-async)


def default_rollout_mode(cores: int | None = None) -> str:
    """``"sync"`` or ``"async"`` for a CPU run on ``cores`` cores (default: this process's). Async
    overlaps generation with the update only if they do not fight for the same cores: on 2 cores
    they do (the engine's and the trainer's OpenMP threads must wait passively, and the update runs
    1.6x slower), and sync is faster (docs/cpu.md has the measurement)."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return "async" if cores >= ASYNC_MIN_CORES else "sync"
