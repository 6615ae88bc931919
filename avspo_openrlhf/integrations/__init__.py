"""ACR and every remedy of :mod:`avspo_openrlhf.algo` inside other trainers: TRL's ``GRPOTrainer``
(``integrations/trl.py``, docs/trl.md) and verl's advantage-estimator registry
(``integrations/verl.py``, docs/verl.md). This module imports neither framework.

Both build their remedy through the algorithm layer's one builder (``algo/build.py``), in their
users' names, and follow one rule: the framework's own GRPO number is kept for every group on which the
remedy's advantage equals the GRPO closed form (with the framework's std convention and eps), and
the remedy's number is used on the others. So a remedy whose gate is closed trains on the framework's
advantages bit for bit, and a remedy changes exactly the groups it is about.
"""

from __future__ import annotations

import torch

from avspo_openrlhf.algo import ESTIMATORS, CollapseController, GroupNormConfig, group_advantages


def base_advantages(rewards: torch.Tensor, controller: CollapseController, std_convention: str | None, eps: float):
    """``[N, G]`` closed form of the framework's own estimator on ``rewards``: GRPO with the framework's
    conventions, or Dr. GRPO (``std_convention=None``: no std division)."""
    if std_convention is None:
        adv, _ = group_advantages(rewards, "dr_grpo", tol=controller.tol, reward_range=controller.reward_range)
    else:
        cfg = GroupNormConfig(std_convention=std_convention, eps=eps)
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


__all__ = ["base_advantages", "framework_metrics", "remedy_groups"]
