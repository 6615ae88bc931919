"""The console of ``bash quickstart.sh`` and ``avspo-train --backend cpu``: the project's own lines
(stages, step/ETA lines, ``[avspo]`` warnings, errors) on the terminal; everything else the run
prints (vLLM's engine config, DeepSpeed's model printout, OpenRLHF's progress bars and per-step
dicts, Ray's worker logs, torch's warnings) in the run's log file only.

The redirection is at the file-descriptor level: file descriptors 1 and 2 point at the log file, so
child processes, Ray's log relay and C libraries write there too and nothing is lost; a thread
follows the file and copies the project's lines to the terminal (every line with
``AVSPO_VERBOSE=1`` or ``--verbose``). On a failure the log's last lines reach the terminal.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

VERBOSE_ENV = "AVSPO_VERBOSE"
TAIL_LINES = 30
# what marks a line as the project's: our prefixes, wherever a logger or Ray's "(Actor pid=N)"
# prefix puts them, and the one-line errors of our commands
OWN_MARKS = ("[avspo", "[quickstart", "avspo-train: error", "avspo-eval: error", "avspo-launch: error")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\((?:[\w.:-]+ )?pid=\d+(?:, ip=[\d.:a-f]+)?\) ")
_LOGGER_HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ [\w.]+:\d+\] ")  # vLLM/OpenRLHF's
_MAX_LINE = 2000
_FOLLOWED: set[str] = set()  # logs a follower of this process copies to the terminal


def verbose_setting() -> bool | None:
    """``AVSPO_VERBOSE``: True (1/true/yes/on), False (0/false/no/off) or None (unset: the default)."""
    v = os.environ.get(VERBOSE_ENV, "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    return None


def own_line(line: str) -> str | None:
    """The terminal form of a log line if it is the project's (colours, Ray's ``(Actor pid=N)``
    prefix and a logger's header dropped), else None."""
    clean = _ANSI.sub("", line)
    if not any(m in clean for m in OWN_MARKS):
        return None
    clean = _LOGGER_HEADER.sub("", _RAY_PREFIX.sub("", clean))
    return clean if len(clean) <= _MAX_LINE else clean[:_MAX_LINE] + " ..."


def log_tail(log: Path | str, n: int = TAIL_LINES, start: int = 0) -> list[str]:
    """The last ``n`` lines of ``log`` written after byte ``start`` (progress-bar redraws split)."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [seg for ln in text.splitlines() for seg in ln.split("\r") if seg.strip()]
    return lines[-n:]


class _Follower:
    """Copies the lines appended to ``log`` (from its current end on) to file descriptor ``dest``:
    the project's lines, or every line when ``verbose``."""

    def __init__(self, log: Path, dest: int, verbose: bool, every_s: float = 0.2):
        self.log, self.dest, self.verbose, self.every_s = str(log), dest, verbose, every_s
        self.start = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        self._pos, self._partial = self.start, b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="avspo-console")

    def __enter__(self):
        _FOLLOWED.add(os.path.realpath(self.log))
        self._thread.start()
        return self

    def __exit__(self, typ, exc, tb):
        self._stop.set()
        self._thread.join(timeout=10)
        _FOLLOWED.discard(os.path.realpath(self.log))
        if self._partial:
            self._emit(self._partial)
        if _failed(typ, exc):
            self.write(f"[avspo] failed; the last lines of {self.log}:\n")
            self.write("".join(f"  {ln}\n" for ln in log_tail(self.log, start=self.start)))
        return False

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            try:
                data = data[os.write(self.dest, data) :]
            except InterruptedError:
                continue
            except OSError:  # the terminal went away: the log still has everything
                return

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.every_s)
            self._drain()
            if stopping:
                return

    def _drain(self) -> None:
        try:
            with open(self.log, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self._pos += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._emit(line + b"\n")

    def _emit(self, raw: bytes) -> None:
        if self.verbose:
            self.write(raw.decode("utf-8", "replace"))
            return
        line = own_line(raw.decode("utf-8", "replace").rstrip("\r\n"))
        if line is not None:
            self.write(line + "\n")


def _failed(typ, exc) -> bool:
    if typ is None or issubclass(typ, KeyboardInterrupt):
        return False
    return not (issubclass(typ, SystemExit) and exc.code in (0, None, 130))


@contextmanager
def follow_log(log: Path | str, verbose: bool = False):
    """Copy what gets appended to ``log`` during the block (by a child process whose output goes
    there) to this terminal, the project's lines only unless ``verbose``; on an exception, the
    log's last lines too. Nothing when this process already follows ``log`` (:func:`quiet_console`)."""
    if os.path.realpath(log) in _FOLLOWED:
        yield
        return
    sys.stdout.flush()
    dest = os.dup(_stdout_fd())
    try:
        with _Follower(Path(log), dest, verbose):
            yield
    finally:
        os.close(dest)


@contextmanager
def quiet_console(log: Path | str, verbose: bool = False):
    """For the block, file descriptors 1 and 2 of this process (and of every process it starts)
    write to ``log``; the project's lines (every line when ``verbose``) are copied to the terminal.
    On an exception the log's last lines reach the terminal, then the exception propagates (its
    traceback is appended to the log as well)."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    saved = os.dup(1), os.dup(2)
    line_buffering = getattr(sys.stdout, "line_buffering", None)
    failure = ""
    try:
        with _Follower(log, saved[0], verbose):
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            _line_buffering(True)  # our lines reach the follower as they are printed
            try:
                yield
            except BaseException as e:
                if _failed(type(e), e) and not isinstance(e, SystemExit):
                    failure = "".join(traceback.format_exception(e))  # after the tail: not twice on the terminal
                raise
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                _line_buffering(line_buffering)
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(fd)
    finally:
        for s in saved:
            os.close(s)
        if failure:
            with open(log, "a", encoding="utf-8") as f:
                f.write(failure)


def _line_buffering(on: bool | None) -> None:
    if on is not None and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=on)


def _stdout_fd() -> int:
    try:
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a test's capture object: the process's own stdout
        return 1
