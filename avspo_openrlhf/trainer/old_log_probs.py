"""No separate old-log-prob pass where it would return the training forward's own log-probs.

OpenRLHF's ``make_experience`` runs the policy once more per micro-batch, without gradients, for the
PPO ratio's "old" log-probs. With one epoch and one optimizer step per rollout batch, no
reference/KL and no rollout-vs-train correction, nothing changes the weights between that pass and
the training forward, so the ratio is exactly 1: the CPU backend skips the pass
(:func:`skips_old_log_prob_pass`) and :class:`OldIsCurrent` gives the loss the training forward's
log-probs, detached.

A token-level remedy's entropies ride on that pass where it runs; where it is skipped they come from
the training forward instead (``token_level.py``), through :meth:`OldIsCurrent.adding_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch


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


def skipped_old_log_probs(action_mask: torch.Tensor) -> torch.Tensor:
    """What the skipped pass returns for ``[B, A]`` old log-probs: OpenRLHF stores, splits and
    re-collates a tensor there, so the marker is one; NaN, so that anything but :class:`OldIsCurrent`
    reading it fails loudly instead of training on made-up ratios."""
    return torch.full(action_mask.shape, float("nan"))


def is_skipped(old_log_probs: torch.Tensor | None) -> bool:
    """Whether a micro-batch's old log-probs are :func:`skipped_old_log_probs`' (the replay buffer
    re-pads them with 0, hence any NaN)."""
    return old_log_probs is not None and bool(old_log_probs.isnan().any())


class OldIsCurrent:
    """The policy loss with the training forward's own log-probs, detached, in place of a skipped
    no-grad pass (:func:`skipped_old_log_probs`): ratio exactly 1, so the clipped objective's value and gradient
    are those of the old log-probs the pass would have returned (equal, up to float rounding).
    Inside :meth:`adding_tokens` (one micro-batch of a token-level remedy, ``token_level.py``) the
    loss takes the advantages that function returns, once the policy's forward has run."""

    def __init__(self, loss):
        self.loss = loss
        self.with_token_advantages: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __call__(self, log_probs, old_log_probs, advantages, *args, **kwargs):
        if is_skipped(old_log_probs):
            old_log_probs = log_probs.detach()
        if self.with_token_advantages is not None:
            advantages = self.with_token_advantages(advantages)
        return self.loss(log_probs, old_log_probs, advantages, *args, **kwargs)

    @contextmanager
    def adding_tokens(self, with_token_advantages: Callable[[torch.Tensor], torch.Tensor]):
        self.with_token_advantages = with_token_advantages
        try:
            yield
        finally:
            self.with_token_advantages = None

    def __getattr__(self, name):
        return getattr(self.loss, name)
