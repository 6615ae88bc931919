"""Graceful Ctrl-C for avspo-train, shared by the driver and the trainers (kept free of heavy imports:
``python -m avspo_openrlhf.cli.train`` runs as ``__main__``, so state must live in a module of its own)."""

from __future__ import annotations

import os
import signal
import sys
import threading

STOP_FILE = "STOP"
STOPPED_MARKER = "STOPPED"  # written by the trainer after it checkpointed and stopped on STOP
INTERRUPT = {"requested": False}


def stop_file(args) -> str:
    """Written by the Ctrl-C handler; the trainer checkpoints and stops when it sees it (the trainer is
    a Ray actor in another process, so a file next to the checkpoints is the message)."""
    return os.path.join(args.ckpt.path, STOP_FILE)


def stopped_marker(args) -> str:
    return os.path.join(args.ckpt.path, STOPPED_MARKER)


def take_stopped_marker(args) -> bool:
    """True (and the marker removed) if the trainer stopped on the STOP file in this run."""
    path = stopped_marker(args)
    if os.path.exists(path):
        os.remove(path)
        return True
    return False


def trainer_stopped(args) -> bool:
    """Whether the trainer of this run stopped on the STOP file (and checkpointed), marker kept."""
    return os.path.exists(stopped_marker(args))


def install_interrupt_handler(args) -> None:
    """First Ctrl-C or SIGTERM (docker stop, systemd, plain ``kill``): ask the trainer to save a
    checkpoint after the current step and stop; a second one aborts at once."""
    path = stop_file(args)
    for old in (path, stopped_marker(args)):
        if os.path.exists(old):
            os.remove(old)  # left over from an earlier run

    def handler(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if INTERRUPT["requested"]:
            raise KeyboardInterrupt
        INTERRUPT["requested"] = True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        print(f"\n[avspo] {name}: saving a checkpoint after the current step, then stopping ({name} again to abort)",
              file=sys.stderr, flush=True)  # fmt: skip

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    _HANDLER["handler"] = handler


_HANDLER: dict = {}


def reclaim_sigterm() -> None:
    """``ray.init`` sets its own SIGTERM handler (exit at once); called right after Ray started,
    this puts ours back, so SIGTERM still checkpoints first (a second one aborts, and Ray's exit
    hook then stops the processes it started)."""
    handler = _HANDLER.get("handler")
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def clear_stop_request(args) -> None:
    """The run ended without the trainer seeing STOP (it came after the last step's check): the
    file must not stop the next run at its first step."""
    if os.path.exists(stop_file(args)):
        os.remove(stop_file(args))
