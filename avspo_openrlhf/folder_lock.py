"""One writer per folder: a training run's checkpoint and report folders, an evaluation's output.

Two ``avspo-train`` on one run folder both trained, logged every step twice into one
``metrics.jsonl`` and rotated each other's checkpoints; two ``avspo-eval`` on one folder wrote each
problem twice. :func:`lock_folder` takes an exclusive ``flock`` on ``<folder>/.avspo.lock`` for the
life of the process and writes the holder (host, PID, start time) into it, so the second
writer fails at once with one line naming the first. The kernel drops the lock when its holder dies
(a crash, ``kill -9``, the OOM killer), so a lock left by a dead process is simply taken over.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

LOCK_NAME = ".avspo.lock"
_HELD: dict[str, int] = {}  # realpath -> fd, kept open for the life of the process


class FolderBusy(RuntimeError):
    """Another live process writes to this folder."""


def lock_folder(folder: str, what: str) -> str:
    """Hold ``folder`` (created if missing) for this process; raise :class:`FolderBusy` naming the
    holder when another live process holds it. Idempotent within a process."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.path.realpath(folder), LOCK_NAME)
    if path in _HELD:
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise FolderBusy(
            f"{folder} is in use by {holder}; one {what} per folder (wait for it, stop it, or use another folder)"
        ) from None
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")  # no command line: it may hold a secret
    os.pwrite(fd, f"{what} (host {socket.gethostname()}, PID {os.getpid()}, started {started})\n".encode(), 0)
    _HELD[path] = fd
    return path


def release_folder(folder: str) -> None:
    """Give a folder back before the process ends (tests; a long-lived process between runs)."""
    fd = _HELD.pop(os.path.join(os.path.realpath(folder), LOCK_NAME), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor drops the flock
