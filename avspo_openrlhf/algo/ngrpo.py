"""NGRPO (arXiv 2509.18851; docs/algorithm.md#ngrpo): m virtual rewards r_max = hi in every group's
mean and std, never in the loss. All-wrong groups get a negative advantage, all-right groups stay 0.
"""

from __future__ import annotations

import torch

from .advantages import GroupContext, augmented_group_stats, grpo_affine, register_estimator
from .collapse import CollapseStats
from .options import STD_CONVENTIONS, NGRPOConfig


@register_estimator("ngrpo", NGRPOConfig)
def _ngrpo(stats: CollapseStats, cfg: NGRPOConfig, ctx: GroupContext):
    m = cfg.num_max
    num_groups = stats.mean.shape[0]
    if cfg.gated and not ctx.acr_gate > ctx.tau_adapt:  # [option] only while the ACR gate is open
        scale, offset = grpo_affine(stats, cfg.std_convention, cfg.eps)
        return (
            scale,
            offset,
            {"gate_open": False, "num_virtual_k": 0, "num_virtual": torch.zeros(num_groups, device=stats.mean.device)},
        )
    grpo_affine(stats, cfg.std_convention, cfg.eps)  # the same convention checks as GRPO (G >= 2 if unbiased)
    g, hi = stats.group_size, float(ctx.reward_range[1])
    # per group an affine map again: R' = R + m copies of hi, i.e. v = mean + (hi - mean) * 1
    ones = torch.full_like(stats.mean, float(m))
    mean_aug, std_aug, std_aug_pop = augmented_group_stats(
        stats.mean, stats.ssd / g, g, int(m), hi - stats.mean, ones, ones, STD_CONVENTIONS[cfg.std_convention]
    )
    still = std_aug_pop < ctx.tol  # all-right groups: R' is constant at hi, the advantages stay 0
    scale = torch.where(still, torch.zeros_like(std_aug), 1.0 / (std_aug + cfg.eps))
    if cfg.eps <= 0:
        scale = scale.nan_to_num(nan=0.0, posinf=0.0)
    info = {
        "gate_open": True,
        "num_virtual_k": int(m),
        "num_virtual": torch.full((num_groups,), int(m), device=stats.mean.device),
        "num_effective_collapsed": int(still.sum()),
    }
    return scale, -mean_aug * scale, info
