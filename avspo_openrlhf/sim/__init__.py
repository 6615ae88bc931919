"""Pipeline simulator: a discrete-event model of sync/async rollout and training (pure Python)."""

from .calibrate import calibrate, load_rows, measured_timeline
from .pipeline import Dist, PipelineConfig, SimResult, Workload, ideal_speedup, lock_bound_speedup, simulate, summarize

__all__ = [
    "Dist",
    "PipelineConfig",
    "SimResult",
    "Workload",
    "calibrate",
    "ideal_speedup",
    "load_rows",
    "lock_bound_speedup",
    "measured_timeline",
    "simulate",
    "summarize",
]
