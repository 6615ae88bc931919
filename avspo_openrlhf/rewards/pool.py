"""A verification process pool with a hard per-sample timeout that charges a sample its own time.

Each worker process runs the verifiers of :mod:`~avspo_openrlhf.rewards.verify`. The timing rule:

* A sample's clock starts when its worker reports that it has begun the sample: time spent queued,
  or waiting for a worker to start up, is never charged to it (a starting worker gets no sample
  until it reports ``ready``, after its imports and a warm-up verification).
* What is charged is the worker's CPU time on the sample (Linux: ``/proc/<pid>/stat``): an attempt
  overruns after ``timeout_s`` CPU seconds, so time the worker spends waiting for a core on a busy
  machine is not the verification's. A wall-clock ceiling, ``wall_timeout_s`` (default
  ``4 * timeout_s``), still ends an attempt that does not compute (blocked, starved beyond that);
  where CPU time cannot be read, the limit is ``timeout_s`` of wall-clock time.
* A worker that overruns is killed (SIGKILL) and replaced, and its sample is retried once on
  another worker; only a second overrun gives status ``timeout``. A genuinely slow verification
  overruns twice.
* Counters: ``num_timeouts`` (final timeouts), ``num_retries`` (samples retried after an overrun),
  ``num_restarts`` (workers replaced); each :class:`VerifyResult` carries its own ``retries``.

Workers are started as ``python -I -c BOOT`` (:mod:`~avspo_openrlhf.rewards.verifier_worker`),
not through ``multiprocessing``: every spawn or forkserver child runs
``multiprocessing.spawn.prepare``, which re-imports the caller's ``__main__``
(``_fixup_main_from_path``: for a console script such as ``avspo-eval`` that is torch and the
trainer's config) on each start. Under load that start alone took longer than the timeout, and the
restarted worker's next sample paid it again. A worker's start now costs the verifier's imports,
whatever program runs the pool.

Nothing waits on a hung worker, and nothing relies on signals in the caller, so the pool is safe to
use from threads and async Ray actors (where math-verify's own SIGALRM timeout fails). One
dispatcher thread starts and owns the workers; it sleeps in ``select`` until a message, a new task
or a deadline arrives (no polling, so it costs nothing next to a vLLM engine). ``submit`` is
thread-safe; ``score`` submits a batch and waits for all of it.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait

from .verifier_worker import BOOT, worker_tasks  # noqa: F401 - worker_tasks: used by guard.py
from .verify import MAX_ANSWER_CHARS, MAX_COMPLETION_CHARS, VERIFIERS, VerifyResult

# Consecutive failed worker starts (exit, error, or not ready in time) after which a slot is given
# up; with no slot left, every sample gets status ``error`` naming the cause instead of waiting.
MAX_START_FAILURES = 3

try:
    _CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not a Unix
    _CLK_TCK = 0


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux ``/proc``), or None where it cannot be read."""
    if not _CLK_TCK:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14 and 15 of stat)


@dataclasses.dataclass
class _Job:
    fut: Future
    task: tuple  # (completion, gold, verifier)
    retries: int = 0
    claimed: bool = False  # the future was moved to RUNNING (a retry must not do it twice)


class _Worker:
    """One worker process and the parent's end of its socket.

    ``state``: ``starting`` (gets no sample until it says ``ready``), ``idle``, ``sent`` (a sample
    sent, not yet begun), ``running`` (the sample's clock runs). ``deadline`` bounds the current
    state: start-up and the acknowledgement of a sample get ``start_timeout_s``; a running sample is
    checked at ``timeout_s`` after it began and then whenever its CPU time could have reached it."""

    def __init__(self, config: dict, start_timeout_s: float):
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, json.dumps({**config, "fd": theirs.fileno()})],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.state = "starting"
        self.job: _Job | None = None
        self.deadline: float | None = time.monotonic() + start_timeout_s
        self.began = self.cpu_at_start = 0.0  # when the running sample began: wall clock, CPU time

    def kill(self) -> None:
        self.proc.kill()  # Popen.kill sends nothing once the process is reaped: never a reused pid
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it, it is not ours to wait for
            pass
        self.conn.close()


class VerifierPool:
    """Args:
    num_workers: worker processes (default: CPU count).
    timeout_s: limit per verification attempt in CPU seconds of its worker, counted from when the
        worker begins the sample; an overrunning worker is killed and replaced, the sample retried
        once (a second overrun: status ``timeout``).
    wall_timeout_s: wall-clock ceiling per attempt (default ``4 * timeout_s``), for an attempt that
        does not compute; also the only limit (then ``timeout_s``) where CPU time cannot be read.
    max_completion_chars / max_answer_chars: length caps (the completion's tail is kept).
    imports: modules each worker (and this process) imports at start, e.g. to add a verifier to
        :data:`~avspo_openrlhf.rewards.verify.VERIFIERS`.
    start_timeout_s: how long a worker may take to start, or to acknowledge a sample, before it
        is killed and replaced (not charged to any sample).
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 5.0,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        imports: tuple[str, ...] | list[str] = (),
        start_timeout_s: float = 120.0,
        wall_timeout_s: float | None = None,
    ):
        wall_timeout_s = 4.0 * timeout_s if wall_timeout_s is None else wall_timeout_s
        if not timeout_s > 0 or not start_timeout_s > 0 or not wall_timeout_s >= timeout_s:
            raise ValueError(
                f"need timeout_s > 0, start_timeout_s > 0 and wall_timeout_s >= timeout_s; got {timeout_s}, "
                f"{start_timeout_s}, {wall_timeout_s}"
            )
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")
        if not sys.executable:
            raise RuntimeError("VerifierPool starts its workers with sys.executable, which is empty here")
        for name in imports:  # fail here, in the caller, rather than in every worker
            importlib.import_module(name)
        self.num_workers = num_workers or os.cpu_count() or 1
        self.timeout_s, self.start_timeout_s = float(timeout_s), float(start_timeout_s)
        # where CPU time cannot be read, wall-clock time is all there is: timeout_s of it
        self.wall_timeout_s = float(wall_timeout_s) if _cpu_seconds(os.getpid()) is not None else self.timeout_s
        self._caps = (max_completion_chars, max_answer_chars)
        self._config = {
            # the caller's import path, absolute (the worker starts with -I in no particular folder)
            "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path if isinstance(p, str)],
            "parent_pid": os.getpid(),
            "max_completion_chars": max_completion_chars,
            "max_answer_chars": max_answer_chars,
            "imports": list(imports),
        }
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._backlog: collections.deque[_Job] = collections.deque()
        self._workers: list[_Worker | None] = []
        self._start_failures = 0
        self._fatal: str | None = None
        self.num_timeouts = 0
        self.num_retries = 0
        self.num_restarts = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="avspo-verifier", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ── public API ──

    def submit(self, completion: str, gold: str, verifier: str = "project") -> Future:
        """Verify one completion; ``verifier`` is a key of :data:`~avspo_openrlhf.rewards.verify.VERIFIERS`
        (``project``: the reward; ``last_box``: the last box only; ``math_verify``: its full-text opinion)."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        if verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {verifier!r}; choose from {sorted(VERIFIERS)}")
        fut: Future = Future()
        text = completion[-self._caps[0] :] if isinstance(completion, str) else completion
        self._tasks.put(_Job(fut, (text, gold, verifier)))
        self._wake_w.send(b"x")
        return fut

    def score(self, completions: list[str], golds: list[str], verifier: str = "project") -> list[VerifyResult]:
        """Verify many completions in parallel across the workers; results in input order."""
        if len(completions) != len(golds):
            raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
        futures = [self.submit(c, g, verifier) for c, g in zip(completions, golds)]
        return [f.result() for f in futures]

    def counters(self) -> dict[str, int]:
        """Final timeouts, retries after an overrun, and worker restarts since the pool started."""
        return {"timeouts": self.num_timeouts, "retries": self.num_retries, "restarts": self.num_restarts}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tasks.put(None)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=30)
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ── dispatcher thread ──

    def _run(self) -> None:
        try:
            # Workers are started by this thread, which lives as long as the pool: a worker asks to
            # be killed when the thread that started it ends (verifier_worker._die_with_parent).
            self._workers = [self._launch() for _ in range(self.num_workers)]
            self._dispatch()
        except BaseException as e:  # a failure here must not leave callers waiting forever
            self._closed = True
            self._finish(f"verifier pool failed: {type(e).__name__}: {e}")
            raise
        self._finish("verifier pool closed")

    def _finish(self, why: str) -> None:
        """Every sample still pending gets status ``error``; every worker is killed."""
        jobs = list(self._backlog) + [w.job for w in self._workers if w is not None and w.job is not None]
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                jobs.append(item)
        self._backlog.clear()
        for job in jobs:
            if not job.fut.done():
                job.fut.set_result(VerifyResult("error", detail=why, retries=job.retries))
        for w in self._workers:
            if w is not None:
                w.job = None
                w.kill()

    def _dispatch(self) -> None:
        while True:
            while True:  # drain new tasks
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return
                self._backlog.append(item)
            if self._fatal:
                while self._backlog:
                    job = self._backlog.popleft()
                    job.fut.set_result(VerifyResult("error", detail=self._fatal, retries=job.retries))
            self._assign()
            live = [w for w in self._workers if w is not None]
            deadlines = [w.deadline for w in live if w.deadline is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ready = wait([self._wake_r, *(w.conn for w in live)], timeout=timeout)
            if self._wake_r in ready:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            for i, w in enumerate(self._workers):
                if w is not None and w.conn in ready:
                    self._receive(i)
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                # a message that arrived after wait() returned still counts (a starved dispatcher
                # thread must not turn a finished verification into a timeout)
                if w is not None and w.deadline is not None and now >= w.deadline and not w.conn.poll():
                    self._overrun(i)

    def _assign(self) -> None:
        """Hand queued samples to idle workers, one sample per worker."""
        for i, w in enumerate(self._workers):
            while w is not None and w.state == "idle" and self._backlog:
                job = self._backlog.popleft()
                if not job.claimed:
                    if not job.fut.set_running_or_notify_cancel():
                        continue  # cancelled by the caller
                    job.claimed = True
                try:
                    w.conn.send(job.task)
                except OSError:  # it died while idle: the sample waits for the next worker
                    self._backlog.appendleft(job)
                    self._replace(i)
                    break
                w.state, w.job, w.deadline = "sent", job, time.monotonic() + self.start_timeout_s

    def _receive(self, i: int) -> None:
        w = self._workers[i]
        try:
            while w.conn.poll():  # "started" and the result may arrive together
                kind, payload = w.conn.recv()
                if kind == "ready":
                    w.state, w.deadline, self._start_failures = "idle", None, 0
                elif kind == "started":  # payload: the worker's CPU time (time.process_time) now
                    w.state, w.began, w.cpu_at_start = "running", time.monotonic(), payload
                    w.deadline = w.began + self.timeout_s  # the earliest its CPU time can reach the limit
                elif kind == "done":
                    job, w.job, w.state, w.deadline = w.job, None, "idle", None
                    job.fut.set_result(dataclasses.replace(payload, retries=job.retries) if job.retries else payload)
                elif kind == "failed":
                    self._start_failed(i, payload)
                    return
        except (EOFError, OSError):  # the worker died (OOM kill, crash)
            if w.state == "starting":
                self._start_failed(i, f"worker exited with code {w.proc.poll()} while starting")
                return
            job = w.job
            self._replace(i)
            if job is not None:
                job.fut.set_result(
                    VerifyResult(
                        "error", detail=f"verifier worker died (exit {w.proc.returncode})", retries=job.retries
                    )
                )

    def _overrun(self, i: int) -> None:
        w = self._workers[i]
        if w.state == "starting":
            self._start_failed(i, f"worker not ready within {self.start_timeout_s:g} s")
            return
        job, began = w.job, w.state == "running"
        if began:
            now, cpu = time.monotonic(), _cpu_seconds(w.proc.pid)
            spent = None if cpu is None else cpu - w.cpu_at_start
            wall_end = w.began + self.wall_timeout_s
            if spent is not None and spent < self.timeout_s and now < wall_end:
                # waited for a core rather than computed: check again when its CPU time could be up
                w.deadline = min(wall_end, now + max(self.timeout_s - spent, 0.05))
                return
        self._replace(i)
        if job.retries == 0:  # once more, on another worker, before the timeout is final
            job.retries = 1
            self.num_retries += 1
            self._backlog.appendleft(job)
            return
        self.num_timeouts += 1
        why = (
            f"over {self.timeout_s:g} s of CPU time or {self.wall_timeout_s:g} s of wall-clock time, twice"
            if began
            else f"not begun within {self.start_timeout_s:g} s"
        )
        job.fut.set_result(VerifyResult("timeout", detail=why, retries=job.retries))

    def _start_failed(self, i: int, why: str) -> None:
        self._start_failures += 1
        if self._start_failures < MAX_START_FAILURES:
            self._replace(i)
            return
        self._workers[i].kill()
        self._workers[i] = None
        if all(w is None for w in self._workers):
            self._fatal = f"verifier workers fail to start ({self._start_failures} tries); last: {why}"

    def _launch(self) -> _Worker:
        return _Worker(self._config, self.start_timeout_s)

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = self._launch()
        self.num_restarts += 1


_default_pool: VerifierPool | None = None
_default_lock = threading.Lock()


def default_pool() -> VerifierPool:
    """A process-wide pool, configured by ``AVSPO_REWARD_WORKERS`` (default: CPU count, at most
    8) and ``AVSPO_REWARD_TIMEOUT`` (seconds, default 5)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            workers = int(os.environ.get("AVSPO_REWARD_WORKERS", 0)) or min(8, os.cpu_count() or 1)
            _default_pool = VerifierPool(workers, float(os.environ.get("AVSPO_REWARD_TIMEOUT", 5.0)))
        return _default_pool
