"""Training-health monitors: ACR tracking and early warnings, entropy collapse, KL drift
(docs/algorithm.md#acr, #monitors). Small state objects with exact ``state_dict`` round trips; they only
observe, so monitoring on or off never changes a trajectory.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .collapse import CollapseStats
from .options import ACRConfig, MonitorConfig, config_of
from .threshold import _check_finite

# Paper's fit over 245 Qwen2.5 runs on MATH: final MATH-500 accuracy (%) = 51.4 - 29.6 * ACR_100
# (r = -0.785, R^2 = 0.617). An empirical early-warning fit, not a guarantee for other models/data.
ACR100_FIT_INTERCEPT = 51.4
ACR100_FIT_SLOPE = -29.6


class ConsecutiveAlarm:
    """Fires while a metric has been beyond ``threshold`` for more than ``patience`` consecutive
    steps (``below=True``: under the threshold; else above)."""

    def __init__(self, name: str, threshold: float, patience: int, below: bool):
        self.name, self.threshold, self.patience, self.below = name, float(threshold), int(patience), below
        self.run = 0  # consecutive steps beyond the threshold
        self.fired = 0  # number of steps on which the alarm was on

    def update(self, value: float) -> bool:
        value = _check_finite(self.name, value)
        beyond = value < self.threshold if self.below else value > self.threshold
        self.run = self.run + 1 if beyond else 0
        on = self.run > self.patience
        self.fired += on
        return on

    @property
    def on(self) -> bool:
        return self.run > self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "patience": self.patience, "run": self.run, "fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.threshold, self.patience = float(state["threshold"]), int(state["patience"])
        self.run, self.fired = int(state["run"]), int(state["fired"])


class EntropyCollapseMonitor(ConsecutiveAlarm):
    """Mean per-token entropy below ``threshold`` nats for more than ``patience`` steps."""

    def __init__(
        self, threshold: float = MonitorConfig.entropy_threshold, patience: int = MonitorConfig.entropy_patience
    ):
        super().__init__("entropy", threshold, patience, below=True)

    def update(self, entropy: float) -> dict[str, float]:
        return {"monitor/entropy": float(entropy), "alarm/entropy_collapse": float(super().update(entropy))}


class KLDriftMonitor(ConsecutiveAlarm):
    """KL to the reference (or previous) policy above ``bound`` for more than ``patience`` steps."""

    def __init__(self, bound: float = 0.1, patience: int = MonitorConfig.kl_patience):  # --monitor.kl_bound: off
        super().__init__("kl", bound, patience, below=False)

    def update(self, kl: float) -> dict[str, float]:
        return {"monitor/kl": float(kl), "alarm/kl_drift": float(super().update(kl))}


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _pstd(xs) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


class ACRTracker:
    """Per-step ACR bookkeeping: the smoothed gate input, cumulative rates, ACR_100 and alarms.

    Args:
        config: the :class:`ACRConfig` whose ``smoothing`` (``window``: mean of the last ``window``
            batch ACRs; ``ema``: an EMA with ``ema_decay``), ``early_steps`` (ACR_100),
            ``stall_threshold``/``stall_patience`` ("ACR > 0.35 for more than 50 consecutive steps")
            and ``volatility_window``/``volatility_threshold`` ("std of ACR over 25 steps > 0.15")
            it follows (valid by construction). With few groups per step a batch ACR is nearly 0 or
            1, so the gate needs smoothing; with many groups per step ``window=1`` uses the batch's own ACR.
    """

    def __init__(self, config: ACRConfig | None = None):
        c = config_of(ACRConfig, config, "config")
        self.smoothing, self.ema_decay, self.early_steps = c.smoothing, float(c.ema_decay), int(c.early_steps)
        self.volatility_threshold = float(c.volatility_threshold)
        self.recent: deque[float] = deque(maxlen=c.window)
        self.vol_recent: deque[float] = deque(maxlen=c.volatility_window)
        self.ema: float | None = None
        self.stall = ConsecutiveAlarm("acr", c.stall_threshold, c.stall_patience, below=False)
        self.steps = 0
        self.early_sum = 0.0
        # group-weighted cumulative counts: [groups, collapsed, all_wrong, all_right, effective]
        self.totals = [0, 0, 0, 0, 0]

    @property
    def acr_gate(self) -> float:
        """Smoothed ACR used by the gate (AVSPO, gated NGRPO) and the K rule (0.0 before any step)."""
        if self.smoothing == "ema":
            return self.ema if self.ema is not None else 0.0
        return _mean(self.recent) if self.recent else 0.0

    @property
    def acr_100(self) -> float | None:
        """Mean per-step ACR over the first ``early_steps`` steps; None until they are done."""
        return self.early_sum / self.early_steps if self.steps >= self.early_steps else None

    def observe(self, stats: CollapseStats) -> None:
        """Add a batch's (correctness-view) collapse stats; call before reading :attr:`acr_gate`
        so the gate includes the current batch."""
        acr = stats.acr
        self.recent.append(acr)
        self.vol_recent.append(acr)
        self.ema = acr if self.ema is None else self.ema_decay * self.ema + (1 - self.ema_decay) * acr
        if self.steps < self.early_steps:
            self.early_sum += acr
        self.steps += 1
        self.stall.update(acr)
        for i, c in enumerate((stats.num_measured, stats.num_collapsed, stats.num_all_wrong, stats.num_all_right)):
            self.totals[i] += c

    def record_effective(self, num_effective_collapsed: int) -> None:
        """Add the groups still collapsed after the remedy or filtering (for the cumulative effective ACR)."""
        self.totals[4] += int(num_effective_collapsed)

    def metrics(self) -> dict[str, float]:
        groups = self.totals[0]

        def cum(i: int) -> float:
            return self.totals[i] / groups if groups else 0.0

        volatility = _pstd(self.vol_recent) if len(self.vol_recent) == self.vol_recent.maxlen else 0.0
        out = {
            "acr_gate": self.acr_gate,
            "acr_cum": cum(1),
            "acr_all_wrong_cum": cum(2),
            "acr_all_right_cum": cum(3),
            "acr_effective_cum": cum(4),
            "acr_volatility": volatility,
            "alarm/acr_stall": float(self.stall.on),
            "alarm/acr_volatility": float(volatility > self.volatility_threshold),
        }
        if self.acr_100 is not None:
            out["acr_100"] = self.acr_100
            out["acr_100_fit_math500_acc"] = ACR100_FIT_INTERCEPT + ACR100_FIT_SLOPE * self.acr_100
        else:
            out["acr_100_so_far"] = self.early_sum / self.steps if self.steps else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "smoothing": self.smoothing,
            "ema_decay": self.ema_decay,
            "early_steps": self.early_steps,
            "volatility_threshold": self.volatility_threshold,
            "window": self.recent.maxlen,
            "recent": list(self.recent),
            "volatility_window": self.vol_recent.maxlen,
            "vol_recent": list(self.vol_recent),
            "ema": self.ema,
            "stall": self.stall.state_dict(),
            "steps": self.steps,
            "early_sum": self.early_sum,
            "totals": list(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.smoothing, self.ema_decay = state["smoothing"], float(state["ema_decay"])
        self.early_steps, self.volatility_threshold = int(state["early_steps"]), float(state["volatility_threshold"])
        self.recent = deque(state["recent"], maxlen=state["window"])
        self.vol_recent = deque(state["vol_recent"], maxlen=state["volatility_window"])
        self.ema, self.steps, self.early_sum = state["ema"], int(state["steps"]), float(state["early_sum"])
        self.stall.load_state_dict(state["stall"])
        self.totals = [int(x) for x in state["totals"]]
