"""OpenRLHF's experience maker with ACR measured on every batch and AVSPO advantages.

Only the baseline block of ``RemoteExperienceMaker.compute_advantages_and_returns`` changes:
we apply OpenRLHF's length penalties, compute the ``[N, G]`` raw and shaped reward matrices,
let :class:`~avspo_openrlhf.algo.controller.AVSPOController` produce the advantages, and hand
them to OpenRLHF's own method for the rest (reward clipping, per-token KL, returns), with its
baseline and penalties switched off for that call.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from avspo_openrlhf.algo import collapse_stats

from .config import build_controller, ensure

# Not an OpenRLHF estimator name: its baseline block and final whitening skip it, while the
# per-token branch still follows the maker's own estimator (group_norm -> cumulative returns).
PRECOMPUTED = "avspo_precomputed"


def group_order(experiences) -> torch.Tensor:
    """Positions of the concatenated experience samples in prompt-group order (OpenRLHF's
    ``split_rollout_samples`` tags each sample with its original index)."""
    return torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)))


def to_groups(values: list[torch.Tensor], order: torch.Tensor, n: int) -> torch.Tensor:
    flat = torch.cat(values).float()
    out = torch.empty_like(flat)
    out[order] = flat
    return out.reshape(-1, n)


def from_groups(grouped: torch.Tensor, order: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    return grouped.reshape(-1)[order].split(sizes)


@contextmanager
def _openrlhf_tail(args):
    """Run OpenRLHF's method on final per-sample advantages: no penalties, no baseline."""
    saved = (args.reward.overlong_buffer_len, args.reward.stop_properly_penalty_coef, args.algo.advantage.estimator)
    args.reward.overlong_buffer_len = None
    args.reward.stop_properly_penalty_coef = None
    args.algo.advantage.estimator = PRECOMPUTED
    try:
        yield
    finally:
        (args.reward.overlong_buffer_len, args.reward.stop_properly_penalty_coef, args.algo.advantage.estimator) = saved


class AVSPOExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` + ACR on the raw and shaped reward + AVSPO (``--avspo.enable``).

    ``last_metrics`` holds the latest batch's ACR/AVSPO metrics for the trainer to log;
    ``controller`` holds the state that goes into checkpoints.
    """

    def __init__(self, *args, controller=None, **kwargs):
        super().__init__(*args, **kwargs)
        ensure(self.args)
        self.controller = controller if controller is not None else build_controller(self.args)
        self.last_metrics: dict[str, float] = {}
        self.group_datasources: list[str] | None = None  # one name per prompt group (set by the trainer)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        args = self.strategy.args
        n = args.rollout.n_samples_per_prompt
        if n < 2:  # no groups, nothing to measure
            self.last_metrics = {}
            return super().compute_advantages_and_returns(experiences)

        order, sizes = group_order(experiences), [len(e.index) for e in experiences]
        raw = to_groups([e.rewards for e in experiences], order, n)
        if not self.controller.enable:
            experiences = super().compute_advantages_and_returns(experiences)
            shaped = to_groups([e.rewards for e in experiences], order, n)  # penalised in place
            _, self.last_metrics = self.controller.step(raw, shaped)
            self.last_metrics.update(self._by_level(raw, shaped, None))
            return experiences

        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)  # also sets info["reward"] to the shaped reward
        shaped = to_groups([e.rewards for e in experiences], order, n)
        adv, self.last_metrics = self.controller.step(raw, shaped)
        self.last_metrics.update(self._by_level(raw, shaped, adv))

        shaped_info = [e.info["reward"] for e in experiences]
        for e, a in zip(experiences, from_groups(adv.to(shaped.dtype), order, sizes)):
            e.rewards = a.to(e.rewards.dtype)
        with _openrlhf_tail(args):
            experiences = super().compute_advantages_and_returns(experiences)
        group_std = shaped.std(-1, keepdim=True).expand(-1, n)  # unbiased, as OpenRLHF logs it
        for e, r, s in zip(experiences, shaped_info, from_groups(group_std, order, sizes)):
            e.info["reward"] = r
            e.info["group_reward_std"] = s
        return experiences

    def _by_level(self, raw: torch.Tensor, shaped: torch.Tensor, adv: torch.Tensor | None) -> dict[str, float]:
        """Raw and effective ACR per datasource (e.g. per arithmetic level) when the data has one."""
        names = self.group_datasources
        if not names or len(names) != raw.shape[0] or set(names) == {"default"}:
            return {}  # no datasource field in the data
        c = self.controller
        raw_c = collapse_stats(raw, c.tol, c.reward_range).collapsed
        # effective: the group's advantages are still all zero (GRPO zeroes every collapsed group)
        eff = (adv == 0).all(dim=1) if adv is not None else collapse_stats(shaped, c.tol, c.reward_range).collapsed
        out = {}
        for name in sorted(set(names)):
            mask = torch.tensor([x == name for x in names])
            out[f"acr_by_level/{name}"] = float(raw_c[mask].float().mean())
            out[f"acr_effective_by_level/{name}"] = float(eff[mask].float().mean())
        return out
