"""Advantage Collapse Rate (ACR): which prompt groups give GRPO no learning signal.

docs/algorithm.md#acr: sigma_j = population std of group j's rewards, ACR = mean_j [sigma_j < tol].
Collapsed groups are split by their common reward r_obs relative to the reward range [lo, hi]:
``all_right`` (r_obs == hi), ``all_wrong`` (r_obs == lo) and ``other`` (any other constant, only
possible with non-binary rewards); comparisons use the same ``tol``.

Unscored completions (docs/algorithm.md#unscored; a reward function that returned ``None``): pass
``scored`` (``[N, G]`` bool). A group is then judged on its *scored* completions alone: collapsed when
their population std is below ``tol``, at the common reward of those. A group with no scored
completion is *unscored*: in no rate's numerator or denominator. ``acr_unscored`` is the share of
completions without a score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .options import ACRConfig

DEFAULT_TOL = ACRConfig.tol  # the --acr.* defaults (algo/options.py)
DEFAULT_REWARD_RANGE = ACRConfig.reward_range


def _check_shape(rewards: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [N, G], got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"{name} must have shape [N, G] (one row per prompt group), got {tuple(rewards.shape)}")
    if rewards.shape[1] < 1:
        raise ValueError(f"{name} must have at least one completion per group (G >= 1), got G=0")
    return rewards if rewards.is_floating_point() else rewards.float()


def check_rewards(rewards: torch.Tensor, name: str = "rewards") -> torch.Tensor:
    """Validate a ``[N, G]`` reward matrix: 2-D, G >= 1, every value finite (ints become float).

    Raises ``ValueError`` naming how many values are NaN/Inf and the first offending groups, so a
    broken reward function is reported instead of silently turning into NaN advantages.
    """
    rewards = _check_shape(rewards, name)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        groups = bad.any(dim=1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"{name} contain {int(bad.sum())} non-finite value(s) (NaN/Inf); first bad groups: {groups}")
    return rewards


def group_moments(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean and sum of squared deviations of a ``[N, G]`` reward matrix.

    Shifted-data algorithm (shift = each group's first reward): exact zeros for constant groups at
    any value, and 4 passes over ``[N, G]`` instead of ``torch.std_mean``'s slow small-row path.

    Returns:
        ``(mean [N], ssd [N], probe)``; ``ssd / G`` is the population variance, ``probe`` a scalar
        that is non-finite iff some reward is NaN/Inf (or the sums overflow).
    """
    g = rewards.shape[1]
    shift = rewards[:, :1]
    dev = rewards - shift
    s1 = dev.sum(dim=1)
    ssd = (dev * dev).sum(dim=1).sub_(s1 * s1 / g).clamp_min_(0.0)
    return shift[:, 0] + s1 / g, ssd, s1.sum()


@dataclass
class CollapseStats:
    """Per-group collapse masks (``[N]`` bool tensors), counts, and the derived rates.

    Rates are over the *measured* groups: those with at least one scored completion (every group
    when no ``scored`` mask was given); with none, every rate is 0.0."""

    mean: torch.Tensor  # [N] group mean reward (of the scored completions; NaN for an unscored group)
    ssd: torch.Tensor  # [N] sum of squared deviations (count * population variance)
    collapsed: torch.Tensor  # [N] population std < tol
    all_wrong: torch.Tensor  # [N] collapsed at the range minimum
    all_right: torch.Tensor  # [N] collapsed at the range maximum
    group_size: int
    num_groups: int
    num_collapsed: int
    num_all_wrong: int
    num_all_right: int
    count: torch.Tensor | None = None  # [N] scored completions per group (None: G in every group)
    num_unscored: int = 0  # completions without a score
    num_unscored_groups: int = 0  # groups without any scored completion

    @property
    def group_std(self) -> torch.Tensor:
        """``[N]`` population std (of the scored completions)."""
        n = self.group_size if self.count is None else self.count.clamp_min(1)
        return (self.ssd / n).sqrt()

    @property
    def num_measured(self) -> int:
        """Groups with at least one scored completion: the denominator of every rate."""
        return self.num_groups - self.num_unscored_groups

    def _rate(self, count: int) -> float:
        return count / self.num_measured if self.num_measured else 0.0

    @property
    def acr(self) -> float:
        return self._rate(self.num_collapsed)

    @property
    def acr_all_wrong(self) -> float:
        return self._rate(self.num_all_wrong)

    @property
    def acr_all_right(self) -> float:
        return self._rate(self.num_all_right)

    @property
    def acr_other(self) -> float:
        """Collapsed at a constant strictly inside the reward range (non-binary rewards only)."""
        return self._rate(self.num_collapsed - self.num_all_wrong - self.num_all_right)

    @property
    def acr_unscored(self) -> float:
        """Share of completions without a score (0.0 without a ``scored`` mask)."""
        total = self.num_groups * self.group_size
        return self.num_unscored / total if total else 0.0

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat float metrics, e.g. ``{prefix + "acr": 0.25, ...}``."""
        return {
            f"{prefix}acr": self.acr,
            f"{prefix}acr_all_wrong": self.acr_all_wrong,
            f"{prefix}acr_all_right": self.acr_all_right,
            f"{prefix}acr_other": self.acr_other,
            f"{prefix}acr_unscored": self.acr_unscored,
        }


def _classify(rewards, mean, ssd, probe, tol, reward_range, name="rewards", count=None, scored=None) -> CollapseStats:
    n, g = rewards.shape
    lo, hi = reward_range
    # population std < tol (of the scored completions: count of them; a group without any is not collapsed)
    collapsed = ssd < g * tol * tol if count is None else (ssd < count * (tol * tol)) & (count > 0)
    # matching the range ends also allows a few float ulps: 12 * 1 + 4.1089 in float32 misses the
    # float64 hi by ~1e-6 and must still count as all-right
    atol = max(tol, 8 * torch.finfo(rewards.dtype).eps * max(abs(lo), abs(hi)))
    near_hi = (mean - hi).abs() <= atol
    all_right = collapsed & near_hi
    all_wrong = collapsed & ~near_hi & ((mean - lo).abs() <= atol)
    # one device sync for the finiteness probe and the counts
    parts = [probe.double(), collapsed.sum().double(), all_wrong.sum().double(), all_right.sum().double()]
    if count is not None:
        parts += [(g - count).sum().double(), (count == 0).sum().double()]
    vals = torch.stack(parts).tolist()
    if not math.isfinite(vals[0]):
        if count is None:
            check_rewards(rewards, name)  # raises with the details when a value is NaN/Inf
        else:
            _check_scored(rewards, scored, name)
        raise ValueError(f"{name} are finite but their group sums overflow {rewards.dtype}")
    unscored = (int(vals[4]), int(vals[5])) if count is not None else (0, 0)
    return CollapseStats(
        mean, ssd, collapsed, all_wrong, all_right, g, n, *(int(v) for v in vals[1:4]), count, *unscored
    )


def _scored_moments(rewards: torch.Tensor, scored: torch.Tensor):
    """:func:`group_moments` over the scored completions only (``scored`` ``[N, G]`` bool), shifted by
    each group's first scored reward; ``(mean [N], ssd [N], probe, count [N])``; an unscored group
    has mean NaN, ssd 0 and count 0. Whatever an unscored position holds (NaN) is never read."""
    count = scored.sum(dim=1)
    first = scored.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first scored completion
    has = count > 0
    shift = torch.where(has[:, None], rewards.gather(1, first), torch.zeros_like(rewards[:, :1]))
    dev = torch.where(scored, rewards - shift, torch.zeros_like(rewards))
    s1 = dev.sum(dim=1)
    c = count.clamp_min(1).to(rewards.dtype)
    ssd = (dev * dev).sum(dim=1).sub_(s1 * s1 / c).clamp_min_(0.0)
    mean = torch.where(has, shift[:, 0] + s1 / c, torch.full_like(s1, float("nan")))
    return mean, ssd, s1.sum(), count


def _check_scored(rewards: torch.Tensor, scored: torch.Tensor, name: str) -> None:
    bad = scored & ~torch.isfinite(rewards)
    if bad.any():
        groups = bad.any(dim=1).nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"{name} contain {int(bad.sum())} non-finite scored value(s) (NaN/Inf); first bad groups: "
            f"{groups} (a completion without a score is scored=False)"
        )


def collapse_stats(
    rewards: torch.Tensor,
    tol: float = DEFAULT_TOL,
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE,
    scored: torch.Tensor | None = None,
) -> CollapseStats:
    """ACR of a batch of prompt groups.

    Args:
        rewards: ``[N, G]`` rewards, one row per prompt group (NaN/Inf raise ValueError, except where
            ``scored`` is False). N = 0 gives all rates 0.0.
        tol: a group is collapsed when its population std is below ``tol`` (docs/algorithm.md#acr).
        reward_range: ``(lo, hi)``; a collapsed group at ``hi`` is all-right, at ``lo`` all-wrong.
        scored: ``[N, G]`` bool, False for a completion without a score (docs/algorithm.md#unscored):
            each group is judged on its scored completions; ``None``: every completion is scored.
    """
    rewards = _check_shape(rewards, "rewards")
    if scored is None:
        return _classify(rewards, *group_moments(rewards), tol, reward_range)
    if scored.shape != rewards.shape or scored.dtype != torch.bool:
        raise ValueError(
            f"scored must be a bool mask of the rewards' shape {tuple(rewards.shape)}, "
            f"got {scored.dtype} {tuple(scored.shape)}"
        )
    scored = scored.to(rewards.device)
    mean, ssd, probe, count = _scored_moments(rewards, scored)
    return _classify(rewards, mean, ssd, probe, tol, reward_range, count=count, scored=scored)


def dynamic_sampling_keep_mask(correctness: torch.Tensor, tol: float = DEFAULT_TOL) -> torch.Tensor:
    """DAPO dynamic sampling on correctness std (docs/algorithm.md#dapo): keep groups with sigma_j >= tol.

    OpenRLHF's own filter keeps a group when ``lo < mean(scores) < hi``, which lets constant
    non-binary groups through; this mask keeps exactly the non-collapsed groups.

    Args:
        correctness: ``[N, G]`` correctness (or any reward view).
    Returns:
        ``[N]`` bool, True = keep.
    """
    return ~collapse_stats(correctness, tol).collapsed
