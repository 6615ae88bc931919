"""Group-relative advantages: the estimator registry, GRPO and Dr. GRPO (docs/algorithm.md#advantages).

    A_i = (r_i - mean(R'_j)) / (std(R'_j) + eps)     for the G real samples of group j

with R'_j = R_j (GRPO) or R_j plus virtual rewards (AVSPO: ``avspo.py``; NGRPO: ``ngrpo.py``).
Every group estimator is a per-group affine map ``A = r * scale_j + offset_j``: a registered function
returns ``(scale [N], offset [N], info)`` and :func:`group_advantages` applies it in one pass over
``[N, G]``. That is why a remedy costs only a few ``[N]``-sized ops more than GRPO.

A remedy is one :func:`register_estimator` entry plus its config class (verl's shape): the function
receives its own config and a :class:`GroupContext` (collapse tolerance, reward range, the ACR gate),
nothing of another remedy's; the context carries the rewards too, so a remedy that is not a
function of the moments (a quantile baseline: docs/add_a_remedy.md) fits the same shape. A
token-level estimator (RL-ZVP) also registers ``token_fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .collapse import DEFAULT_REWARD_RANGE, DEFAULT_TOL, CollapseStats, _check_shape, _classify, group_moments
from .options import STD_CONVENTIONS, ACRConfig, GroupNormConfig


@dataclass(frozen=True)
class GroupContext:
    """What every group estimator may read beside its own config and the groups' moments."""

    rewards: torch.Tensor  # [N, G] the rewards themselves: a non-moment remedy (quantiles, ranks) reads them
    tol: float  # collapse tolerance on the population std
    reward_range: tuple[float, float]  # (lo, hi): all-wrong / all-right
    acr_gate: float  # smoothed ACR (ACRTracker.acr_gate) or this batch's ACR
    tau_adapt: float  # the gate is open while acr_gate > tau_adapt
    generator: torch.Generator | None  # random virtual rewards (AVSPO random_uniform)


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator.

    ``fn(stats, config, ctx) -> (scale [N], offset [N], info)``; ``info`` may hold ``gate_open``,
    ``num_virtual_k`` and ``num_virtual`` (``[N]``). Effective collapse is read from the advantages
    (the collapsed groups whose advantages are all zero); only a token-level estimator, whose token
    advantages are not seen there, reports ``num_effective_collapsed`` (the collapsed groups it leaves
    with no signal). ``token_fn(entropy [B, T], mask [B, T], sign [B], config) ->
    [B, T]``: token-level additions on zero-variance responses (``None``: a group estimator).
    """

    name: str
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]
    config: type | None
    token_fn: Callable[..., torch.Tensor] | None = None


ESTIMATORS: dict[str, Estimator] = {}
# called with each Estimator as it is registered (integrations/verl.py registers it with verl's
# registry), so an estimator registered from a user's module reaches every front-end
ON_REGISTER: list[Callable[[Estimator], None]] = []


def register_estimator(name: str, config: type | None = None, token_fn: Callable | None = None):
    """Register ``fn(stats, config, ctx) -> (scale [N], offset [N], info)`` under ``name``, with the
    frozen dataclass of its options (``None``: it has none; an :class:`~.options.Options` subclass
    checks itself when built). ``name`` is the remedy's name in every front-end (``--remedy NAME``
    and its ``--NAME.*`` flags, TRL's ``remedy=``, verl's ``acr_NAME``): a lowercase identifier."""
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower() and name != "none"):
        raise ValueError(f"an estimator's name must be a lowercase identifier other than 'none', got {name!r}")
    if name in ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered")

    def wrap(fn):
        entry = ESTIMATORS[name] = Estimator(name, fn, config, token_fn)
        for listener in ON_REGISTER:
            listener(entry)
        return fn

    return wrap


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; choose from {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def default_config(name: str):
    """The estimator's config with every default (``None`` for an estimator without options)."""
    cls = get_estimator(name).config
    return cls() if cls is not None else None


def group_std(stats: CollapseStats, std_convention: str) -> tuple[torch.Tensor, int]:
    """``([N] std of each group's G rewards, correction)``: population divides by G, unbiased by G - 1."""
    if std_convention not in STD_CONVENTIONS:
        raise ValueError(f"std_convention must be one of {sorted(STD_CONVENTIONS)}, got {std_convention!r}")
    correction = STD_CONVENTIONS[std_convention]
    if correction and stats.group_size < 2:
        raise ValueError(
            "the unbiased std needs at least 2 samples per group (G >= 2); use std_convention='population'"
        )
    return (stats.ssd / (stats.group_size - correction)).sqrt(), correction


def grpo_affine(stats: CollapseStats, std_convention: str, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's ``(scale, offset)``: ``(r - mean) / (std + eps)``; a collapsed group (population std <
    tol) gets exactly zero, as the ACR definition says: reward noise below tol would otherwise be
    blown up by ``1 / (std + eps)``. Every remedy falls back to this on the groups it leaves alone."""
    std, _ = group_std(stats, std_convention)
    scale = ~stats.collapsed / (std + eps)
    if eps <= 0:
        scale = scale.nan_to_num(nan=0.0)  # 0 / 0 in collapsed groups
    return scale, -stats.mean * scale


@register_estimator("grpo", GroupNormConfig)
def _grpo(stats: CollapseStats, cfg: GroupNormConfig, ctx: GroupContext):
    return *grpo_affine(stats, cfg.std_convention, cfg.eps), {}


@register_estimator("dr_grpo")
def _dr_grpo(stats: CollapseStats, cfg: None, ctx: GroupContext):
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


def group_advantages(
    rewards: torch.Tensor,
    estimator: str = "grpo",
    config: Any = None,
    *,
    tol: float = DEFAULT_TOL,
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE,
    acr_gate: float | None = None,
    tau_adapt: float = ACRConfig.tau_init,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Advantages of the G real samples of each prompt group.

    Args:
        rewards: ``[N, G]`` rewards, one row per prompt group (float; NaN/Inf raise ValueError).
        estimator: a name in :data:`ESTIMATORS` (this package's, ``sorted(ESTIMATORS)``, and any
            registered from outside).
        config: that estimator's config (e.g. ``AVSPOConfig(alpha=0.5)``); ``None``: its defaults.
        tol: collapse tolerance on the population std (docs/algorithm.md#acr: 1e-6). Collapsed groups
            get exactly zero advantages unless the estimator gives them some.
        reward_range: ``(lo, hi)`` of the reward; decides all-right vs all-wrong groups.
        acr_gate: the gate input, the smoothed ACR (``ACRTracker.acr_gate``); ``None`` uses this
            batch's raw ACR.
        tau_adapt: the gate is open while ``acr_gate > tau_adapt`` (AVSPO, gated NGRPO).
        generator: seeds AVSPO's ``random_uniform``; a CPU ``torch.Generator`` works for rewards on
            any device (values are drawn on the generator's device, then moved).

    Returns:
        ``(advantages [N, G], info)``. ``info`` holds the :class:`CollapseStats` (``stats``), the
        raw rates (``acr``, ``acr_all_wrong``, ``acr_all_right``, ``acr_other``), ``acr_gate``,
        ``acr_effective`` (groups whose advantages are still all zero) and what the estimator adds
        (AVSPO: ``gate_open``, ``num_virtual_k`` (K), ``num_virtual`` (``[N]`` per group)).
    """
    entry = get_estimator(estimator)
    if config is None:
        config = default_config(estimator)
    elif entry.config is None or not isinstance(config, entry.config):
        want = entry.config.__name__ if entry.config else "None"
        raise TypeError(f"estimator {estimator!r} takes a {want} config, got {type(config).__name__}")
    rewards = _check_shape(rewards, "rewards")
    n = rewards.shape[0]
    stats = _classify(rewards, *group_moments(rewards), tol, reward_range)
    ctx = GroupContext(
        rewards=rewards,
        tol=float(tol),
        reward_range=tuple(reward_range),
        acr_gate=stats.acr if acr_gate is None else acr_gate,
        tau_adapt=tau_adapt,
        generator=generator,
    )
    scale, offset, info = entry.fn(stats, config, ctx)
    adv = torch.addcmul(offset[:, None], rewards, scale[:, None])
    # effective collapse, read from what the estimator returned: a collapsed group whose advantages
    # are all still zero (no estimator has to count it). A token-level estimator's token advantages
    # are not seen here: it reports its own count (RL-ZVP: none, it gives every collapsed group some).
    reported = info.pop("num_effective_collapsed", None)
    if entry.token_fn is not None and reported is not None:
        num_eff = int(reported)
    else:
        num_eff = int((stats.collapsed & (adv == 0).all(dim=1)).sum())
    info.update(stats.metrics())
    info.update(stats=stats, acr_gate=ctx.acr_gate, acr_effective=num_eff / n if n else 0.0)
    return adv, info
