"""AVSPO (docs/algorithm.md#advantages): while the ACR gate is open (``acr_gate > tau_adapt``), each
collapsed group's mean and std take K virtual rewards (``virtual.py``: the strategies and the K rule),
so its real samples get a non-zero advantage; every other group, and every group while the gate is
closed, gets GRPO's advantage bit for bit.
"""

from __future__ import annotations

import functools

import torch

from .advantages import GroupContext, augmented_group_stats, grpo_affine, register_estimator
from .collapse import CollapseStats
from .options import STD_CONVENTIONS, AVSPOConfig
from .virtual import coef_moments, get_strategy, num_virtual


@functools.lru_cache(maxsize=256)
def _canonical_advantages(strategy, g, k, lo, hi, r_anchor, gamma, correction, eps, tol, dtype):
    """AVSPO advantage of every real sample of a collapsed group at ``lo`` (all-wrong) and at
    ``hi`` (all-right), and whether each group is still collapsed after augmentation.

    For the deterministic strategies these depend only on (G, K, strategy, branch), so they are
    computed once per configuration (on the CPU: two scalars).
    """
    canon = torch.tensor([lo, hi], dtype=dtype, device="cpu")
    right = torch.tensor([False, True], device="cpu")
    spec = get_strategy(strategy).fn(canon, right, k, lo=lo, hi=hi, r_anchor=r_anchor, gamma=gamma, generator=None)
    m, s, s_pop = augmented_group_stats(
        canon, torch.zeros_like(canon), g, k, spec.scale, *coef_moments(spec, right), correction
    )
    return tuple(((canon - m) / (s + eps)).tolist()), tuple((s_pop < tol).tolist())


@register_estimator("avspo", AVSPOConfig)
def _avspo(stats: CollapseStats, cfg: AVSPOConfig, ctx: GroupContext):
    g = stats.group_size
    strat = get_strategy(cfg.strategy)
    scale, offset = grpo_affine(stats, cfg.std_convention, cfg.eps)  # gate closed: bit-for-bit GRPO
    correction = STD_CONVENTIONS[cfg.std_convention]
    fix = cfg.fix_groups
    fix_wrong, fix_right = fix in ("both", "all_wrong"), fix in ("both", "all_right")
    # the collapsed groups that get virtual samples; "all-wrong" includes any other constant group
    if fix == "both":
        augmented, n_aug = stats.collapsed, stats.num_collapsed
    elif fix == "all_wrong":
        augmented, n_aug = stats.collapsed & ~stats.all_right, stats.num_collapsed - stats.num_all_right
    else:
        augmented, n_aug = stats.all_right, stats.num_all_right
    # the gate's decision reads acr_gate and tau alone (what acr/gate and acr/tau_adapt log); it acts on
    # the groups it may augment, so a batch with none of them is GRPO with the gate open
    gate_open = ctx.acr_gate > ctx.tau_adapt
    acting = gate_open and n_aug > 0
    k = (cfg.num_virtual or num_virtual(g, ctx.acr_gate, cfg.alpha, cfg.strategy)) if gate_open else 0
    info = {"gate_open": gate_open, "num_virtual_k": k, "num_virtual": augmented * k}
    if not acting:
        info["num_effective_collapsed"] = stats.num_collapsed
        return scale, offset, info

    lo, hi = ctx.reward_range
    if strat.deterministic and stats.num_collapsed == stats.num_all_right + stats.num_all_wrong:
        # Fast path: every collapsed group sits at lo or hi, and GRPO gave it scale = offset = 0,
        # so its advantage (the same for all its samples) goes into the offset: two [N] ops.
        (a_w, a_r), (still_w, still_r) = _canonical_advantages(
            cfg.strategy,
            g,
            k,
            float(lo),
            float(hi),
            float(cfg.r_anchor),
            float(cfg.gamma),
            correction,
            float(cfg.eps),
            float(ctx.tol),
            stats.mean.dtype,
        )
        if fix_right:
            offset.add_(stats.all_right, alpha=a_r)
        if fix_wrong:
            offset.add_(stats.all_wrong, alpha=a_w)
        num_eff = stats.num_all_wrong * (still_w if fix_wrong else 1) + stats.num_all_right * (
            still_r if fix_right else 1
        )
    else:
        spec = strat.fn(
            stats.mean,
            stats.all_right,
            k,
            lo=lo,
            hi=hi,
            r_anchor=cfg.r_anchor,
            gamma=cfg.gamma,
            generator=ctx.generator,
        )
        m_aug, s_aug, s_aug_pop = augmented_group_stats(
            stats.mean, stats.ssd / g, g, k, spec.scale, *coef_moments(spec, stats.all_right), correction
        )
        scale = torch.where(augmented, 1.0 / (s_aug + cfg.eps), scale)
        offset = torch.where(augmented, -m_aug * scale, offset)
        num_eff = int((stats.collapsed & (~augmented | (s_aug_pop < ctx.tol))).sum())
    info["num_effective_collapsed"] = num_eff
    return scale, offset, info
