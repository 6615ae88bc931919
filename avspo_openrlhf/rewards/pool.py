"""A verification process pool with a hard per-sample wall-clock timeout.

Each worker process runs :func:`~avspo_openrlhf.rewards.verify.verify_answer`. A worker that
exceeds ``timeout_s`` on a sample is killed (SIGKILL) and replaced; the sample gets status
``timeout``. Nothing waits on a hung worker, and nothing relies on signals in the caller, so the
pool is safe to use from threads and async Ray actors (where math-verify's own SIGALRM timeout
fails).

One dispatcher thread owns the workers; it sleeps in ``select`` until a result, a new task or a
deadline arrives (no polling, so it costs nothing next to a vLLM engine). ``submit`` is
thread-safe; ``score`` submits a batch and waits for all of it.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing as mp
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import wait

from .verify import MAX_ANSWER_CHARS, MAX_COMPLETION_CHARS, VERIFIERS, VerifyResult

_PRELOAD = ["avspo_openrlhf.rewards.verify", "math_verify"]


def worker_tasks(conn):
    """The tasks a worker process receives, until its parent closes the pipe or sends ``None``."""
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        yield task


def _worker_main(conn, max_completion_chars, max_answer_chars) -> None:
    for completion, gold, verifier in worker_tasks(conn):
        conn.send(VERIFIERS[verifier](completion, gold, max_completion_chars, max_answer_chars))


class _Worker:
    def __init__(self, ctx, caps):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, *caps), daemon=True)
        self.proc.start()
        child.close()
        self.job: tuple[Future, float] | None = None  # (future, deadline)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class VerifierPool:
    """Args:
    num_workers: worker processes (default: CPU count).
    timeout_s: wall-clock limit per sample; an overrunning worker is killed and replaced.
    max_completion_chars / max_answer_chars: length caps (the completion's tail is kept).
    start_method: multiprocessing start method; ``forkserver`` (default) forks workers from a
        clean process with math-verify preloaded, so a replacement starts in milliseconds and
        never inherits the caller's threads.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 5.0,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        start_method: str = "forkserver",
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers = num_workers or os.cpu_count() or 1
        self.timeout_s = float(timeout_s)
        self._caps = (max_completion_chars, max_answer_chars)
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(_PRELOAD)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._workers = [_Worker(self._ctx, self._caps) for _ in range(self.num_workers)]
        self.num_timeouts = 0
        self.num_restarts = 0
        self._closed = False
        self._thread = threading.Thread(target=self._dispatch, name="avspo-verifier", daemon=True)
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
        self._tasks.put((fut, (text, gold, verifier)))
        self._wake_w.send(b"x")
        return fut

    def score(self, completions: list[str], golds: list[str], verifier: str = "project") -> list[VerifyResult]:
        """Verify many completions in parallel across the workers; results in input order."""
        if len(completions) != len(golds):
            raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
        futures = [self.submit(c, g, verifier) for c, g in zip(completions, golds)]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tasks.put(None)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=10)
        for w in self._workers:
            if w.job is None:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            w.kill()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ── dispatcher thread ──

    def _dispatch(self) -> None:
        backlog: collections.deque = collections.deque()
        stopping = False
        while True:
            while True:  # drain new tasks
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    backlog.append(item)
            for i in range(len(self._workers)):  # hand work to idle workers
                if self._workers[i].job is not None or not backlog:
                    continue
                fut, task = backlog.popleft()
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    self._workers[i].conn.send(task)
                except OSError:  # it died while idle: a fresh worker takes the task
                    self._replace(i)
                    self._workers[i].conn.send(task)
                self._workers[i].job = (fut, time.monotonic() + self.timeout_s)
            busy = [w for w in self._workers if w.job is not None]
            if stopping:
                for fut, *_ in backlog:
                    fut.set_result(VerifyResult("error", detail="verifier pool closed"))
                for w in busy:
                    w.job[0].set_result(VerifyResult("error", detail="verifier pool closed"))
                    w.job = None
                return
            timeout = max(0.0, min(w.job[1] for w in busy) - time.monotonic()) if busy else None
            ready = wait([self._wake_r, *(w.conn for w in busy)], timeout=timeout)
            if self._wake_r in ready:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                if w.job is None:
                    continue
                fut, deadline = w.job
                if w.conn in ready:
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError) as e:  # the worker died (OOM kill, crash)
                        result = VerifyResult("error", detail=f"verifier worker died: {type(e).__name__}")
                        self._replace(i)
                    else:
                        w.job = None
                    fut.set_result(result)
                elif now >= deadline:
                    self.num_timeouts += 1
                    fut.set_result(VerifyResult("timeout", detail=f"over {self.timeout_s:g} s"))
                    self._replace(i)

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = _Worker(self._ctx, self._caps)
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
