"""A user's reward file under a hard timeout and a memory cap, at run time.

OpenRLHF calls ``reward_func(queries, prompts, labels)`` of the file given to
``--reward.remote_url`` inside the rollout engine, one completion per call from a thread, and turns
any exception into "no reward" (logged at info level). A reward that hangs therefore hangs the run,
and one that fails is only noticed later. :class:`GuardedReward` runs the user's function in worker
processes instead: a call that does not return within ``timeout_s`` kills its worker, one that
exceeds ``memory_mb`` fails inside it, and either way the error names the file and is also written
to ``error_file``, from which the samples generator raises it (``trainer/samples.py``).

``avspo-train`` points OpenRLHF at a small generated file (:func:`write_guard_file`) that builds
one ``GuardedReward`` around the user's file; the files of this package are not wrapped.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import threading

from avspo_openrlhf.atomic import atomic_write

from .pool import worker_tasks


def _worker_main(conn, path: str, memory_mb: int | None) -> None:
    import importlib.util
    import signal
    import traceback

    # Ctrl-C and SIGTERM reach the whole process group: the run checkpoints and stops on them, so a
    # worker must keep scoring until then; its parent ends it (kill, or EOF on the pipe)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    if memory_mb:
        import resource

        cap = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        spec = importlib.util.spec_from_file_location("avspo_user_reward", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = module.reward_func
    except BaseException as e:  # noqa: BLE001 - reported to the caller, named
        conn.send(("error", f"import failed: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    for task in worker_tasks(conn):
        try:
            conn.send(("ok", fn(*task)))
        except MemoryError:
            conn.send(("error", f"exceeded its memory cap of {memory_mb} MB"))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


class RewardFileError(RuntimeError):
    """The user's reward file timed out, ran out of memory, raised, or its worker died."""


class GuardedReward:
    """``reward_func(queries, prompts, labels)`` of ``path``, run in up to ``workers`` processes.

    Args:
        path: the user's reward file.
        timeout_s: wall-clock limit of one call; the worker is killed and replaced after it.
        memory_mb: address-space cap of each worker (``None``: no cap).
        workers: worker processes (calls beyond that wait for a free one; the wait does not count).
        error_file: where the latest failure is written (the samples generator reads it).
    """

    def __init__(
        self,
        path: str,
        timeout_s: float = 60.0,
        memory_mb: int | None = 8192,
        workers: int = 2,
        error_file: str | None = None,
    ):
        if timeout_s <= 0 or workers < 1:
            raise ValueError("timeout_s must be > 0 and workers >= 1")
        self.path, self.timeout_s, self.memory_mb, self.error_file = path, float(timeout_s), memory_mb, error_file
        self._ctx = mp.get_context("spawn")
        self._idle: queue.Queue = queue.Queue()
        for _ in range(workers):
            self._idle.put(None)  # a slot; the worker starts on first use
        self._all: set = set()
        self._workers_lock = threading.Lock()
        atexit.register(self.close)

    def _start(self):
        parent, child = self._ctx.Pipe()
        # not a daemon: a reward file may start processes of its own (ours do: the verifier pool);
        # close() kills the workers at exit
        proc = self._ctx.Process(target=_worker_main, args=(child, self.path, self.memory_mb), daemon=False)
        proc.start()
        child.close()
        worker = (proc, parent)
        with self._workers_lock:
            self._all.add(worker)
        status, detail = self._receive(worker, "loading the file")
        if status != "ready":
            self._kill(worker)
            raise self._fail(detail)
        return worker

    def _receive(self, worker, what: str):
        proc, conn = worker
        if not conn.poll(self.timeout_s):
            self._kill(worker)
            raise self._fail(f"{what} took longer than {self.timeout_s:.0f} s (worker killed)")
        try:
            return conn.recv()
        except (EOFError, OSError):
            self._kill(worker)
            raise self._fail(f"its worker died while {what} (exit {proc.exitcode}; out of memory?)") from None

    def _kill(self, worker) -> None:
        proc, conn = worker
        proc.kill()
        proc.join(timeout=5)
        conn.close()
        with self._workers_lock:
            self._all.discard(worker)

    def _fail(self, detail: str) -> RewardFileError:
        message = f"reward file {self.path}: {detail}"
        if self.error_file:
            try:
                with open(self.error_file, "w", encoding="utf-8") as f:
                    f.write(message + "\n")
            except OSError:
                pass
        return RewardFileError(message)

    def __call__(self, queries, prompts, labels):
        worker = self._idle.get()
        try:
            if worker is None:
                worker = self._start()
            worker[1].send((list(queries), list(prompts), list(labels)))
            status, result = self._receive(worker, f"scoring {len(queries)} completion(s)")
        except RewardFileError:
            self._idle.put(None)  # its worker is gone; the next call starts a fresh one
            raise
        self._idle.put(worker)
        if status != "ok":
            raise self._fail(result)
        return result

    def close(self) -> None:
        with self._workers_lock:
            workers = list(self._all)
        for w in workers:
            self._kill(w)


GUARD_TEMPLATE = '''"""Generated by avspo-train: {user} under a {timeout:g} s timeout and a {memory} MB cap per call
(avspo_openrlhf/rewards/guard.py). OpenRLHF loads this file; it never imports the user's."""
from avspo_openrlhf.rewards.guard import GuardedReward

reward_func = GuardedReward({user!r}, timeout_s={timeout!r}, memory_mb={memory!r}, workers={workers!r},
                            error_file={error!r})
'''


def write_guard_file(user_file: str, folder: str, timeout_s: float, memory_mb: int | None, workers: int) -> str:
    """Write the file OpenRLHF loads in place of ``user_file``; returns its path (in ``folder``,
    which the run's Ray processes can read: the checkpoint folder)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "reward_guard.py")
    text = GUARD_TEMPLATE.format(
        user=os.path.abspath(user_file),
        timeout=float(timeout_s),
        memory=memory_mb,
        workers=int(workers),
        error=guard_error_file(folder),
    )
    atomic_write(path, text)
    if os.path.exists(guard_error_file(folder)):
        os.remove(guard_error_file(folder))  # from an earlier run
    return path


def guard_error_file(folder: str) -> str:
    return os.path.join(folder, "reward_guard.error")
