"""Many runs of a study at once on one device: K (method, seed) runs, each in its own process
(``python -m avspo_openrlhf.study.loop``), a new one started as soon as one ends; or, with
``engine="stacked"``, K runs in one process of the stacked engine (``study/engine.py``), batch after
batch.

Separate processes, not threads or one batched model: each run keeps its own CUDA context, random
streams and checkpoint, a crash ends one run, and a run is the same computation whether it ran
alone or beside K - 1 others (tested on the CPU). A run that was killed (preemption, Ctrl-C, a
node lost) resumes from its checkpoint when the study is started again; a run whose folder holds
``result.json`` is done and is not started. SIGTERM/SIGINT stop the children the same way, so a
Slurm job's time limit or ``scancel`` leaves every run resumable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study.spec import RunSpec


@dataclass(frozen=True)
class Job:
    spec: RunSpec
    run_dir: Path

    @property
    def name(self) -> str:
        return self.run_dir.name

    def done(self) -> bool:
        return (self.run_dir / "result.json").exists()

    def result(self) -> dict:
        return json.loads((self.run_dir / "result.json").read_text(encoding="utf-8"))


def _start(job: Job, threads: int, env: dict[str, str], k: int = 1) -> subprocess.Popen:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    request = job.run_dir / "spec.request.json"  # the loop checks it against the folder's spec.json
    atomic_write(request, job.spec.to_json())
    child_env = {**os.environ, **env, "AVSPO_RUNS_AT_ONCE": str(k)}  # recorded with its wall time
    if threads:  # torch's and OpenMP's pools: K runs must not each take every core
        child_env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "avspo_openrlhf.study.loop", str(request), str(job.run_dir)]
    if threads:
        cmd += ["--threads", str(threads)]
    log = open(job.run_dir / "log.txt", "a", encoding="utf-8")  # noqa: SIM115 (closed when the run ends)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    finally:
        log.close()  # the child holds its own copy


def _start_batch(batch: list[Job], threads: int, env: dict[str, str]) -> subprocess.Popen:
    """K runs in one process of the stacked engine (``study/engine.py``); its output in the first
    run's folder as ``batch.log`` (each run's own lines and traceback go to its ``log.txt``)."""
    cmd = [sys.executable, "-m", "avspo_openrlhf.study.engine"]
    for job in batch:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        request = job.run_dir / "spec.request.json"
        atomic_write(request, job.spec.to_json())
        cmd += [str(request), str(job.run_dir)]
    child_env = {**os.environ, **env}
    if threads:
        child_env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        cmd += ["--threads", str(threads)]
    log = open(batch[0].run_dir / "batch.log", "a", encoding="utf-8")  # noqa: SIM115 (the child holds its own copy)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    finally:
        log.close()


class Deadline:
    """When no new run (process engine) or batch (stacked engine) may start: after ``start_until``, or
    when it would not end by ``finish_by`` (both ``time.monotonic()`` values): a launch is expected to
    take as long as the longest one so far in this call, or ``first_s`` before any has ended (None:
    unknown, the first starts). A time-limited call (a GPU slot, a Slurm job) then ends with its
    runs finished rather than cut."""

    def __init__(self, start_until: float | None = None, finish_by: float | None = None, first_s: float | None = None):
        self.start_until, self.finish_by, self.longest = start_until, finish_by, first_s

    def ended(self, seconds: float) -> None:
        self.longest = max(self.longest or 0.0, seconds)

    def why_not(self) -> str | None:
        """Why no launch may start now, or None."""
        now = time.monotonic()
        if self.start_until is not None and now >= self.start_until:
            return "no new run after the time given"
        if self.finish_by is not None and self.longest is not None and now + self.longest > self.finish_by:
            return f"a launch takes ~{self.longest / 60:.1f} min, more than is left before the time to finish by"
        return None


def exit_words(rc: int | None) -> str:
    """A run process's exit code in words: a SIGKILL nobody asked for is, on a machine short of memory,
    the kernel's out-of-memory killer (the console would otherwise say only ``exit -9``)."""
    if rc in (-9, 137):
        return (
            f"exit {rc}: killed by SIGKILL, most often the kernel's out-of-memory killer (fewer runs at once, "
            "--k, or a smaller --micro-batch; `dmesg` names it)"
        )
    if rc is not None and rc < 0:
        return f"exit {rc}: killed by signal {-rc}"
    return f"exit {rc}"


class Progress:
    """Runs done of a call's total, and the time left at the pace so far (runs finish ``k`` at a time,
    so the estimate is the mean wall time per finished run times those left): one console line per
    finished run."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def line(self, n: int = 1) -> str:
        self.done += n
        left = self.total - self.done
        if not left:
            return f"{self.done}/{self.total} runs ended"
        eta = (time.monotonic() - self.t0) / self.done * left
        return f"{self.done}/{self.total} runs ended, about {eta / 60:.1f} min left"


def failure_reason(job: Job, rc: int | None, launched: float) -> str:
    """Why a run stopped, in a few words for the console: its own error's last line where it recorded
    one in this launch (``failure.json``), else its process's exit (:func:`exit_words`)."""
    own = job.run_dir / "failure.json"
    if own.exists() and own.stat().st_mtime >= launched:
        return json.loads(own.read_text(encoding="utf-8"))["error"]
    return exit_words(rc)


def note_crash(job: Job, rc: int | None, log_file: Path, launched: float) -> None:
    """A run that ended without a result and without recording an error of its own (the process of its
    batch crashed, or was killed: out of memory, a signal): ``crashed.json`` in its folder, so the
    report lists it. It resumes when started again; a crash is not the run's own failure."""
    own = job.run_dir / "failure.json"
    if own.exists() and own.stat().st_mtime >= launched:
        return  # the run recorded its own error in this launch (loop.note_failure)
    atomic_write(
        job.run_dir / "crashed.json",
        json.dumps({"exit_code": rc, "log": str(log_file), "time": time.time()}),
    )


def default_threads(k: int) -> int:
    """CPU threads per run: the cores shared out among the K runs (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, k))


def run_jobs(
    jobs: list[Job],
    k: int,
    *,
    threads: int | None = None,
    env: dict[str, str] | None = None,
    on_done: Callable[[Job, int], None] | None = None,
    log: Callable[[str], None] = print,
    poll_s: float = 0.5,
    start_until: float | None = None,
    engine: str = "process",
    finish_by: float | None = None,
    first_launch_s: float | None = None,
) -> list[str]:
    """Run ``jobs`` ``k`` at a time; ``on_done(job, returncode)`` after each. No run starts after
    ``start_until``, nor one expected to end after ``finish_by`` (:class:`Deadline`; ``first_launch_s``
    the expected seconds of the first launch): a job with a time limit lets its last runs finish
    instead of killing them midway. Returns the names of the runs that failed (their ``log.txt``
    says why, a crash of their process ``crashed.json``; they resume when started again).
    ``engine="stacked"``: the runs go ``k`` to a process of the stacked engine, one batch at a time
    (each batch uses the whole device)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    deadline = Deadline(start_until, finish_by, first_launch_s)
    if engine == "stacked":
        return _run_batches(jobs, k, threads, env, on_done, log, poll_s, deadline)
    threads = default_threads(k) if threads is None else threads
    pending = [j for j in jobs if not j.done()]
    running: dict[str, tuple[Job, subprocess.Popen, float, float]] = {}
    failed: list[str] = []
    progress = Progress(len(pending))
    with _Stop(lambda: [r[1] for r in running.values()]) as stop:
        while (pending and not stop.stopping) or running:
            why = deadline.why_not() if pending and len(running) < k else None
            if why:
                log(f"[study] {why}: {len(pending)} left for a later call")
                pending = []
            while pending and len(running) < k and not stop.stopping:
                job = pending.pop(0)
                running[job.name] = (job, _start(job, threads, env or {}, k), time.monotonic(), time.time())
                log(
                    f"[study] started {job.name} ({progress.total - len(pending)}/{progress.total}, {len(running)} running)"
                )
            for name, (job, proc, t0, launched) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[name]
                deadline.ended(time.monotonic() - t0)
                if rc != 0 or not job.done():
                    failed.append(name)
                    if not stop.stopping:
                        note_crash(job, rc, job.run_dir / "log.txt", launched)
                    why = failure_reason(job, rc, launched)
                    log(f"[study] {name} failed ({why}): see {job.run_dir / 'log.txt'}; {progress.line()}")
                else:
                    log(f"[study] {name} done; {progress.line()}")
                if on_done is not None:
                    on_done(job, rc)
            time.sleep(poll_s)
    return failed


class _Stop:
    """SIGTERM/SIGINT while runs are live (Slurm's time limit, scancel, Ctrl-C): each live process group
    gets SIGTERM (its runs stop at their checkpoints), no run starts after, and KeyboardInterrupt is
    raised once they are gone: every run resumes when the study is started again."""

    def __init__(self, live: Callable[[], list[subprocess.Popen]]):
        self.live, self.stopping = live, False

    def _stop(self, signum, _frame) -> None:
        self.stopping = True
        for proc in self.live():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)

    def __enter__(self) -> _Stop:
        self.previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for s, h in self.previous.items():
            signal.signal(s, h)
        if self.stopping and exc_type is None:
            raise KeyboardInterrupt("stopped: every run resumes from its checkpoint when the study is started again")
        return False


def _run_batches(jobs, k, threads, env, on_done, log, poll_s, deadline: Deadline) -> list[str]:
    """The stacked engine's schedule: batches of ``k`` pending runs, one process at a time."""
    threads = len(os.sched_getaffinity(0)) if threads is None else threads
    pending = [j for j in jobs if not j.done()]
    failed: list[str] = []
    live: list[subprocess.Popen] = []
    progress = Progress(len(pending))
    with _Stop(lambda: live) as stop:
        while pending and not stop.stopping:
            why = deadline.why_not()
            if why:
                log(f"[study] {why}: {len(pending)} left for a later call")
                break
            batch, pending = pending[:k], pending[k:]
            log(f"[study] started a batch of {len(batch)} (stacked): {', '.join(j.name for j in batch)}")
            launched, t0 = time.time(), time.monotonic()
            live[:] = [_start_batch(batch, threads, env or {})]
            while live[0].poll() is None:
                time.sleep(poll_s)
            for job in batch:
                if not job.done():
                    failed.append(job.name)
                    if not stop.stopping:
                        note_crash(job, live[0].returncode, batch[0].run_dir / "batch.log", launched)
                    # a run's own failure is in its log.txt; the process's (a crash outside any run) in batch.log
                    logs = [p for p in (job.run_dir / "log.txt", batch[0].run_dir / "batch.log") if p.is_file()]
                    why = failure_reason(job, live[0].returncode, launched)
                    log(f"[study] {job.name} failed ({why}): see {' and '.join(map(str, logs))}")
                else:
                    log(f"[study] {job.name} done")
                if on_done is not None:
                    on_done(job, live[0].returncode if not job.done() else 0)
            deadline.ended(time.monotonic() - t0)  # publishing its runs included: the next batch waits for it too
            log(f"[study] batch ended: {progress.line(len(batch))}")  # its runs end together: one line, one pace
    return failed


def measure_throughput(
    make_jobs: Callable[[int], list[Job]],
    ks: list[int],
    full_budget: int,
    log: Callable[[str], None] = print,
    engine: str = "process",
    on_row: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """For each K in ``ks``: K training-only runs at once (``make_jobs(K)``, fresh folders), the wall
    time from the first start to the last end and the generated tokens of all of them. A run of the
    study stops at a token budget, so aggregate tokens per second is the unit of throughput; runs per
    hour is that over ``full_budget`` (training only: the held-out evaluation is extra). ``on_row``
    gets the rows so far after each K, so a call stopped at a time limit keeps the Ks it measured."""
    rows = []
    for k in ks:
        jobs = make_jobs(k)
        t0 = time.perf_counter()
        failed = run_jobs(jobs, k, log=log, engine=engine)
        wall = time.perf_counter() - t0
        if failed:
            raise RuntimeError(f"throughput at K={k}: runs failed: {', '.join(failed)}")
        res = [j.result() for j in jobs]
        tokens = sum(r["generated_tokens"] for r in res)
        steps = sum(r["steps"] for r in res)
        step_s = sorted(r["train_s"] / r["steps"] for r in res)
        rows.append(
            {
                "k": k,
                "wall_s": wall,
                "tokens": tokens,
                "steps": steps,
                "tokens_per_s": tokens / wall,
                "runs_per_hour": 3600 * tokens / wall / full_budget,
                "median_step_s": step_s[len(step_s) // 2],
                "device": res[0]["device"],
                "precision": res[0]["precision"],
            }
        )
        log(f"[throughput] K={k}: {tokens / wall:.0f} generated tokens/s, {rows[-1]['runs_per_hour']:.1f} runs/hour")
        if on_row is not None:
            on_row(rows)
    return rows
