"""OpenRLHF's experience maker with ACR measured on every batch and AVSPO advantages.

Only the baseline block of ``RemoteExperienceMaker.compute_advantages_and_returns`` changes. With
``--avspo.enable`` we apply OpenRLHF's length penalties, compute the ``[N, G]`` raw and shaped
reward matrices, let :class:`~avspo_openrlhf.algo.controller.AVSPOController` produce the
per-sample advantages, then call OpenRLHF's own per-token pieces for GRPO (``compute_reward``: KL
penalty and reward clipping; ``get_cumulative_returns``) on them. Without it, OpenRLHF's method
runs unchanged and we only measure. ``args`` are never modified.
"""

from __future__ import annotations

import itertools

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from avspo_openrlhf.algo import collapse_stats, rl_zvp_token_advantages, zero_variance_sign

from .config import build_controller, settings
from .samples import BatchMeta


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


class AVSPOExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` + ACR on the raw and shaped reward + AVSPO (``--avspo.enable``).

    ``last_metrics`` holds the latest batch's ACR/AVSPO metrics (the trainer logs them with
    OpenRLHF's rollout stats); ``controller`` holds the state that goes into checkpoints.
    """

    def __init__(self, *args, controller=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.controller = controller if controller is not None else build_controller(self.args)
        self.last_metrics: dict[str, float] = {}

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples):
        # OpenRLHF's three steps; the prompt groups' datasources (from the samples' typed
        # rollout_meta) go to the advantage step for per-level ACR
        meta = BatchMeta.of(rollout_samples, self.args.rollout.n_samples_per_prompt)
        experiences = self.make_experience(self.split_rollout_samples(rollout_samples))
        return self.compute_advantages_and_returns(experiences, group_datasources=meta.group_datasources)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences, group_datasources: list[str] | None = None):
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
            if self.controller.estimator == "rl_zvp":
                self.last_metrics.update(self._rl_zvp(experiences, shaped, order, sizes))
            self.last_metrics.update(self._by_level(group_datasources, raw, shaped, None))
            return experiences

        for e in experiences:  # as OpenRLHF: at least fp32 for penalties and group statistics
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)  # also sets info["reward"] to the shaped reward
        shaped = to_groups([e.rewards for e in experiences], order, n)
        adv, self.last_metrics = self.controller.step(raw, shaped)
        self.last_metrics.update(self._by_level(group_datasources, raw, shaped, adv))

        group_std = shaped.std(-1, keepdim=True).expand(-1, n)  # unbiased, as OpenRLHF logs it
        for e, a, s in zip(
            experiences, from_groups(adv.to(shaped.dtype), order, sizes), from_groups(group_std, order, sizes)
        ):
            e.info["group_reward_std"] = s
            self._per_token_returns(e, a.to(e.rewards.dtype))
        return experiences

    def _per_token_returns(self, e, sample_advantage: torch.Tensor) -> None:
        """OpenRLHF's per-token step for its group-baseline estimators, on our per-sample
        advantages: KL penalty and reward clipping (``compute_reward``), undiscounted cumulative
        returns (OpenRLHF forces gamma 1 for these estimators), advantages = returns."""
        reward = compute_reward(sample_advantage, self.kl_ctl.value, e.kl, action_mask=e.action_mask,
                                reward_clip_range=self.strategy.args.reward.clip_range)  # fmt: skip
        e.returns = self.get_cumulative_returns(reward, e.action_mask, 1.0)
        e.advantages = e.returns.clone()
        e.info["return"] = reward.sum(dim=-1)
        e.kl = None

    def _rl_zvp(self, experiences, shaped: torch.Tensor, order: torch.Tensor, sizes: list[int]) -> dict[str, float]:
        """RL-ZVP: OpenRLHF's GRPO advantages (zero on zero-variance groups) plus the entropy-shaped
        token advantages of algo/rl_zvp.py on the zero-variance groups' responses. The entropies come
        from one no-grad forward pass of the policy actors over those responses only (the weights that
        generated them: the paper's pi_theta at the start of the update)."""
        c, args = self.controller, self.strategy.args
        n = shaped.shape[1]
        sign = zero_variance_sign(shaped, c.tol, c.reward_range)
        signs = from_groups(sign[:, None].expand(-1, n).float(), order, sizes)
        rows = [s.nonzero().flatten() for s in signs]
        # OpenRLHF's actor group takes one list entry per experience (at least one per actor): an
        # experience without zero-variance responses sends a single row whose result is unused
        send = [r if len(r) else torch.zeros(1, dtype=torch.long) for r in rows]
        refs = self.actor_model_group.async_run_method_batch(
            "token_entropy",
            sequences=[e.sequences[r] for e, r in zip(experiences, send)],
            action_mask=[e.action_mask[r] for e, r in zip(experiences, send)],
            attention_mask=[e.attention_mask[r] for e, r in zip(experiences, send)],
        )
        entropies = self._flatten_results(refs, args.ds.ring_attn_size * args.ds.tensor_parallel_size)
        alpha = settings(args).rlzvp.alpha
        tokens, total, entropy_sum = 0, 0.0, 0.0
        for e, s, r, h in zip(experiences, signs, rows, entropies):
            if not len(r):
                continue
            mask = e.action_mask[r]
            extra = rl_zvp_token_advantages(h, mask, s[r].to(torch.int8), alpha).to(e.advantages.dtype)
            e.advantages[r] += extra
            e.returns[r] += extra
            tokens += int(mask.sum())
            total += float(extra.abs().sum())
            entropy_sum += float((h * mask).sum())
        return {
            "rlzvp/zero_variance_samples": float(sum(len(r) for r in rows)),
            "rlzvp/token_adv_abs_mean": total / tokens if tokens else 0.0,
            "rlzvp/entropy_mean": entropy_sum / tokens if tokens else 0.0,
        }

    def _by_level(self, names: list[str] | None, raw: torch.Tensor, shaped: torch.Tensor,
                  adv: torch.Tensor | None) -> dict[str, float]:  # fmt: skip
        """Raw and effective ACR per datasource (e.g. per arithmetic level) when the data has one."""
        if not names or len(names) != raw.shape[0] or set(names) == {"default"}:
            return {}  # no datasource field in the data
        c = self.controller
        raw_c = collapse_stats(raw, c.tol, c.reward_range).collapsed
        # effective: the group's advantages are still all zero (GRPO zeroes every collapsed group)
        if adv is not None:
            eff = (adv == 0).all(dim=1)
        elif c.estimator == "rl_zvp":  # token advantages on every zero-variance group
            eff = torch.zeros(raw.shape[0], dtype=torch.bool)
        else:
            eff = collapse_stats(shaped, c.tol, c.reward_range).collapsed
        out = {}
        for name in sorted(set(names)):
            mask = torch.tensor([x == name for x in names])
            out[f"acr_by_level/{name}"] = float(raw_c[mask].float().mean())
            out[f"acr_effective_by_level/{name}"] = float(eff[mask].float().mean())
        return out
