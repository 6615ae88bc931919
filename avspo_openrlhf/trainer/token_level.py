"""Token-level remedies in OpenRLHF: every piece of the pipeline a registered estimator with a
``token_fn`` needs (RL-ZVP today, docs/algorithm.md#rl-zvp); the math is the registry's (``algo/``).

Such an estimator adds ``token_fn(entropy [R, A], mask [R, A], sign [R], config)`` to the advantages
of the R responses whose group's shaped rewards have zero variance (``sign`` +1 all-right, -1 other
collapsed, :func:`~avspo_openrlhf.algo.zero_variance_sign`). The entropies come from a forward that
runs anyway, so the remedy costs no forward of its own:

- where experience making runs its no-grad log-prob pass (the GPU path),
  :class:`TokenLevelExperienceMixin` asks the policy's forward (:class:`TokenEntropyMixin`) for those
  rows' entropies and adds the token advantages in ``compute_advantages_and_returns``;
- where that pass is skipped (``old_log_probs.skips_old_log_prob_pass``, the CPU path), each
  response travels to training with a :class:`TokenRequest` in ``info[TOKEN_REQUEST]`` (its sign, the
  estimator's name and config), and :class:`TokenLevelTraining` has the training forward keep the
  rows' entropies (detached, the same weights) and adds the token advantages before the loss.

Either way the estimator's ``token_fn`` is looked up in the registry where it is applied. No Ray
import here: the policy actors (``actors.py``, ``cpu/backend.py``) and the benchmark import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from openrlhf.models.utils import compute_entropy
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties
from openrlhf.utils.vlm_utils import merge_mm_train_inputs

from avspo_openrlhf.algo import zero_variance_sign
from avspo_openrlhf.algo.advantages import get_estimator

from .groups import from_groups, group_order, to_groups
from .old_log_probs import OldIsCurrent
from .response_logits import ResponseLogitsActor

TOKEN_REQUEST = "_token_request"
"""``Experience.info`` key: one :class:`TokenRequest` per response where the token entropies are
deferred to the training forward. Taken out of ``info`` before OpenRLHF logs it."""

KEPT_ENTROPY = "token_entropies"
"""Attribute of an experience holding its :class:`TokenEntropies` between ``make_experience`` and
``compute_advantages_and_returns`` (used once: it does not travel on to training)."""


class ForwardWithEntropy(NamedTuple):
    """What the policy actor's ``forward`` returns when asked for entropies."""

    log_probs: torch.Tensor  # [B, A] action log-probs, as OpenRLHF's forward returns them
    entropy: torch.Tensor  # [R, A] response-token entropies of the R requested rows, zero on padding


class TokenEntropies(NamedTuple):
    """The entropies one micro-batch's log-prob pass computed: rows not asked for have none."""

    rows: torch.Tensor  # [B] bool: the rows computed
    entropy: torch.Tensor  # [R, A] their response-token entropies, zero on padding


@dataclass(frozen=True)
class TokenRequest:
    """One response's token-level work, handed to training (per response, because OpenRLHF's
    replay buffer splits a batch into samples and re-collates any list of ``info``)."""

    sign: int  # +1 / -1: the group is zero-variance (all-right / other); 0: mixed, nothing added
    estimator: str  # a registered estimator with a token_fn
    config: Any  # its config, as the experience maker's controller holds it


def log_probs_and_entropy(
    actor,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    **kwargs,
) -> ForwardWithEntropy:
    """One forward of OpenRLHF's ``Actor`` (call it under ``no_grad``): the ``[B, A]`` action log-probs
    and, for the rows where ``rows`` (``[B]`` bool) is set, the ``[R, A]`` full-vocabulary entropy of
    each response token under the temperature-scaled policy that sampled it (only those rows: OpenRLHF's
    ``return_entropy`` would do every row and every prompt token). ``kwargs`` go to the actor
    (``ring_attn_group``, multimodal inputs)."""
    packed = bool(getattr(actor, "packing_samples", False))
    # packed sequences come back as one row: let OpenRLHF unpack its own entropies (every row)
    log_probs, output = actor(
        sequences, action_mask, attention_mask, return_output=True, return_entropy=packed, **kwargs
    )
    a = action_mask.shape[1]
    idx = rows.to(log_probs.device).nonzero().flatten()
    if packed:
        entropy = output.entropy[:, -a:][idx]
    else:  # logits at position t predict token t + 1: the response tokens' are the a before the last
        entropy = compute_entropy(output["logits"][:, -a - 1 : -1][idx])
    return ForwardWithEntropy(log_probs, entropy.float() * action_mask[idx.to(action_mask.device)].to(entropy.device))


def zero_variance_rows(samples_list, args, tol: float, reward_range: tuple[float, float]) -> list[torch.Tensor] | None:
    """``[B]`` bool per micro-batch: the responses whose group is zero-variance under the shaped
    reward ``compute_advantages_and_returns`` will see (OpenRLHF's length penalties applied to a copy
    of the rewards); every row when a reward model scores in this pass; ``None`` without groups."""
    n = args.rollout.n_samples_per_prompt
    if n < 2:
        return None  # no groups: compute_advantages_and_returns leaves it to OpenRLHF
    if samples_list[0].rewards is None:
        return [torch.ones(len(s.sequences), dtype=torch.bool, device="cpu") for s in samples_list]
    preview = [
        SimpleNamespace(
            rewards=s.rewards.to(torch.promote_types(s.rewards.dtype, torch.float32)).clone(),
            response_length=s.response_length,
            truncated=s.truncated,
            info={},
        )
        for s in samples_list
    ]
    apply_length_penalties(preview, args)
    order, sizes = group_order(samples_list), [len(s.index) for s in samples_list]
    sign = zero_variance_sign(to_groups([p.rewards for p in preview], order, n), tol, reward_range)
    return [s != 0 for s in from_groups(sign[:, None].expand(-1, n), order, sizes)]


def _token_means(name: str, abs_sum: float, entropy_sum: float, tokens: int) -> dict[str, float]:
    """The metrics both paths log: mean |token advantage| and mean entropy over the rows' tokens."""
    return {
        f"{name}/token_adv_abs_mean": abs_sum / tokens if tokens else 0.0,
        f"{name}/entropy_mean": entropy_sum / tokens if tokens else 0.0,
    }


class TokenLevelExperienceMixin:
    """Goes before ``RemoteExperienceMaker`` in the MRO of an experience maker that has a
    ``controller``; call :meth:`_token_setup` after its ``__init__``. With a token-level estimator,
    ``make_experience``'s policy forward also returns the token entropies of the responses that need
    them: one pass, under the weights that generated them (the paper's pi_theta at the start of the
    update). Where that pass is skipped (``entropy_in_training``) the training forward computes them."""

    def _token_setup(self, skips_old_pass: bool) -> None:
        c = self.controller
        self.token_fn = get_estimator(c.estimator).token_fn if c.enable else None
        self.entropy_in_training = self.token_fn is not None and skips_old_pass
        self._entropy_rows = self._entropy_refs = self._entropies = None  # set inside make_experience

    @torch.no_grad()
    def make_experience(self, samples_list):
        """OpenRLHF's ``make_experience``; each experience keeps the entropies its policy forward
        computed as :data:`KEPT_ENTROPY` until ``compute_advantages_and_returns`` uses them."""
        c = self.controller
        wants = self.token_fn is not None and not self.entropy_in_training
        self._entropy_rows = (
            zero_variance_rows(samples_list, self.strategy.args, c.tol, c.reward_range) if wants else None
        )
        self._entropy_refs, self._entropies = None, None
        try:
            experiences = super().make_experience(samples_list)
            if self._entropy_rows is not None:
                for e, rows, h in zip(experiences, self._entropy_rows, self._entropies, strict=True):
                    setattr(e, KEPT_ENTROPY, TokenEntropies(rows, h))
        finally:
            self._entropy_rows = self._entropy_refs = self._entropies = None
        return experiences

    def _dispatch_forward(self, group, sync_condition, **kwargs):
        # make_experience's forward calls: the policy's carries the entropy request
        if group is not self.actor_model_group or self._entropy_rows is None:
            return super()._dispatch_forward(group, sync_condition, **kwargs)
        self._entropy_refs = super()._dispatch_forward(group, sync_condition, entropy_rows=self._entropy_rows, **kwargs)
        return self._entropy_refs

    def _flatten_results(self, refs, duplicate_factor):
        out = super()._flatten_results(refs, duplicate_factor)
        if refs is None or refs is not self._entropy_refs:
            return out
        self._entropies = [r.entropy for r in out]  # ForwardWithEntropy, one per micro-batch
        return [r.log_probs for r in out]

    def add_token_advantages(
        self, experiences, shaped: torch.Tensor, order: torch.Tensor, sizes: list[int]
    ) -> dict[str, float]:
        """The estimator's token advantages added on the zero-variance groups' responses (advantages
        and returns), from the entropies :meth:`make_experience` kept; or, where they come from the
        training forward, a :class:`TokenRequest` per response. Works on experiences on any device."""
        c = self.controller
        n = shaped.shape[1]
        sign = zero_variance_sign(shaped, c.tol, c.reward_range)
        signs = from_groups(sign[:, None].expand(-1, n), order, sizes)
        if self.entropy_in_training:  # TokenLevelTraining adds them
            for e, s in zip(experiences, signs):
                e.info[TOKEN_REQUEST] = [TokenRequest(v, c.estimator, c.config) for v in s.tolist()]
            return {f"{c.estimator}/zero_variance_samples": float((sign != 0).sum()) * n}
        count, tokens, total, entropy_sum = 0, 0, 0.0, 0.0
        for e, s in zip(experiences, signs):
            kept = e.__dict__.pop(KEPT_ENTROPY, None)  # used once; it does not travel on to training
            device = e.action_mask.device
            rows = (s != 0).to(device)
            if not rows.any():
                continue
            mask = e.action_mask[rows]
            h = None
            if kept is not None and bool(kept.rows.to(device)[rows].all()):  # every row needed was computed
                full = torch.zeros(e.action_mask.shape, dtype=kept.entropy.dtype, device=device)
                full[kept.rows.to(device)] = kept.entropy.to(device)
                h = full[rows].masked_fill(~mask.bool(), 0.0)
            if h is None or not torch.isfinite(h).all():
                raise RuntimeError(
                    f"{c.estimator}: no token entropies for {int(rows.sum())} zero-variance responses; "
                    "make_experience computes them with the policy's log-probs"
                )
            extra = self.token_fn(h, mask, s.to(device)[rows], c.config).to(device=device, dtype=e.advantages.dtype)
            e.advantages[rows] += extra
            e.returns[rows] += extra
            count += int(rows.sum())
            tokens += int(mask.sum())
            total += float(extra.abs().sum())
            entropy_sum += float((h * mask).sum())
        return {
            f"{c.estimator}/zero_variance_samples": float(count),
            **_token_means(c.estimator, total, entropy_sum, tokens),
        }


class TokenEntropyMixin:
    """Goes before OpenRLHF's ``PolicyModelActor`` in the MRO (after
    :class:`~avspo_openrlhf.trainer.response_logits.ResponseLogitsMixin`): its ``forward`` answers
    :class:`TokenLevelExperienceMixin`'s entropy request."""

    def forward(
        self,
        sequences,
        action_mask=None,
        attention_mask=None,
        packed_seq_lens=None,
        mm_train_inputs_list=None,
        entropy_rows=None,
    ):
        """OpenRLHF's ``forward`` (no-grad action log-probs). With ``entropy_rows`` (``[B]`` bool) the
        same pass also returns those rows' response-token entropies, as a :class:`ForwardWithEntropy`."""
        if entropy_rows is None:
            return super().forward(sequences, action_mask, attention_mask, packed_seq_lens, mm_train_inputs_list)
        device = torch.cuda.current_device()
        mm_inputs = {}
        if mm_train_inputs_list and getattr(self.actor, "is_vlm", False):  # as OpenRLHF's forward
            mm_inputs = merge_mm_train_inputs(mm_train_inputs_list, device)
        self.actor.eval()
        try:
            with torch.no_grad():
                out = log_probs_and_entropy(
                    self.actor,
                    sequences.to(device),
                    action_mask.to(device),
                    attention_mask.to(device),
                    entropy_rows,
                    ring_attn_group=self.strategy.ring_attn_group,
                    **mm_inputs,
                )
        finally:
            self.actor.train()
        return ForwardWithEntropy(out.log_probs.to("cpu"), out.entropy.to("cpu"))

    def token_entropy(self, sequences, action_mask, attention_mask) -> torch.Tensor:
        """``[B, A]`` response-token entropies from a separate no-grad pass (OpenRLHF's
        ``return_entropy``), zero on padding. Training never calls it: it is the reference the
        tests hold ``forward``'s entropies to, and the second pass RL-ZVP used to pay for."""
        device = torch.cuda.current_device()
        self.actor.eval()
        try:
            with torch.no_grad():
                _, output = self.actor(
                    sequences.to(device),
                    action_mask.to(device),
                    attention_mask.to(device),
                    ring_attn_group=self.strategy.ring_attn_group,
                    return_output=True,
                    return_entropy=True,
                )
        finally:
            self.actor.train()
        entropy = output.entropy[:, -action_mask.shape[1] :]
        return (entropy.float() * action_mask.to(entropy.device)).to("cpu")


class TokenLevelTraining:
    """Replaces ``ActorPPOTrainer.training_step`` (an instance attribute, what ``ppo_train`` calls)
    where the old-log-prob pass is skipped: for a micro-batch whose ``info`` carries
    :data:`TOKEN_REQUEST`, the policy's training forward keeps the zero-variance rows' entropies
    (:meth:`ResponseLogitsActor.keeping_entropy`) and the loss (:class:`OldIsCurrent`) adds the
    estimator's ``token_fn`` on those rows: what :class:`TokenLevelExperienceMixin` adds from the
    no-grad pass's entropies when that pass runs. Without a request the step is OpenRLHF's."""

    def __init__(self, trainer):
        if not isinstance(trainer.actor_loss_fn, OldIsCurrent):
            trainer.actor_loss_fn = OldIsCurrent(trainer.actor_loss_fn)
        self.trainer, self.step = trainer, trainer.training_step
        trainer.training_step = self
        self._name = None  # the estimator of this update's requests: its metrics are "<name>/..."
        self._sums = [0.0, 0.0, 0.0]  # |token advantage|, entropy, tokens of this update's rows

    def metrics(self) -> dict[str, float]:
        """This update's ``<name>/token_adv_abs_mean`` and ``<name>/entropy_mean`` over the
        zero-variance responses' tokens (what the experience maker logs when it computes the
        entropies itself); nothing when no request came. Resets the sums."""
        name, (abs_sum, entropy_sum, tokens) = self._name, self._sums
        self._name, self._sums = None, [0.0, 0.0, 0.0]
        return {} if name is None else _token_means(name, abs_sum, entropy_sum, tokens)

    def __call__(self, experience, *args, **kwargs):
        requests = experience.info.pop(TOKEN_REQUEST, None)
        if not requests:
            return self.step(experience, *args, **kwargs)
        first = requests[0]
        self._name = first.estimator
        token_fn = get_estimator(first.estimator).token_fn
        sign = torch.tensor([r.sign for r in requests], dtype=torch.int8)
        rows = (sign != 0).to(experience.action_mask.device)
        if not bool(rows.any()):
            return self.step(experience, *args, **kwargs)
        actor, loss = self.trainer.actor, self.trainer.actor_loss_fn
        if not isinstance(actor, ResponseLogitsActor):
            raise RuntimeError(
                "token entropies from the training forward need the response-only forward "
                f"(trainer/response_logits.py); {type(actor).__name__} does not have it"
            )
        mask = experience.action_mask[rows]
        row_sign = sign.to(rows.device)[rows]

        def with_tokens(advantages: torch.Tensor) -> torch.Tensor:  # the loss calls it after the forward
            if actor.kept_entropy is None:
                raise RuntimeError("the training forward kept no token entropies (not the response-only path)")
            h = actor.kept_entropy.masked_fill(~mask.bool(), 0.0)
            tokens = token_fn(h, mask, row_sign, first.config)
            self._sums[0] += float(tokens.abs().sum())
            self._sums[1] += float(h.sum())
            self._sums[2] += float(mask.sum())
            out = advantages.clone()
            out[rows] += tokens.to(device=out.device, dtype=out.dtype)
            return out

        with actor.keeping_entropy(rows), loss.adding_tokens(with_tokens):
            return self.step(experience, *args, **kwargs)
