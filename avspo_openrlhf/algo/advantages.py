"""Group-relative advantages: GRPO, Dr. GRPO, AVSPO and NGRPO (docs/algorithm.md#advantages,
docs/algorithm.md#ngrpo).

    A_i = (r_i - mean(R'_j)) / (std(R'_j) + eps)     for the G real samples of group j

with R'_j = R_j (GRPO) or R_j plus K virtual rewards (AVSPO, collapsed groups while the gate is
open) or R_j plus m virtual maximum rewards (NGRPO, every group). Every estimator is a per-group affine map ``A = r * scale_j + offset_j``: a registered
function returns ``(scale [N], offset [N], info)`` and :func:`group_advantages` applies it in one
pass over ``[N, G]``. That is why AVSPO costs only a few ``[N]``-sized ops more than GRPO.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .collapse import DEFAULT_REWARD_RANGE, DEFAULT_TOL, CollapseStats, _check_shape, _classify, group_moments
from .options import FIX_GROUPS, STD_CONVENTIONS, AVSPOConfig, NGRPOConfig
from .virtual import coef_moments, get_strategy, num_virtual

_AV, _NG = AVSPOConfig, NGRPOConfig  # every keyword default below is one of theirs

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]] = {}


def register_estimator(name: str):
    """Register ``fn(stats, *, std, eps, **options) -> (scale [N], offset [N], info)``."""
    if name in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered")

    def wrap(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


@register_estimator("grpo")
def _grpo(stats: CollapseStats, *, std, eps, **_):
    # (r - mean) / (std + eps); a collapsed group (population std < tol) gets exactly zero, as the
    # ACR definition says: reward noise below tol would otherwise be blown up by 1 / (std + eps).
    scale = ~stats.collapsed / (std + eps)
    if eps <= 0:
        scale = scale.nan_to_num(nan=0.0)  # 0 / 0 in collapsed groups
    return scale, -stats.mean * scale, {}


@register_estimator("dr_grpo")
def _dr_grpo(stats: CollapseStats, **_):
    # Dr. GRPO (Liu et al. 2025): centre only, no std division; collapsed groups give exact zeros
    scale = (~stats.collapsed).to(stats.mean.dtype)
    return scale, -stats.mean * scale, {}


def augmented_group_stats(
    mean: torch.Tensor,
    var: torch.Tensor,
    group_size: int,
    k: int,
    scale: torch.Tensor,
    coef_sum: torch.Tensor,
    coef_sq_sum: torch.Tensor,
    correction: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean and std of R' = G real rewards (``mean``, population ``var``) plus K virtual rewards
    ``v_k = mean + scale * coef_k``; all inputs and outputs ``[M]``.

    Pooled moments around the real mean: D1 = sum_k d_k, D2 = sum_k d_k^2 with d_k = v_k - mean.
    Returns ``(mean', std' in the requested convention, std' population)``.
    """
    n = group_size + k
    shift = scale * coef_sum / n
    var_pop = ((group_size * var + scale * scale * coef_sq_sum) / n - shift * shift).clamp_min(0.0)
    std_pop = var_pop.sqrt()
    std = std_pop if correction == 0 else (var_pop * (n / (n - correction))).sqrt()
    return mean + shift, std, std_pop


@functools.lru_cache(maxsize=256)
def _canonical_advantages(strategy, g, k, lo, hi, r_anchor, gamma, correction, eps, tol, dtype):
    """AVSPO advantage of every real sample of a collapsed group at ``lo`` (all-wrong) and at
    ``hi`` (all-right), and whether each group is still collapsed after augmentation.

    For the deterministic strategies these depend only on (G, K, strategy, branch), so they are
    computed once per configuration.
    """
    canon = torch.tensor([lo, hi], dtype=dtype)
    right = torch.tensor([False, True])
    spec = get_strategy(strategy).fn(canon, right, k, lo=lo, hi=hi, r_anchor=r_anchor, gamma=gamma, generator=None)
    m, s, s_pop = augmented_group_stats(
        canon, torch.zeros_like(canon), g, k, spec.scale, *coef_moments(spec, right), correction
    )
    return tuple(((canon - m) / (s + eps)).tolist()), tuple((s_pop < tol).tolist())


@register_estimator("avspo")
def _avspo(
    stats: CollapseStats,
    *,
    std,
    eps,
    correction,
    tol,
    reward_range,
    acr_gate,
    tau_adapt,
    alpha,
    strategy,
    r_anchor,
    gamma,
    generator,
    fixed_k=None,
    fix_groups=_AV.fix_groups,
):
    g = stats.group_size
    strat = get_strategy(strategy)
    fix_wrong, fix_right = fix_groups in ("both", "all_wrong"), fix_groups in ("both", "all_right")
    # the collapsed groups that get virtual samples; "all-wrong" includes any other constant group
    if fix_groups == "both":
        augmented, n_aug = stats.collapsed, stats.num_collapsed
    elif fix_groups == "all_wrong":
        augmented, n_aug = stats.collapsed & ~stats.all_right, stats.num_collapsed - stats.num_all_right
    else:
        augmented, n_aug = stats.all_right, stats.num_all_right
    gate_open = acr_gate > tau_adapt and n_aug > 0
    k = (fixed_k or num_virtual(g, acr_gate, alpha, strategy)) if gate_open else 0
    scale, offset, _ = _grpo(stats, std=std, eps=eps)  # gate closed: bit-for-bit GRPO
    info = {"gate_open": gate_open, "num_virtual_k": k, "num_virtual": augmented * k}
    if not gate_open:
        info["num_effective_collapsed"] = stats.num_collapsed
        return scale, offset, info

    lo, hi = reward_range
    if strat.deterministic and stats.num_collapsed == stats.num_all_right + stats.num_all_wrong:
        # Fast path: every collapsed group sits at lo or hi, and GRPO gave it scale = offset = 0,
        # so its advantage (the same for all its samples) goes into the offset: two [N] ops.
        (a_w, a_r), (still_w, still_r) = _canonical_advantages(
            strategy,
            g,
            k,
            float(lo),
            float(hi),
            float(r_anchor),
            float(gamma),
            correction,
            float(eps),
            float(tol),
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
            stats.mean, stats.all_right, k, lo=lo, hi=hi, r_anchor=r_anchor, gamma=gamma, generator=generator
        )
        m_aug, s_aug, s_aug_pop = augmented_group_stats(
            stats.mean, stats.ssd / g, g, k, spec.scale, *coef_moments(spec, stats.all_right), correction
        )
        scale = torch.where(augmented, 1.0 / (s_aug + eps), scale)
        offset = torch.where(augmented, -m_aug * scale, offset)
        num_eff = int((stats.collapsed & (~augmented | (s_aug_pop < tol))).sum())
    info["num_effective_collapsed"] = num_eff
    return scale, offset, info


@register_estimator("ngrpo")
def _ngrpo(stats: CollapseStats, *, std, eps, correction, tol, reward_range, acr_gate, tau_adapt,
           num_max=_NG.num_max, gated=_NG.gated, **_):  # fmt: skip
    # NGRPO (arXiv 2509.18851): m virtual rewards r_max = hi in every group's mean and std, never in the
    # loss. Per group an affine map again: R' = R + m copies of hi, i.e. v = mean + (hi - mean) * 1.
    if gated and not acr_gate > tau_adapt:  # [option] only while AVSPO's gate would be open
        scale, offset, _ = _grpo(stats, std=std, eps=eps)
        return scale, offset, {"gate_open": False}
    g, hi = stats.group_size, float(reward_range[1])
    m = torch.full_like(stats.mean, float(num_max))
    mean_aug, std_aug, std_aug_pop = augmented_group_stats(
        stats.mean, stats.ssd / g, g, int(num_max), hi - stats.mean, m, m, correction
    )
    still = std_aug_pop < tol  # all-right groups: R' is constant at hi, the advantages stay 0
    scale = torch.where(still, torch.zeros_like(std_aug), 1.0 / (std_aug + eps))
    if eps <= 0:
        scale = scale.nan_to_num(nan=0.0, posinf=0.0)
    info = {"gate_open": True, "num_effective_collapsed": int(still.sum())}
    return scale, -mean_aug * scale, info


def group_advantages(
    rewards: torch.Tensor,
    estimator: str = "grpo",
    *,
    std: str = _AV.std,
    eps: float = _AV.eps,
    tol: float = DEFAULT_TOL,
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE,
    acr_gate: float | None = None,
    tau_adapt: float = _AV.tau_init,
    alpha: float = _AV.alpha,
    strategy: str = _AV.strategy,
    r_anchor: float = _AV.r_anchor,
    gamma: float = _AV.gamma,
    generator: torch.Generator | None = None,
    fixed_k: int | None = _AV.num_virtual,
    fix_groups: str = _AV.fix_groups,
    num_max: int = _NG.num_max,
    gated: bool = _NG.gated,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Advantages of the G real samples of each prompt group.

    Args:
        rewards: ``[N, G]`` rewards, one row per prompt group (float; NaN/Inf raise ValueError).
        estimator: ``grpo`` | ``dr_grpo`` | ``avspo`` | ``ngrpo`` (see :data:`ADVANTAGE_ESTIMATORS`).
        std: ``population`` (divide by G; the paper's) or ``unbiased`` (G - 1; OpenRLHF's
            ``group_norm``). For AVSPO it applies to the augmented group of G + K rewards.
        eps: added to the std in the denominator.
        tol: collapse tolerance on the population std (docs/algorithm.md#acr: 1e-6). Collapsed groups
            get exactly zero advantages unless AVSPO augments them.
        reward_range: ``(lo, hi)`` of the reward; decides all-right vs all-wrong groups.
        acr_gate: AVSPO gate input, the smoothed ACR (see ``ACRTracker.acr_gate``); ``None``
            uses this batch's raw ACR.
        tau_adapt: AVSPO threshold; collapsed groups are augmented only if ``acr_gate > tau_adapt``.
        alpha: exponent of the K rule ``K = max(1, min(G, ceil(G * acr_gate ** alpha)))``.
        strategy: virtual reward values, see :data:`~avspo_openrlhf.algo.virtual.VIRTUAL_STRATEGIES`.
        r_anchor, gamma: strategy parameters (stratified / exp_decay).
        generator: seeds ``random_uniform``; a CPU ``torch.Generator`` works for rewards on any
            device (values are drawn on the generator's device, then moved).
        fixed_k: AVSPO: this many virtual samples per augmented group instead of the K rule
            (the paper's fixed-K ablation); ``None``: the K rule.
        fix_groups: AVSPO: which collapsed groups get virtual samples: ``both`` (default),
            ``all_wrong`` (and any other constant group below the maximum) or ``all_right``; the
            others keep GRPO's zero advantages (the paper's mechanism-isolation ablation).
        num_max: NGRPO: virtual samples at the reward maximum ``hi`` in every group (the paper's m = 1).
        gated: NGRPO: add them only while ``acr_gate > tau_adapt`` (AVSPO's gate); default: always.

    Returns:
        ``(advantages [N, G], info)``. ``info`` holds the :class:`CollapseStats` (``stats``), the
        raw rates (``acr``, ``acr_all_wrong``, ``acr_all_right``, ``acr_other``), ``acr_gate``,
        ``acr_effective`` (groups whose advantages are still all zero) and, for AVSPO,
        ``gate_open``, ``num_virtual_k`` (K) and ``num_virtual`` (``[N]`` virtual samples per group).
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {sorted(ADVANTAGE_ESTIMATORS)}")
    if fix_groups not in FIX_GROUPS:
        raise ValueError(f"fix_groups must be one of {FIX_GROUPS}, got {fix_groups!r}")
    if int(num_max) != num_max or num_max < 1:
        raise ValueError(f"num_max must be a positive integer, got {num_max!r}")
    if fixed_k is not None and (int(fixed_k) != fixed_k or fixed_k < 1):
        raise ValueError(f"fixed_k must be a positive integer or None, got {fixed_k!r}")
    if std not in STD_CONVENTIONS:
        raise ValueError(f"std must be one of {sorted(STD_CONVENTIONS)}, got {std!r}")
    rewards = _check_shape(rewards, "rewards")
    n, g = rewards.shape
    correction = STD_CONVENTIONS[std]
    if correction and g < 2 and estimator != "dr_grpo":
        raise ValueError("unbiased std needs at least 2 samples per group (G >= 2); use std='population'")
    stats = _classify(rewards, *group_moments(rewards), tol, reward_range)
    group_std = (stats.ssd / (g - correction)).sqrt()
    if acr_gate is None:
        acr_gate = stats.acr
    scale, offset, info = ADVANTAGE_ESTIMATORS[estimator](
        stats,
        std=group_std,
        eps=eps,
        correction=correction,
        tol=tol,
        reward_range=reward_range,
        acr_gate=acr_gate,
        tau_adapt=tau_adapt,
        alpha=alpha,
        strategy=strategy,
        r_anchor=r_anchor,
        gamma=gamma,
        generator=generator,
        **({"fixed_k": fixed_k, "fix_groups": fix_groups} if estimator == "avspo" else {}),
        **({"num_max": num_max, "gated": gated} if estimator == "ngrpo" else {}),
    )
    adv = torch.addcmul(offset[:, None], rewards, scale[:, None])
    num_eff = info.pop("num_effective_collapsed", stats.num_collapsed)
    info.update(stats.metrics())
    info.update(stats=stats, acr_gate=acr_gate, acr_effective=num_eff / n if n else 0.0)
    return adv, info
