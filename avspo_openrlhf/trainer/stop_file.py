"""The stop protocol between the avspo-train driver and the trainers: a STOP file next to the
checkpoints asks the trainer (a Ray actor in another process) to checkpoint and stop; it answers
with a STOPPED marker. The driver's signal handlers that write STOP are in cli/interrupt.py."""

from __future__ import annotations

import os

STOP_FILE = "STOP"
STOPPED_MARKER = "STOPPED"  # written by the trainer after it checkpointed and stopped on STOP


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


def clear_stop_request(args) -> None:
    """The run ended without the trainer seeing STOP (it came after the last step's check): the
    file must not stop the next run at its first step."""
    if os.path.exists(stop_file(args)):
        os.remove(stop_file(args))
