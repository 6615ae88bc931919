"""OpenRLHF's experience maker with ACR measured on every batch and the chosen remedy's advantages.

Only the baseline block of ``RemoteExperienceMaker.compute_advantages_and_returns`` changes. With an
advantage remedy on (``--avspo.enable``, ``--ngrpo.enable``, ``--rl_zvp.enable``, ``--sign.enable``)
we apply OpenRLHF's length penalties, compute the ``[N, G]`` raw and shaped reward matrices, let
:class:`~avspo_openrlhf.algo.CollapseController` produce the per-sample advantages, then call
OpenRLHF's own per-token pieces for GRPO (``compute_reward``: KL penalty and reward clipping;
``get_cumulative_returns``) on them; a token-level remedy (RL-ZVP) adds its token advantages. Without
one, OpenRLHF's method runs unchanged and we only measure. ``args`` are never modified.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from avspo_openrlhf.algo import collapse_stats, zero_variance_sign

from .config import build_controller
from .old_log_probs import TOKEN_SIGN, skips_old_log_prob_pass
from .samples import BatchMeta

# docs/algorithm.md#unscored: the verifier statuses (the reward files' extra_logs, in each sample's
# info) that mean "not scored": the verification overran its timeout or raised. ACR on correctness
# judges each group on its scored completions; OpenRLHF (and the remedy) train on their reward 0 as ever
UNSCORED_INFO = ("verify/timeout", "verify/error")

TOKEN_ENTROPY = "token_entropy"
"""Attribute of an experience holding its ``[B, A]`` token entropies between ``make_experience`` and
``compute_advantages_and_returns`` (token-level remedies only)."""


def group_order(experiences) -> torch.Tensor:
    """Positions of the concatenated experience samples in prompt-group order (OpenRLHF's
    ``split_rollout_samples`` tags each sample with its original index)."""
    return torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)), device="cpu")


def to_groups(values: list[torch.Tensor], order: torch.Tensor, n: int) -> torch.Tensor:
    flat = torch.cat(values).float()
    out = torch.empty_like(flat)
    out[order] = flat
    return out.reshape(-1, n)


def scored_groups(experiences, order: torch.Tensor, n: int) -> torch.Tensor | None:
    """``[N, G]`` bool, False for a sample whose verification ended in a status of
    :data:`UNSCORED_INFO`; ``None`` when every sample was scored (or no reward file logs statuses)."""
    keys = [k for k in UNSCORED_INFO if experiences and all(k in e.info for e in experiences)]
    if not keys:
        return None
    unscored = sum(to_groups([e.info[k].reshape(-1) for e in experiences], order, n) for k in keys) > 0
    return ~unscored if bool(unscored.any()) else None


def from_groups(grouped: torch.Tensor, order: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    return grouped.reshape(-1)[order].split(sizes)


class RemedyExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` + ACR on the raw and shaped reward + the chosen remedy's advantages.

    ``last_metrics`` holds the latest batch's ACR/remedy metrics (the trainer logs them with
    OpenRLHF's rollout stats); ``controller`` holds the state that goes into checkpoints.
    """

    def __init__(self, *args, controller=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.controller = controller if controller is not None else build_controller(self.args)
        self.last_metrics: dict[str, float] = {}
        self._entropy_rows = self._entropy_refs = self._entropies = None  # set inside make_experience
        # no old-log-prob pass to ride on: the token entropies come from the training forward
        self.entropy_in_training = self.controller.needs_entropy and skips_old_log_prob_pass(self.args)

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
        if self.controller.needs_entropy:
            self.last_metrics.update(self._token_advantages(experiences, shaped, order, sizes))
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

    @torch.no_grad()
    def make_experience(self, samples_list):
        """OpenRLHF's ``make_experience``. With a token-level remedy (RL-ZVP) the policy's log-prob
        forward is also asked for the token entropies of the responses that need them (their group's
        shaped rewards have zero variance): one pass, under the weights that generated them (the
        paper's pi_theta at the start of the update). Each experience keeps them as
        :data:`TOKEN_ENTROPY` (``[B, A]``, NaN on rows not computed) until
        :meth:`compute_advantages_and_returns` uses them. Where that pass is skipped
        (``entropy_in_training``, ``old_log_probs.py``) the training forward computes them instead."""
        wants = self.controller.needs_entropy and not self.entropy_in_training
        self._entropy_rows = self._rows_needing_entropy(samples_list) if wants else None
        self._entropy_refs, self._entropies = None, None
        try:
            experiences = super().make_experience(samples_list)
            if self._entropy_rows is not None:
                for e, rows, h in zip(experiences, self._entropy_rows, self._entropies, strict=True):
                    device = e.action_mask.device
                    full = torch.full(e.action_mask.shape, float("nan"), device=device)
                    full[rows.to(device)] = h.to(device)
                    setattr(e, TOKEN_ENTROPY, full)
        finally:
            self._entropy_rows = self._entropy_refs = self._entropies = None
        return experiences

    def _rows_needing_entropy(self, samples_list) -> list[torch.Tensor] | None:
        """``[B]`` bool per micro-batch: the responses whose group is zero-variance under the shaped
        reward :meth:`compute_advantages_and_returns` will see (OpenRLHF's length penalties applied
        to a copy of the rewards); every row when a reward model scores in this pass."""
        n = self.strategy.args.rollout.n_samples_per_prompt
        if n < 2:
            return None  # no groups: compute_advantages_and_returns leaves it to OpenRLHF
        if samples_list[0].rewards is None:
            return [torch.ones(len(s.sequences), dtype=torch.bool, device="cpu") for s in samples_list]
        preview = [
            SimpleNamespace(rewards=s.rewards.to(torch.promote_types(s.rewards.dtype, torch.float32)).clone(),
                            response_length=s.response_length, truncated=s.truncated, info={})
            for s in samples_list
        ]  # fmt: skip
        apply_length_penalties(preview, self.strategy.args)
        order, sizes = group_order(samples_list), [len(s.index) for s in samples_list]
        c = self.controller
        sign = zero_variance_sign(to_groups([p.rewards for p in preview], order, n), c.tol, c.reward_range)
        return [s != 0 for s in from_groups(sign[:, None].expand(-1, n), order, sizes)]

    def _dispatch_forward(self, group, sync_condition, **kwargs):
        # make_experience's forward calls: the policy's carries the entropy request
        if group is not self.actor_model_group or self._entropy_rows is None:
            return super()._dispatch_forward(group, sync_condition, **kwargs)
        self._entropy_refs = super()._dispatch_forward(group, sync_condition, entropy_rows=self._entropy_rows,
                                                       **kwargs)  # fmt: skip
        return self._entropy_refs

    def _flatten_results(self, refs, duplicate_factor):
        out = super()._flatten_results(refs, duplicate_factor)
        if refs is None or refs is not self._entropy_refs:
            return out
        self._entropies = [r.entropy for r in out]  # ForwardWithEntropy, one per micro-batch
        return [r.log_probs for r in out]

    def _token_advantages(self, experiences, shaped: torch.Tensor, order: torch.Tensor,
                          sizes: list[int]) -> dict[str, float]:  # fmt: skip
        """A token-level remedy (RL-ZVP): the controller's token advantages (algo/rl_zvp.py) added on
        the zero-variance groups' responses, from the entropies :meth:`make_experience` kept. Works on
        experiences on any device (the entropies follow them through ``Experience.to_device``)."""
        c = self.controller
        n = shaped.shape[1]
        sign = zero_variance_sign(shaped, c.tol, c.reward_range)
        signs = from_groups(sign[:, None].expand(-1, n), order, sizes)
        if self.entropy_in_training:  # old_log_probs.TokenAdvantagesInTraining adds them
            for e, s in zip(experiences, signs):
                e.info[TOKEN_SIGN] = s.to(device=e.action_mask.device, dtype=torch.float32)
            return {f"{c.estimator}/zero_variance_samples": float((sign != 0).sum()) * n}
        count, tokens, total, entropy_sum = 0, 0, 0.0, 0.0
        for e, s in zip(experiences, signs):
            h_all = getattr(e, TOKEN_ENTROPY, None)
            if hasattr(e, TOKEN_ENTROPY):
                delattr(e, TOKEN_ENTROPY)  # used once; it does not travel on to training
            device = e.action_mask.device
            rows = (s != 0).to(device)
            if not rows.any():
                continue
            mask = e.action_mask[rows]
            h = None if h_all is None else h_all.to(device)[rows].masked_fill(~mask.bool(), 0.0)
            if h is None or not torch.isfinite(h).all():
                raise RuntimeError(
                    f"{c.estimator}: no token entropies for {int(rows.sum())} zero-variance responses; "
                    "make_experience computes them with the policy's log-probs"
                )
            extra = c.token_advantages(h, mask, s.to(device)[rows]).to(device=device, dtype=e.advantages.dtype)
            e.advantages[rows] += extra
            e.returns[rows] += extra
            count += int(rows.sum())
            tokens += int(mask.sum())
            total += float(extra.abs().sum())
            entropy_sum += float((h * mask).sum())
        return {
            f"{c.estimator}/zero_variance_samples": float(count),
            f"{c.estimator}/token_adv_abs_mean": total / tokens if tokens else 0.0,
            f"{c.estimator}/entropy_mean": entropy_sum / tokens if tokens else 0.0,
        }

    def _by_level(self, names: list[str] | None, raw: torch.Tensor, shaped: torch.Tensor,
                  adv: torch.Tensor | None, scored: torch.Tensor | None = None) -> dict[str, float]:  # fmt: skip
        """Raw and effective ACR per datasource (e.g. per arithmetic level) when the data has one."""
        if not names or len(names) != raw.shape[0] or set(names) == {"default"}:
            return {}  # no datasource field in the data
        c = self.controller
        raw_c = collapse_stats(raw, c.tol, c.reward_range, scored).collapsed
        # effective: the group's advantages are still all zero (GRPO zeroes every collapsed group)
        if c.needs_entropy:  # token advantages on every zero-variance group
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
