"""Graceful Ctrl-C and SIGTERM for avspo-train: the driver's signal handlers and their state (kept
free of heavy imports: ``python -m avspo_openrlhf.cli.train`` runs as ``__main__``, so state must
live in a module of its own). The file protocol the trainers read is ``trainer/stop_file.py``."""

from __future__ import annotations

import os
import signal
import sys
import threading

from avspo_openrlhf.trainer.stop_file import stop_file, stopped_marker

INTERRUPT = {"requested": False}


def _started_at() -> float:
    """When this process was created (``/proc/self/stat``), not when Python got here: a launcher
    that writes STOP after starting us must not see it taken for a leftover."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: fall back to now
        import time

        return time.time()


def install_interrupt_handler(args) -> None:
    """First Ctrl-C, SIGTERM (docker stop, systemd, plain ``kill``) or SIGUSR1 (a SLURM time-limit or
    preemption signal sent to every process of the job): ask the trainer to save a checkpoint after
    the current step and stop; a second one aborts at once."""
    path = stop_file(args)
    started = _started_at()
    for old in (path, stopped_marker(args)):
        # left over from an earlier run; a STOP written since this process started is a request
        # (avspo.sbatch writes it on USR1, which can arrive while Python is still importing)
        if os.path.exists(old) and (old != path or os.path.getmtime(old) < started - 1.0):
            os.remove(old)

    def handler(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if INTERRUPT["requested"]:
            raise KeyboardInterrupt
        INTERRUPT["requested"] = True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        print(
            f"\n[avspo] {name}: saving a checkpoint after the current step, then stopping ({name} again to abort)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGUSR1, handler)  # Python's default for it is to die without a checkpoint
    _HANDLER["handler"] = handler


_HANDLER: dict = {}


def reclaim_sigterm() -> None:
    """``ray.init`` sets its own SIGTERM handler (exit at once); called right after Ray started,
    this puts ours back, so SIGTERM still checkpoints first (a second one aborts, and Ray's exit
    hook then stops the processes it started)."""
    handler = _HANDLER.get("handler")
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
