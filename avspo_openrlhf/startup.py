"""A run's start-up, phase by phase, from the process's own start: where the seconds before the first
training step go (issue: a first step in under 30 s).

The driver's phases follow one another (:meth:`StartupTimeline.mark`: each ends where the next begins);
what runs in other processes meanwhile (the vLLM engine, the policy's DeepSpeed init, async mode's generator)
is a span of its own from its launch to its readiness (:meth:`StartupTimeline.watch`), so overlap shows.
``avspo-train`` prints it as one line and writes ``<report.dir>/startup.json`` when training begins;
the first step's own start is ``timeline/gen_start`` of step 1 in ``metrics.jsonl`` (same clock, wall time).
"""

from __future__ import annotations

import os
import threading
import time

from avspo_openrlhf.atomic import write_json


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

    def write(self, folder: str | None) -> None:
        """``startup.json`` in ``folder`` (no folder: nothing written); the watchers still running
        get a moment, since they end with the phases the driver already waited for."""
        for thread in self._watchers:
            thread.join(timeout=1.0)
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        write_json(os.path.join(folder, "startup.json"), self.state_dict(), indent=1)


TIMELINE = StartupTimeline()  # this process's: its clock starts at the process's own start
