"""RL-ZVP (arXiv 2509.21880, Eq. 5): token-level advantages on zero-variance prompt groups
(docs/algorithm.md#rl-zvp).

Mixed groups keep GRPO's advantage. In a collapsed group every response gets, per token t,

    all-right (positive prompt):   A_t = +alpha * H_t
    all-wrong (negative prompt):   A_t = -alpha * (max_k H_k - H_t)      (max over the response's own tokens)

with H_t the full-vocabulary entropy of the policy at token t (detached). Registered as the
``rl_zvp`` estimator: its group part is GRPO (mixed groups; collapsed groups 0), its ``token_fn`` the
entropy-shaped additions. Pure torch: the trainer supplies the entropies; this module only shapes them.
"""

from __future__ import annotations

import torch

from .advantages import GroupContext, grpo_affine, register_estimator
from .collapse import DEFAULT_REWARD_RANGE, DEFAULT_TOL, CollapseStats, collapse_stats
from .options import RLZVPConfig


def zero_variance_sign(
    rewards: torch.Tensor, tol: float = DEFAULT_TOL, reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
) -> torch.Tensor:
    """``[N]`` int8: +1 for an all-right group (every reward at ``hi``), -1 for any other collapsed
    group (all-wrong, or constant below ``hi``: the paper's R <= 0 with rewards in {-1, 1}), 0 for a
    mixed group. ``rewards`` is ``[N, G]``."""
    stats = collapse_stats(rewards, tol, reward_range)
    sign = torch.zeros(stats.num_groups, dtype=torch.int8, device=rewards.device)  # not the default device
    sign[stats.collapsed] = -1
    sign[stats.all_right] = 1
    return sign


def rl_zvp_token_advantages(
    entropy: torch.Tensor, mask: torch.Tensor, sign: torch.Tensor, alpha: float = RLZVPConfig.alpha
) -> torch.Tensor:
    """Per-token RL-ZVP advantages of ``B`` responses.

    Args:
        entropy: ``[B, T]`` token entropies (nats) of the responses' tokens under the policy.
        mask: ``[B, T]`` response-token mask (padding excluded from the max and zeroed).
        sign: ``[B]`` from :func:`zero_variance_sign` of each response's group (0: mixed, zeros out).
        alpha: scale (the paper's 0.1).

    Returns ``[B, T]`` advantages, zero on padding and on responses with ``sign == 0``.
    """
    if entropy.shape != mask.shape or entropy.dim() != 2 or sign.shape != entropy.shape[:1]:
        raise ValueError(
            f"entropy {tuple(entropy.shape)}, mask {tuple(mask.shape)} and sign {tuple(sign.shape)} do not match"
        )
    m = mask.to(entropy.device).bool()  # experiences may sit on another device than the entropies
    if not torch.isfinite(entropy[m]).all():
        raise ValueError("rl_zvp_token_advantages: non-finite token entropy")
    h = entropy.float().masked_fill(~m, 0.0)
    h_max = h.masked_fill(~m, float("-inf")).amax(dim=1, keepdim=True).clamp_min(0.0)
    s = sign.to(device=h.device, dtype=h.dtype)[:, None]
    pos = (s > 0).to(h.dtype)
    neg = (s < 0).to(h.dtype)
    return alpha * (pos * h - neg * (h_max - h)) * m.to(h.dtype)


def _token_fn(entropy: torch.Tensor, mask: torch.Tensor, sign: torch.Tensor, cfg: RLZVPConfig) -> torch.Tensor:
    return rl_zvp_token_advantages(entropy, mask, sign, cfg.alpha)


@register_estimator("rl_zvp", RLZVPConfig, token_fn=_token_fn)
def _rl_zvp(stats: CollapseStats, cfg: RLZVPConfig, ctx: GroupContext):
    # every collapsed group gets entropy-shaped token advantages: none stays without signal
    return *grpo_affine(stats, cfg.std_convention, cfg.eps), {"num_effective_collapsed": 0}
