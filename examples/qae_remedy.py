"""A remedy of your own, outside the package: a quantile baseline (QAE, quantile advantage estimation).

    A_i = (r_i - q_j) / (std_j + eps)     (or r_i - q_j with scale="none")

with q_j the ``quantile`` of group j's G rewards (0.5: the median) instead of GRPO's mean. With
0/1 rewards and the median, a group with fewer than half right gives its right answers +1/std and
its wrong ones exactly 0 (only success is pushed); more than half right, the reverse. A collapsed
group still gets zero (r_i = q_j), as in GRPO. docs/add_a_remedy.md walks through this file.

One registration makes it a remedy everywhere:

    avspo-train --plugin examples/qae_remedy.py --remedy qae --qae.quantile 0.5 ...
    GRPOConfig(remedy="qae", remedy_options={"quantile": 0.5}, ...)      # TRL, after importing this module
    algorithm.adv_estimator=acr_qae algorithm.qae.quantile=0.5            # verl, with this module imported
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from avspo_openrlhf.algo import GroupContext, register_estimator
from avspo_openrlhf.algo.advantages import group_std
from avspo_openrlhf.algo.collapse import CollapseStats
from avspo_openrlhf.algo.options import Options, flag, std_convention_flag


@dataclass(frozen=True)
class QAEConfig(Options):
    """Quantile baseline (``--qae.*``).

    QAE: the advantage is the reward minus a per-group quantile of the rewards (the median by
    default), divided by the group std unless --qae.scale none.
    """

    quantile: float = flag(
        0.5, "Quantile of the group's rewards used as the baseline (0.5: the median).", valid="[0,1]"
    )
    scale: str = flag("std", "Divide by the group std (std) or not (none).", choices=["std", "none"])
    std_convention: str = std_convention_flag("population", "Std convention: population (G) or unbiased (G - 1).")
    eps: float = flag(1e-6, "Added to the group std.", valid=">=0")


@register_estimator("qae", QAEConfig)
def qae(stats: CollapseStats, cfg: QAEConfig, ctx: GroupContext):
    """``(scale [N], offset [N], info)`` of A = (r - q) * scale: one quantile per row, no loop over groups."""
    q = torch.quantile(ctx.rewards, cfg.quantile, dim=1)  # [N]: linear interpolation between order statistics
    if cfg.scale == "std":
        std, _ = group_std(stats, cfg.std_convention)
        scale = torch.where(stats.collapsed, 0.0, 1.0 / (std + cfg.eps))  # collapsed: exactly 0, even with eps 0
    else:
        scale = (~stats.collapsed).to(q.dtype)
    return scale, -q * scale, {}
