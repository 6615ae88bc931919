"""No separate old-log-prob pass where it would return the training forward's own log-probs.

OpenRLHF's ``make_experience`` runs the policy once more per micro-batch, without gradients, for the
PPO ratio's "old" log-probs. With one epoch and one optimizer step per rollout batch, no
reference/KL and no rollout-vs-train correction, nothing changes the weights between that pass and
the training forward, so the ratio is exactly 1: the CPU backend skips the pass
(:func:`skips_old_log_prob_pass`) and :class:`OldIsCurrent` gives the loss the training forward's
log-probs, detached.

RL-ZVP's token entropies ride on that pass where it runs (``entropy.py``). Where it is skipped they
come from the training forward instead, so RL-ZVP still costs no forward of its own: the experience
maker sends each response's zero-variance sign to training in ``info[TOKEN_SIGN]``, and
:class:`TokenAdvantagesInTraining` has the policy's forward keep those rows' entropies (detached, the
same weights) and adds the controller's token advantages before the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .response_logits import ResponseLogitsActor

TOKEN_SIGN = "_zero_variance_sign"
"""``Experience.info`` key: per response, +1/-1 for an all-right/other zero-variance group, 0 for a
mixed one (:func:`~avspo_openrlhf.algo.zero_variance_sign`), where the token entropies are deferred
to the training forward. Taken out of ``info`` before OpenRLHF logs it."""


def old_log_probs_are_current(args) -> bool:
    """Whether PPO's "old" log-probs are the policy's own at its training forward: one epoch with one
    optimizer step per rollout batch (every micro-batch accumulates into it, so no update happens
    between OpenRLHF's separate no-grad log-prob pass and the training forwards, sync or async), and
    nothing else reading that pass (no reference model/KL, no rollout-vs-train correction)."""
    samples = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    return (
        args.train.max_epochs == 1
        and samples == args.train.batch_size
        and not args.train.dynamic_batch_enable
        and args.algo.kl.init_coef == 0
        and args.algo.advantage.is_correction_level == "off"
        and not args.critic.model_name_or_path
    )


def skips_old_log_prob_pass(args) -> bool:
    """Whether this run skips the pass: the CPU backend, where it is a fifth of a step, whenever
    :func:`old_log_probs_are_current` (packing excluded: the training forward keeps entropies only on
    the unpacked path). The experience maker and the policy actor both ask this, so they agree."""
    return getattr(args, "backend", "gpu") == "cpu" and not args.ds.packing_samples and old_log_probs_are_current(args)


class OldIsCurrent:
    """The policy loss with the training forward's own log-probs, detached, in place of a skipped
    no-grad pass (NaN placeholders): ratio exactly 1, so the clipped objective's value and gradient
    are those of the old log-probs the pass would have returned (equal, up to float rounding).
    ``with_token_advantages`` (set per micro-batch by :class:`TokenAdvantagesInTraining`) returns the
    advantages the loss takes, once the policy's forward has run."""

    def __init__(self, loss):
        self.loss = loss
        self.with_token_advantages: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __call__(self, log_probs, old_log_probs, advantages, *args, **kwargs):
        if old_log_probs is not None and bool(old_log_probs.isnan().any()):  # padding re-collated as 0
            old_log_probs = log_probs.detach()
        if self.with_token_advantages is not None:
            advantages = self.with_token_advantages(advantages)
        return self.loss(log_probs, old_log_probs, advantages, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.loss, name)


class TokenAdvantagesInTraining:
    """Replaces ``ActorPPOTrainer.training_step`` (an instance attribute, what ``ppo_train`` calls):
    for a micro-batch whose ``info`` carries :data:`TOKEN_SIGN`, the policy's training forward keeps
    the zero-variance rows' entropies (``ResponseLogitsActor.entropy_rows``) and the loss
    (:class:`OldIsCurrent`) adds ``token_advantages(entropy, mask, sign)`` on those rows, exactly
    what the experience maker adds from a no-grad pass's entropies when that pass runs."""

    def __init__(self, trainer, token_advantages: Callable[..., torch.Tensor], name: str):
        if not isinstance(trainer.actor, ResponseLogitsActor):
            raise RuntimeError(
                "token entropies from the training forward need the response-only forward "
                f"(trainer/response_logits.py); {type(trainer.actor).__name__} does not have it"
            )
        if not isinstance(trainer.actor_loss_fn, OldIsCurrent):
            trainer.actor_loss_fn = OldIsCurrent(trainer.actor_loss_fn)
        self.trainer, self.step, self.token_advantages = trainer, trainer.training_step, token_advantages
        self.name = name  # the estimator's: its metrics are "<name>/..." as the experience maker's
        self._sums = [0.0, 0.0, 0.0]  # |token advantage|, entropy, tokens of this update's rows

    def metrics(self) -> dict[str, float]:
        """This update's ``<name>/token_adv_abs_mean`` and ``<name>/entropy_mean`` over the
        zero-variance responses' tokens (what the experience maker logs when it computes the
        entropies itself); resets the sums."""
        abs_sum, entropy_sum, tokens = self._sums
        self._sums = [0.0, 0.0, 0.0]
        return {f"{self.name}/token_adv_abs_mean": abs_sum / tokens if tokens else 0.0,
                f"{self.name}/entropy_mean": entropy_sum / tokens if tokens else 0.0}  # fmt: skip

    def __call__(self, experience, *args, **kwargs):
        sign = experience.info.pop(TOKEN_SIGN, None)
        if isinstance(sign, list):  # the replay buffer re-collates per-sample 0-d values as a list
            sign = torch.stack(sign)
        rows = None if sign is None else (sign != 0).to(experience.action_mask.device)
        if rows is None or not bool(rows.any()):
            return self.step(experience, *args, **kwargs)
        actor, loss = self.trainer.actor, self.trainer.actor_loss_fn
        actor.entropy_rows, actor.kept_entropy = rows, None
        mask = experience.action_mask[rows]
        row_sign = sign.to(rows.device)[rows].to(torch.int8)

        def with_tokens(advantages: torch.Tensor) -> torch.Tensor:
            if actor.kept_entropy is None:
                raise RuntimeError("the training forward kept no token entropies (not the response-only path)")
            h = actor.kept_entropy.masked_fill(~mask.bool(), 0.0)
            tokens = self.token_advantages(h, mask, row_sign)
            self._sums[0] += float(tokens.abs().sum())
            self._sums[1] += float(h.sum())
            self._sums[2] += float(mask.sum())
            out = advantages.clone()
            out[rows] += tokens.to(device=out.device, dtype=out.dtype)
            return out

        loss.with_token_advantages = with_tokens
        try:
            return self.step(experience, *args, **kwargs)
        finally:
            actor.entropy_rows = actor.kept_entropy = None
            loss.with_token_advantages = None
