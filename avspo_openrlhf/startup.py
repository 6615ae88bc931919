"""A run's start-up, phase by phase, from the process's own start: where the seconds before the first
training step go (issue: a first step in under 30 s).

The driver's phases follow one another (:meth:`StartupTimeline.mark`: each ends where the next begins);
what runs in other processes meanwhile (the vLLM engine, the policy's DeepSpeed init, async mode's generator)
is a span of its own from its launch to its readiness (:meth:`StartupTimeline.watch`), so overlap shows.
``avspo-train`` prints it as one line and writes ``<report.dir>/startup.json`` when training begins;
the first step's own start is ``timeline/gen_start`` of step 1 in ``metrics.jsonl`` (same clock, wall time).
A start-up that has not reached its first step after ``AVSPO_STARTUP_STACKS_S`` seconds writes every
thread's stack to stderr (:meth:`StartupTimeline.stacks_if_stuck`), so a hang names where it hangs.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

from avspo_openrlhf.atomic import write_json

STACKS_ENV = "AVSPO_STARTUP_STACKS_S"
STACKS_DEFAULT_S = 600.0  # a CPU start-up takes 20-60 s; a GPU node's model load can take minutes


def process_start_time() -> float:
    """Wall-clock time (``time.time()``'s clock) at which this process started, so that the
    interpreter's own start and the imports before any of our code runs are counted."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # no psutil, or a platform without it: from here on only
        return time.time()


class StartupTimeline:
    """Spans ``{"phase", "where", "start_s", "end_s"}`` in seconds since the process started."""

    def __init__(self, t0: float | None = None):
        self._spans_lock = threading.Lock()
        self.restart(process_start_time() if t0 is None else t0)

    def restart(self, t0: float) -> None:
        self.t0 = self.last = t0  # ``last``: where the next driver phase begins
        self.spans: list[dict] = []
        self._watchers: list[threading.Thread] = []
        self._stacks_armed = False

    def begin_run(self) -> None:
        """A run starts in this process: the first one counts from the process's start (the interpreter
        and the imports are its start-up too), a later one (tests, a notebook) from now."""
        if self.spans:
            self.restart(time.time())

    def mark(self, phase: str, now: float | None = None) -> None:
        """The driver's ``phase`` ended now; it began where its previous phase ended."""
        now = time.time() if now is None else now
        with self._spans_lock:
            self.spans.append(
                {"phase": phase, "where": "driver", "start_s": self.last - self.t0, "end_s": now - self.t0}
            )
            self.last = now

    def span(self, phase: str, start: float, end: float, where: str) -> None:
        """A phase of another process, from ``start`` to ``end`` (wall-clock times)."""
        with self._spans_lock:
            self.spans.append({"phase": phase, "where": where, "start_s": start - self.t0, "end_s": end - self.t0})

    def watch(self, phase: str, ref, where: str, start: float | None = None) -> None:
        """Record ``phase`` as ending when the Ray object ``ref`` is ready (a call queued behind an
        actor's constructor, or the constructor's own work), without waiting for it here; it began
        now, or at ``start`` (wall clock: the actor's launch, before the call was made)."""
        import ray

        start = time.time() if start is None else start

        def wait() -> None:
            try:
                ray.wait([ref], num_returns=1, timeout=None)
            except Exception:  # the run's own ray.get reports the failure; the timeline just lacks the span
                return
            self.span(phase, start, time.time(), where)

        thread = threading.Thread(target=wait, name=f"startup-{phase}", daemon=True)
        thread.start()
        self._watchers.append(thread)

    def state_dict(self) -> dict:
        with self._spans_lock:
            spans = sorted(self.spans, key=lambda s: (s["end_s"], s["start_s"]))
        total = max((s["end_s"] for s in spans if s["where"] == "driver"), default=0.0)
        return {"process_start": self.t0, "total_s": total, "spans": spans}

    def summary(self) -> str:
        """One line: the driver's phases in order, then what ran beside them."""
        state = self.state_dict()
        driver = [s for s in state["spans"] if s["where"] == "driver"]
        beside = [s for s in state["spans"] if s["where"] != "driver"]
        text = f"start-up {state['total_s']:.1f} s: " + ", ".join(
            f"{s['phase']} {s['end_s'] - s['start_s']:.1f}" for s in driver
        )
        if beside:
            text += "; beside them: " + ", ".join(
                f"{s['phase']} {s['end_s'] - s['start_s']:.1f} (ready at {s['end_s']:.1f})" for s in beside
            )
        return text

    def stacks_if_stuck(self) -> float | None:
        """Armed now: unless :meth:`write` (the first step begins) or :meth:`disarm` comes first,
        every thread's Python stack is written to stderr once, ``AVSPO_STARTUP_STACKS_S`` seconds
        from now (default 600; 0 or less: never), and the run goes on. faulthandler writes it from a
        C thread of its own, so a deadlock that holds the GIL cannot stop it. Returns the seconds, or
        None when off."""
        raw = os.environ.get(STACKS_ENV, "").strip()
        try:
            after = float(raw) if raw else STACKS_DEFAULT_S
        except ValueError:
            raise ValueError(f"{STACKS_ENV}={raw!r}: expected seconds (0 turns the stack dump off)") from None
        if after <= 0:
            return None
        out = sys.stderr
        try:
            out.fileno()
        except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor (a test's capture)
            out = sys.__stderr__
        if out is None:
            return None
        out.flush()
        faulthandler.dump_traceback_later(after, repeat=False, file=out, exit=False)
        self._stacks_armed = True
        return after

    def disarm(self) -> None:
        """The stack dump of :meth:`stacks_if_stuck` cancelled (a no-op when it is not armed)."""
        if self._stacks_armed:
            faulthandler.cancel_dump_traceback_later()
            self._stacks_armed = False

    def write(self, folder: str | None) -> None:
        """``startup.json`` in ``folder`` (no folder: nothing written); the watchers still running
        get a moment, since they end with the phases the driver already waited for. The start-up is
        over: the stack dump is disarmed."""
        self.disarm()
        for thread in self._watchers:
            thread.join(timeout=1.0)
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        write_json(os.path.join(folder, "startup.json"), self.state_dict(), indent=1)


TIMELINE = StartupTimeline()  # this process's: its clock starts at the process's own start
