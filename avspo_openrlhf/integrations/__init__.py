"""ACR and every remedy of :mod:`avspo_openrlhf.algo` inside other trainers: TRL's ``GRPOTrainer``
(``integrations/trl.py``, docs/trl.md) and verl's advantage-estimator registry
(``integrations/verl.py``, docs/verl.md). This module imports neither framework.

Both adapters follow one rule: the framework's own GRPO number is kept for every group on which the
remedy's advantage equals the GRPO closed form (with the framework's std convention and eps), and
the remedy's number is used on the others. So a remedy whose gate is closed trains on the framework's
advantages bit for bit, and a remedy changes exactly the groups it is about.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from avspo_openrlhf.algo import (
    ESTIMATORS,
    ACRConfig,
    CollapseController,
    GRPOConfig,
    MonitorConfig,
    group_advantages,
)


def remedy_name(remedy: str | None) -> str | None:
    """``None``/``"none"`` (measure only) or a registered estimator's name; anything else: one line."""
    if remedy in (None, "", "none"):
        return None
    if remedy not in ESTIMATORS:
        raise ValueError(f"unknown remedy {remedy!r}; choose from {sorted(ESTIMATORS)} or 'none'")
    return remedy


def _typed(cls, options: dict[str, Any] | None, what: str, fixed: dict[str, Any] | None = None):
    """``cls(**options)`` with a one-line error for an unknown or framework-fixed field; ``fixed``
    fills the fields the framework decides (only those ``cls`` has)."""
    options = dict(options or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"{what} has no option(s) {unknown}; it takes {sorted(names)}")
    fixed = {k: v for k, v in (fixed or {}).items() if k in names}
    clash = sorted(k for k in set(options) & set(fixed) if options[k] != fixed[k])
    if clash:
        raise ValueError(f"{what}: {clash} follow the framework's GRPO ({fixed}) and cannot be set")
    return cls(**{**options, **fixed})


def build_controller(
    remedy: str | None,
    *,
    std_convention: str,
    eps: float,
    options: dict[str, Any] | None = None,
    acr: dict[str, Any] | None = None,
    monitor: dict[str, Any] | None = None,
    seed: int = 0,
) -> CollapseController:
    """The :class:`CollapseController` of one run.

    Args:
        remedy: an estimator name or ``None`` (measure only).
        std_convention, eps: the framework's GRPO conventions (TRL: ``unbiased``, 1e-4; verl:
            ``unbiased``, 1e-6); the remedy's config takes them, so the groups it leaves alone get
            exactly the GRPO closed form and :func:`merge_framework_rows` can keep the framework's numbers.
        options: fields of the remedy's config class (``AVSPOConfig``, ``NGRPOConfig``, ...).
        acr, monitor: fields of :class:`ACRConfig` and :class:`MonitorConfig`.
        seed: the generator of random virtual rewards (AVSPO ``random_uniform``), unless ``options``
            has a ``seed``.
    """
    remedy = remedy_name(remedy)
    config = None
    if remedy is not None and ESTIMATORS[remedy].config is not None:
        fixed = {"std_convention": std_convention, "eps": eps}
        config = _typed(ESTIMATORS[remedy].config, options, f"remedy {remedy!r}", fixed)
        if getattr(config, "seed", None) is not None:
            seed = config.seed
    elif options:
        raise ValueError(f"remedy {remedy!r} takes no options, got {sorted(options)}")
    acr_cfg, monitor_cfg = _typed(ACRConfig, acr, "ACRConfig"), _typed(MonitorConfig, monitor, "MonitorConfig")
    return CollapseController(remedy, config, acr=acr_cfg, monitor=monitor_cfg, seed=int(seed))


def base_advantages(rewards: torch.Tensor, controller: CollapseController, std_convention: str | None, eps: float):
    """``[N, G]`` closed form of the framework's own estimator on ``rewards``: GRPO with the framework's
    conventions, or Dr. GRPO (``std_convention=None``: no std division)."""
    if std_convention is None:
        adv, _ = group_advantages(rewards, "dr_grpo", tol=controller.tol, reward_range=controller.reward_range)
    else:
        cfg = GRPOConfig(std_convention=std_convention, eps=eps)
        adv, _ = group_advantages(rewards, "grpo", cfg, tol=controller.tol, reward_range=controller.reward_range)
    return adv


def remedy_groups(ours: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: the groups whose remedy advantages differ from the framework estimator's closed form."""
    return (ours != base).any(dim=1)


def framework_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The controller's metric names in the frameworks' slash convention: ``acr``, ``acr/all_wrong``,
    ``acr/effective``, ``acr/gate``, ``acr/cum``, ``acr/100_so_far``, ``acr/gate_open``,
    ``acr/tau_adapt``, ``alarm/acr_stall``, ``monitor/entropy``, ... (TRL prefixes ``train/`` in its
    loggers). ``frac_reward_zero_std`` is left out: TRL logs its own, and it equals ``acr/shaped``."""
    out = {}
    for key, value in metrics.items():
        if key == "frac_reward_zero_std":
            continue
        if key == "acr" or key.startswith(("alarm/", "monitor/")) or key.split("/")[0] in ESTIMATORS:
            out[key] = float(value)
        elif key.startswith("acr_"):
            out["acr/" + key[4:]] = float(value)
        else:
            out["acr/" + key] = float(value)
    return out


__all__ = [
    "base_advantages",
    "build_controller",
    "framework_metrics",
    "remedy_groups",
    "remedy_name",
]
