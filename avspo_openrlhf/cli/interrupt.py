"""Graceful Ctrl-C for avspo-train, shared by the driver and the trainers (kept free of heavy imports:
``python -m avspo_openrlhf.cli.train`` runs as ``__main__``, so state must live in a module of its own)."""

from __future__ import annotations

import os
import signal
import sys

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


def install_interrupt_handler(args) -> None:
    """First Ctrl-C: ask the trainer to save a checkpoint after the current step and stop; a second
    Ctrl-C aborts at once."""
    path = stop_file(args)
    for old in (path, stopped_marker(args)):
        if os.path.exists(old):
            os.remove(old)  # left over from an earlier run

    def handler(signum, frame):
        if INTERRUPT["requested"]:
            raise KeyboardInterrupt
        INTERRUPT["requested"] = True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        print("\n[avspo] Ctrl-C: saving a checkpoint after the current step, then stopping (Ctrl-C again to abort)",
              file=sys.stderr, flush=True)  # fmt: skip

    signal.signal(signal.SIGINT, handler)
