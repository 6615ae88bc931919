"""Python's cyclic garbage collector paused while a process imports its stack.

Importing torch, transformers, DeepSpeed, OpenRLHF and vLLM creates about 600,000 objects that live as
long as the process, and the collector's full collections walk all of them again each time the heap
has grown by a quarter: importing the CPU backend's modules (``cpu/backend.py``) took 15.0 and 15.3 s
with the collector on, 10.8 and 11.9 s with it off (2-core AMD EPYC without native bf16; nine full
collections, which reclaimed 667 objects in all). So each process that imports the stack pauses the
collector for its start-up and resumes it before its real work: ``avspo-train``'s driver before the
first step, ``avspo-eval`` before it generates, the CPU backend's Ray workers when their model or
engine is ready (:func:`resume_after_imports` for the others). Nothing is computed differently: the
collector only frees memory, a little later.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

_PAUSED = threading.Event()  # set while the collector is off by pause(), not by the process's own choice


def pause() -> None:
    """The collector off until :func:`resume` (a process that turned it off itself keeps it off);
    explicit ``gc.collect()`` calls still run."""
    if gc.isenabled():
        gc.disable()
        _PAUSED.set()


def resume() -> None:
    """The collector on again if :func:`pause` turned it off (idempotent); it then reclaims what the
    start-up left."""
    if _PAUSED.is_set():
        _PAUSED.clear()
        gc.enable()


def freeze_imports() -> None:
    """What this process imported so far moved out of the collector's sight for good (``gc.freeze``):
    it lives as long as the process anyway, and the full collections that come later (vLLM's while it
    loads a model and before it freezes its own heap, OpenRLHF's after every checkpoint save, about
    0.55 s each in a policy process) then walk only what came after. vLLM's shutdown unfreezes it."""
    gc.freeze()


def resume_after_imports(quiet_s: float = 2.0, poll_s: float = 0.5) -> threading.Thread:
    """:func:`resume` from a daemon thread once no module has been imported for ``quiet_s`` seconds: for
    a process whose start-up has no point of its own to resume at (a Ray worker that is not an engine
    or a model)."""

    def watch() -> None:
        seen, quiet = len(sys.modules), 0.0
        while quiet < quiet_s and _PAUSED.is_set():
            time.sleep(poll_s)
            now = len(sys.modules)
            quiet, seen = (quiet + poll_s, now) if now == seen else (0.0, now)
        resume()

    t = threading.Thread(target=watch, name="avspo-resume-gc", daemon=True)
    t.start()
    return t
