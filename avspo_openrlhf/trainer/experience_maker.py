"""OpenRLHF's experience maker with ACR measured on every batch and the chosen remedy's advantages.

Only the baseline block of ``RemoteExperienceMaker.compute_advantages_and_returns`` changes. With an
advantage remedy chosen (``--remedy NAME``, any registered estimator) we apply OpenRLHF's length
penalties, compute the ``[N, G]`` raw and shaped reward matrices, let
:class:`~avspo_openrlhf.algo.CollapseController` produce the per-sample advantages, then call
OpenRLHF's own per-token pieces for GRPO (``compute_reward``: KL penalty and reward clipping;
``get_cumulative_returns``) on them; a token-level remedy (RL-ZVP) adds its token advantages
(``token_level.py``). Without one, OpenRLHF's method runs unchanged and we only measure. ``args``
are never modified.
"""

from __future__ import annotations

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from avspo_openrlhf.algo import collapse_stats

from .groups import from_groups, group_order, to_groups
from .old_log_probs import skips_old_log_prob_pass
from .run_settings import controller_from_flags
from .samples import BatchMeta
from .token_level import TokenLevelExperienceMixin

# docs/algorithm.md#unscored: the verifier statuses (the reward files' extra_logs, in each sample's
# info) that mean "not scored": the verification overran its timeout or raised. ACR on correctness
# judges each group on its scored completions; OpenRLHF (and the remedy) train on their reward 0 as ever
UNSCORED_INFO = ("verify/timeout", "verify/error")


def scored_groups(experiences, order: torch.Tensor, n: int) -> torch.Tensor | None:
    """``[N, G]`` bool, False for a sample whose verification ended in a status of
    :data:`UNSCORED_INFO`; ``None`` when every sample was scored (or no reward file logs statuses)."""
    keys = [k for k in UNSCORED_INFO if experiences and all(k in e.info for e in experiences)]
    if not keys:
        return None
    unscored = sum(to_groups([e.info[k].reshape(-1) for e in experiences], order, n) for k in keys) > 0
    return ~unscored if bool(unscored.any()) else None


class RemedyExperienceMaker(TokenLevelExperienceMixin, RemoteExperienceMaker):
    """``RemoteExperienceMaker`` + ACR on the raw and shaped reward + the chosen remedy's advantages
    (a token-level one's through :class:`~avspo_openrlhf.trainer.token_level.TokenLevelExperienceMixin`).

    ``last_metrics`` holds the latest batch's ACR/remedy metrics (the trainer logs them with
    OpenRLHF's rollout stats); ``controller`` holds the state that goes into checkpoints.
    """

    def __init__(self, *args, controller=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.controller = controller if controller is not None else controller_from_flags(self.args)
        self.last_metrics: dict[str, float] = {}
        # no old-log-prob pass to ride on: a token-level remedy's entropies come from the training forward
        self._token_setup(skips_old_pass=skips_old_log_prob_pass(self.args))

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
        scored = scored_groups(experiences, order, n)
        if not self.controller.enable:
            experiences = super().compute_advantages_and_returns(experiences)
            shaped = to_groups([e.rewards for e in experiences], order, n)  # penalised in place
            _, self.last_metrics = self.controller.step(raw, shaped, scored)
            self.last_metrics.update(self._by_level(group_datasources, raw, shaped, None, scored))
            return experiences

        for e in experiences:  # as OpenRLHF: at least fp32 for penalties and group statistics
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)  # also sets info["reward"] to the shaped reward
        shaped = to_groups([e.rewards for e in experiences], order, n)
        adv, self.last_metrics = self.controller.step(raw, shaped, scored)  # every shaped reward is a number
        self.last_metrics.update(self._by_level(group_datasources, raw, shaped, adv, scored))

        group_std = shaped.std(-1, keepdim=True).expand(-1, n)  # unbiased, as OpenRLHF logs it
        for e, a, s in zip(
            experiences, from_groups(adv.to(shaped.dtype), order, sizes), from_groups(group_std, order, sizes)
        ):
            e.info["group_reward_std"] = s
            self._per_token_returns(e, a.to(e.rewards.dtype))
        if self.token_fn is not None:
            self.last_metrics.update(self.add_token_advantages(experiences, shaped, order, sizes))
        return experiences

    def _per_token_returns(self, e, sample_advantage: torch.Tensor) -> None:
        """OpenRLHF's per-token step for its group-baseline estimators, on our per-sample
        advantages: KL penalty and reward clipping (``compute_reward``), undiscounted cumulative
        returns (OpenRLHF forces gamma 1 for these estimators), advantages = returns."""
        reward = compute_reward(
            sample_advantage,
            self.kl_ctl.value,
            e.kl,
            action_mask=e.action_mask,
            reward_clip_range=self.strategy.args.reward.clip_range,
        )
        e.returns = self.get_cumulative_returns(reward, e.action_mask, 1.0)
        e.advantages = e.returns.clone()
        e.info["return"] = reward.sum(dim=-1)
        e.kl = None

    def _by_level(
        self,
        names: list[str] | None,
        raw: torch.Tensor,
        shaped: torch.Tensor,
        adv: torch.Tensor | None,
        scored: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Raw and effective ACR per datasource (e.g. per arithmetic level) when the data has one."""
        if not names or len(names) != raw.shape[0] or set(names) == {"default"}:
            return {}  # no datasource field in the data
        c = self.controller
        raw_c = collapse_stats(raw, c.tol, c.reward_range, scored).collapsed
        # effective: the group's advantages are still all zero (GRPO zeroes every collapsed group)
        if self.token_fn is not None:  # token advantages on every zero-variance group
            eff = torch.zeros(raw.shape[0], dtype=torch.bool)
        elif adv is not None:
            eff = (adv == 0).all(dim=1)
        else:
            eff = collapse_stats(shaped, c.tol, c.reward_range).collapsed  # what OpenRLHF trains on
        out = {}
        for name in sorted(set(names)):
            mask = torch.tensor([x == name for x in names])
            out[f"acr_by_level/{name}"] = float(raw_c[mask].float().mean())
            out[f"acr_effective_by_level/{name}"] = float(eff[mask].float().mean())
        return out
