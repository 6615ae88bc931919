"""The adaptive threshold tau_adapt of the ACR gate (docs/algorithm.md#threshold; AVSPO, gated NGRPO).

    tau_adapt(t+1) = clip(tau_adapt(t) + eta * sign(dJ_t) * (ACR_t - tau_adapt(t)), lo, hi)

dJ_t is the change of an EMA of the batch mean reward (the [choice] of the spec; ``ema_decay=0``
gives the raw change), with sign(0) = 0. This implements the equation, not the paper's prose.
"""

from __future__ import annotations

import math
from typing import Any

from .options import ACRConfig, config_of


def _check_finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


class AdaptiveThreshold:
    """Small state object; call :meth:`update` once per training step, after the advantages.

    Args:
        config: the :class:`ACRConfig` whose ``tau_init`` (tau_adapt(0), paper: 0.5), ``eta`` (step
            size, paper: 0.01), ``tau_bounds`` (clip range, paper: 0.1, 0.9) and ``reward_ema_decay``
            (EMA of the mean reward whose change gives dJ; 0 = raw change) it follows.
    """

    def __init__(self, config: ACRConfig | None = None):
        c = config_of(ACRConfig, config, "config")
        lo, hi = c.tau_bounds
        self.eta, self.bounds, self.ema_decay = float(c.eta), (float(lo), float(hi)), float(c.reward_ema_decay)
        self.tau = float(c.tau_init)
        self.reward_ema: float | None = None
        self.steps = 0

    def update(self, acr: float, mean_reward: float) -> dict[str, float]:
        """Advance one step with this batch's ACR and mean reward; returns the logged values."""
        acr = _check_finite("acr", acr)
        mean_reward = _check_finite("mean_reward", mean_reward)
        prev = self.reward_ema
        self.reward_ema = mean_reward if prev is None else self.ema_decay * prev + (1 - self.ema_decay) * mean_reward
        delta_j = 0.0 if prev is None else self.reward_ema - prev
        tau = self.tau + self.eta * _sign(delta_j) * (acr - self.tau)
        self.tau = min(max(tau, self.bounds[0]), self.bounds[1])
        self.steps += 1
        return {"tau_adapt": self.tau, "tau_delta_j": delta_j, "tau_reward_ema": self.reward_ema}

    def state_dict(self) -> dict[str, Any]:
        return {
            "tau": self.tau,
            "reward_ema": self.reward_ema,
            "steps": self.steps,
            "eta": self.eta,
            "bounds": list(self.bounds),
            "ema_decay": self.ema_decay,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tau, self.reward_ema, self.steps = float(state["tau"]), state["reward_ema"], int(state["steps"])
        self.eta, self.bounds, self.ema_decay = float(state["eta"]), tuple(state["bounds"]), float(state["ema_decay"])
