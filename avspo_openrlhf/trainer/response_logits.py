"""The vocabulary projection for the response tokens only, in OpenRLHF's ``Actor.forward``.

OpenRLHF's ``Actor.forward`` projects every position of prompt + response onto the vocabulary in
fp32, takes its log-softmax (and, for the entropy monitor, the softmax entropy) everywhere, then
keeps the last A positions. On a small model with a large vocabulary most of that work, and of its
backward, is spent on prompt positions (SmolLM2-135M: a 49k-token LM head for ~50 prompt and 32
response tokens). transformers' ``logits_to_keep`` projects only the last A + 1 hidden states; the
action log-probs, the entropies OpenRLHF's callers read (``output.entropy[:, -A:]``) and
``output["logits"][:, -A - 1 : -1]`` (a token-level remedy's, ``token_level.py``) are those of the same rows.

Only for the plain case: unpacked batches of a text model without ring attention, asking for action
log-probs. Anything else (packing, VLMs, ``return_logprobs``, ``allgather_logits``) goes to
OpenRLHF's own ``forward`` unchanged.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext

import torch
from openrlhf.models import Actor
from openrlhf.models.utils import compute_entropy, log_probs_from_logits


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DeepSpeed's engine (``.module``) and PEFT (``get_base_model``)."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def keeps_response_logits(actor: Actor) -> bool:
    """Whether ``actor``'s model takes ``logits_to_keep`` and the actor runs the plain case."""
    if getattr(actor, "packing_samples", False) or getattr(actor, "is_vlm", False):
        return False
    return "logits_to_keep" in inspect.signature(_causal_lm(actor.model).forward).parameters


class ResponseLogitsActor(Actor):
    """OpenRLHF's ``Actor`` whose ``forward`` computes logits for the response positions only.

    With ``entropy_rows`` set (``[B]`` bool) it also keeps those rows' response-token entropies,
    detached, in ``kept_entropy`` (``[R, A]``): a token-level remedy's, from the training forward
    (:meth:`keeping_entropy`, ``token_level.py``)."""

    entropy_rows: torch.Tensor | None = None
    entropy_grad = True  # the returned entropies carry autograd (an entropy term in the loss)
    kept_entropy: torch.Tensor | None = None

    @contextmanager
    def keeping_entropy(self, rows: torch.Tensor):
        """Within the block, each forward keeps the entropies of ``rows`` in ``kept_entropy``."""
        self.entropy_rows, self.kept_entropy = rows, None
        try:
            yield
        finally:
            self.entropy_rows = self.kept_entropy = None

    def forward(
        self,
        sequences,
        action_mask=None,
        attention_mask=None,
        return_output=False,
        allgather_logits=False,
        return_logprobs=False,
        ring_attn_group=None,
        packed_seq_lens=None,
        return_entropy=False,
        **mm_inputs,
    ):
        if action_mask is None or return_logprobs or allgather_logits or ring_attn_group is not None or mm_inputs:
            return super().forward(
                sequences,
                action_mask,
                attention_mask,
                return_output,
                allgather_logits,
                return_logprobs,
                ring_attn_group,
                packed_seq_lens,
                return_entropy,
                **mm_inputs,
            )
        a = action_mask.shape[1]
        position_ids = attention_mask.long().cumsum(-1) - 1  # as OpenRLHF's forward, for left padding
        position_ids.masked_fill_(attention_mask == 0, 1)
        output = self.model(sequences, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=a + 1)
        output["logits"] = output["logits"].to(torch.float32)  # [B, A + 1, V]: positions L-A-1 .. L-1
        if self.temperature != 1.0:
            output["logits"].div_(self.temperature)
        logits = output["logits"][:, :-1]  # those that predict the A response tokens
        if return_entropy:
            assert return_output
            # [B, A]: what [:, -A:] of OpenRLHF's is. A metric only (the entropy monitor's
            # --actor.entropy_coef 0): without its graph, whose [B, A, V] softmax and products stayed
            # alive until backward (SmolLM2, 16 responses: 0.18 s less per fwd + bwd + AdamW of about
            # 5.3 s, median of 8 alternating pairs, fp32, 2-core Intel Xeon with native bf16)
            with nullcontext() if self.entropy_grad else torch.no_grad():
                output.entropy = compute_entropy(logits)
        if self.entropy_rows is not None:
            with torch.no_grad():
                idx = self.entropy_rows.to(logits.device).nonzero().flatten()
                self.kept_entropy = compute_entropy(logits[idx].detach()).float()
        log_probs = log_probs_from_logits(logits, sequences[:, -a:]) * action_mask.float()
        return (log_probs, output) if return_output else log_probs


def use_response_logits(actor: Actor, entropy_grad: bool = True) -> bool:
    """Gives ``actor`` (an OpenRLHF ``Actor``, already prepared by DeepSpeed) the response-only
    ``forward`` where :func:`keeps_response_logits`; returns whether it did. ``entropy_grad=False``
    (``--actor.entropy_coef`` 0 or unset: no entropy term in the loss) computes the entropies it
    returns without autograd."""
    if type(actor) is not Actor or not keeps_response_logits(actor):
        return False
    actor.__class__ = ResponseLogitsActor  # same attributes, same parameters: only forward differs
    actor.entropy_grad = entropy_grad
    return True


class ResponseLogitsMixin:
    """Goes before OpenRLHF's policy or reference actor in the MRO: its ``Actor`` (``self.actor``,
    ``self.model`` for the reference) gets :class:`ResponseLogitsActor`'s forward after loading."""

    def init_model_from_pretrained(self, *args, **kwargs):
        out = super().init_model_from_pretrained(*args, **kwargs)
        entropy_grad = bool(self.strategy.args.actor.entropy_coef)  # None or 0: not in the loss
        for name in ("actor", "model"):
            if isinstance(getattr(self, name, None), Actor):
                use_response_logits(getattr(self, name), entropy_grad)
        return out
