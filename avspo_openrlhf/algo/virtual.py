"""AVSPO virtual reward samples (docs/algorithm.md#k-rule, #strategies).

Virtual samples are scalar rewards added to a collapsed group's normalization statistics only:
no text, no log-probs, no loss term, no rollouts.

Every strategy is a registered function that describes its K virtual rewards per group as

    v_jk = r_obs_j + scale_j * coef_jk

where ``coef`` is either a pair of ``[K]`` vectors ``(coef_not_right, coef_right)`` shared by every
group of that branch (deterministic strategies) or an ``[N, K]`` matrix (random strategies). The
affine form lets :func:`~avspo_openrlhf.algo.advantages.group_advantages` get the augmented mean
and std from two scalar sums per branch instead of materializing ``[N, G + K]`` tensors.

Rule for a reward range ``[lo, hi]`` (binary 0/1 by default): a collapsed group is *all-right* when
its common reward ``r_obs`` equals ``hi``; every other collapsed group (all-wrong, or a constant
inside the range) is treated like all-wrong, i.e. its virtual rewards lie above ``r_obs``. With
lo=0, hi=1 the formulas below reduce to the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from .options import STRATEGY_CHOICES, ACRConfig, AVSPOConfig

_AV = AVSPOConfig  # keyword defaults: the --avspo.* ones (algo/options.py)


class VirtualSpec(NamedTuple):
    scale: torch.Tensor  # [N]
    coef: tuple[torch.Tensor, torch.Tensor] | torch.Tensor  # ([K], [K]) or [N, K]


class _Strategy(NamedTuple):
    fn: Callable[..., VirtualSpec]
    deterministic: bool  # a group's virtual rewards depend only on (r_obs, branch, K)
    own_k: int | None  # the strategy's own K (``opposite`` always uses one sample)


VIRTUAL_STRATEGIES: dict[str, _Strategy] = {}


def register_virtual_strategy(name: str, deterministic: bool = True, own_k: int | None = None):
    """Register ``fn(r_obs [N], is_right [N] bool, K, *, lo, hi, r_anchor, gamma, generator)``;
    ``AVSPOConfig(strategy=name)`` (and ``--avspo.strategy name``) accept it from then on."""

    if name in VIRTUAL_STRATEGIES:
        raise ValueError(f"virtual strategy {name!r} is already registered")

    def wrap(fn):
        VIRTUAL_STRATEGIES[name] = _Strategy(fn, deterministic, own_k)
        if name not in STRATEGY_CHOICES:
            STRATEGY_CHOICES.append(name)
        return fn

    return wrap


def _arange(k: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(1, k + 1, dtype=like.dtype, device=like.device)


@register_virtual_strategy("stratified")
def _stratified(r_obs, is_right, k, *, lo, hi, r_anchor, **_):
    # all-right: v_k = lo + (r_obs - lo)(1 - k/(K+1)); otherwise v_k = r_obs + r_anchor (hi-lo)(K-k+1)/K
    idx = _arange(k, r_obs)
    scale = torch.where(is_right, lo - r_obs, r_anchor * (hi - lo))
    return VirtualSpec(scale, ((k + 1 - idx) / k, idx / (k + 1)))


@register_virtual_strategy("fixed_partial")
def _fixed_partial(r_obs, is_right, k, *, lo, hi, **_):
    # every v_k = the middle of the reward range (0.5 for 0/1 rewards)
    ones = torch.ones(k, dtype=r_obs.dtype, device=r_obs.device)
    return VirtualSpec((lo + hi) / 2 - r_obs, (ones, ones))


@register_virtual_strategy("exp_decay")
def _exp_decay(r_obs, is_right, k, *, lo, hi, r_anchor, gamma, **_):
    # all-right: v_k = lo + (r_obs - lo) gamma^k; otherwise v_k = r_obs + r_anchor (hi-lo) gamma^(k-1)
    idx = _arange(k, r_obs)
    scale = torch.where(is_right, lo - r_obs, r_anchor * (hi - lo))
    return VirtualSpec(scale, (gamma ** (idx - 1), 1 - gamma**idx))


@register_virtual_strategy("opposite", own_k=1)
def _opposite(r_obs, is_right, k, *, lo, hi, **_):
    # the authors' released code: one sample at the other end of the range (1 - r_obs for 0/1)
    one = torch.ones(k, dtype=r_obs.dtype, device=r_obs.device)
    return VirtualSpec(torch.where(is_right, lo - r_obs, hi - r_obs), (one, one))


@register_virtual_strategy("random_uniform", deterministic=False)
def _random_uniform(r_obs, is_right, k, *, lo, hi, generator=None, **_):
    # v_k ~ U[lo, hi]; pass a seeded torch.Generator for reproducible runs. Drawn on the generator's
    # device and moved: a CPU generator (the controller's, checkpointed) serves CUDA rewards too,
    # and the same seed gives the same values on every device.
    dev = generator.device if generator is not None else r_obs.device
    u = torch.rand(r_obs.shape[0], k, generator=generator, dtype=r_obs.dtype, device=dev).to(r_obs.device)
    scale = torch.full_like(r_obs, hi - lo)
    return VirtualSpec(scale, u - ((r_obs - lo) / (hi - lo))[:, None])


def get_strategy(name: str) -> _Strategy:
    try:
        return VIRTUAL_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown virtual strategy {name!r}; choose from {sorted(VIRTUAL_STRATEGIES)}") from None


def num_virtual(group_size: int, acr_gate: float, alpha: float = _AV.alpha, strategy: str = _AV.strategy) -> int:
    """K = max(1, min(G, ceil(G * acr_gate ** alpha))) (docs/algorithm.md#k-rule); ``opposite`` uses K = 1.

    A 1e-9 slack keeps float noise from bumping an exact integer (8 * 0.25**0.5 = 4) up by one.
    """
    fixed = get_strategy(strategy).own_k
    if fixed is not None:
        return fixed
    if not 0.0 <= acr_gate <= 1.0:
        raise ValueError(f"acr_gate must be in [0, 1], got {acr_gate}")
    return max(1, min(group_size, math.ceil(group_size * acr_gate**alpha - 1e-9)))


def coef_matrix(spec: VirtualSpec, is_right: torch.Tensor) -> torch.Tensor:
    """The ``[N, K]`` coefficient matrix of a spec (the branch's vector for deterministic ones)."""
    if isinstance(spec.coef, tuple):
        not_right, right = spec.coef
        return torch.where(is_right[:, None], right, not_right)
    return spec.coef


def coef_moments(spec: VirtualSpec, is_right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group ``sum_k coef_jk`` and ``sum_k coef_jk ** 2``, each ``[N]``."""
    if isinstance(spec.coef, tuple):
        (c0, c1) = spec.coef
        s1 = torch.where(is_right, c1.sum(), c0.sum())
        s2 = torch.where(is_right, (c1 * c1).sum(), (c0 * c0).sum())
        return s1, s2
    return spec.coef.sum(dim=1), (spec.coef * spec.coef).sum(dim=1)


def virtual_rewards(
    r_obs: torch.Tensor,
    is_right: torch.Tensor,
    num_virtual: int,
    strategy: str = _AV.strategy,
    *,
    reward_range: tuple[float, float] = ACRConfig.reward_range,
    r_anchor: float = _AV.r_anchor,
    gamma: float = _AV.gamma,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Explicit virtual rewards ``[N, K]`` for groups with common reward ``r_obs`` (``[N]``).

    ``is_right`` (``[N]`` bool) marks all-right groups (``r_obs == hi``). E.g. stratified, K=4:
    all-right 1 -> 0.8, 0.6, 0.4, 0.2; all-wrong 0 -> 0.1, 0.075, 0.05, 0.025.
    """
    strat = get_strategy(strategy)
    k = strat.own_k or num_virtual
    if k < 1:
        raise ValueError(f"num_virtual must be >= 1, got {k}")
    lo, hi = reward_range
    spec = strat.fn(r_obs, is_right, k, lo=lo, hi=hi, r_anchor=r_anchor, gamma=gamma, generator=generator)
    return r_obs[:, None] + spec.scale[:, None] * coef_matrix(spec, is_right)
