"""Files written whole or not at all: the one way this package replaces a file that a reader (a report
beside a running study, a resumed run, a job's next attempt) may open at any moment. A temporary file
in the same folder, then ``os.replace``: a kill mid-write leaves the previous file as it was."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", *, fsync: bool = False):
    """An open file that becomes ``path`` when the block ends without an exception (the temporary file
    is removed otherwise). ``mode`` is ``"w"`` (UTF-8 text) or ``"wb"``; ``fsync`` puts the bytes on
    disk before the rename (a checkpoint's marker that a crash of the machine must not leave empty).
    The temporary name is this process's and thread's own, hidden, in the same folder (one file
    system, so the rename is atomic); it is created as ``open`` creates files, under the umask."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file: mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    text = {"encoding": "utf-8"} if mode == "w" else {}
    try:
        with open(tmp, mode.replace("w", "x"), **text) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes, *, fsync: bool = False) -> None:
    """``data`` (text as UTF-8, or bytes) as the whole of ``path``, atomically."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync) as f:
        f.write(data)


def write_json(path: str | os.PathLike, obj, **dumps) -> None:
    """``json.dumps(obj, **dumps)`` as the whole of ``path``, atomically."""
    atomic_write(path, json.dumps(obj, **dumps))
