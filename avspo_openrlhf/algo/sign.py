"""The sign advantage (arXiv 2605.07689): A = 2r - 1, with r scaled to [0, 1] by the reward range,
on collapsed groups (``scope="collapsed"``, GRPO on the rest) or on every group (``scope="all"``).

On a collapsed group every virtual-sample remedy (AVSPO, NGRPO) gives all G samples one advantage
whose sign is that of 2r - 1 (all-right > 0, all-wrong < 0); this estimator keeps the sign and sets
the magnitude to 1, which makes it the baseline those remedies reduce to. Per group an affine map:
``A = r * 2 / (hi - lo) - (hi + lo) / (hi - lo)``.
"""

from __future__ import annotations

import torch

from .advantages import GroupContext, grpo_affine, register_estimator
from .collapse import CollapseStats
from .options import SignConfig


@register_estimator("sign", SignConfig)
def _sign(stats: CollapseStats, cfg: SignConfig, ctx: GroupContext):
    lo, hi = ctx.reward_range
    a, b = 2.0 / (hi - lo), -(hi + lo) / (hi - lo)
    if cfg.scope == "all":
        return torch.full_like(stats.mean, a), torch.full_like(stats.mean, b), {"num_effective_collapsed": 0}
    scale, offset = grpo_affine(stats, cfg.std_convention, cfg.eps)
    scale = torch.where(stats.collapsed, a, scale)
    offset = torch.where(stats.collapsed, b, offset)
    # a collapsed group at the middle of the range (non-binary rewards) keeps a zero advantage
    mid = stats.collapsed & ((stats.mean * a + b).abs() < ctx.tol)
    return scale, offset, {"num_effective_collapsed": int(mid.sum())}
