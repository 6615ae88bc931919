"""RL-ZVP's token entropies H_t from the policy's log-prob forward (docs/algorithm.md#rl-zvp).

OpenRLHF's ``make_experience`` already runs the policy once per micro-batch for the old-policy
log-probs; the logits of that pass give the entropies too, so RL-ZVP needs no second pass. Only the
responses of zero-variance groups need them: :func:`log_probs_and_entropy` computes the softmax
entropy for those rows' response tokens alone (OpenRLHF's ``return_entropy`` would do every row and
every prompt token). No Ray import here: the policy actor (``actors.py``) and the benchmark call it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from openrlhf.models.utils import compute_entropy


class ForwardWithEntropy(NamedTuple):
    """What the policy actor's ``forward`` returns when asked for entropies."""

    log_probs: torch.Tensor  # [B, A] action log-probs, as OpenRLHF's forward returns them
    entropy: torch.Tensor  # [R, A] response-token entropies of the R requested rows, zero on padding


def log_probs_and_entropy(actor, sequences: torch.Tensor, action_mask: torch.Tensor, attention_mask: torch.Tensor,
                          rows: torch.Tensor, **kwargs) -> ForwardWithEntropy:  # fmt: skip
    """One forward of OpenRLHF's ``Actor`` (call it under ``no_grad``): the ``[B, A]`` action log-probs
    and, for the rows where ``rows`` (``[B]`` bool) is set, the ``[R, A]`` full-vocabulary entropy of
    each response token under the temperature-scaled policy that sampled it. ``kwargs`` go to the
    actor (``ring_attn_group``, multimodal inputs)."""
    packed = bool(getattr(actor, "packing_samples", False))
    # packed sequences come back as one row: let OpenRLHF unpack its own entropies (every row)
    log_probs, output = actor(sequences, action_mask, attention_mask, return_output=True,
                              return_entropy=packed, **kwargs)  # fmt: skip
    a = action_mask.shape[1]
    idx = rows.to(log_probs.device).nonzero().flatten()
    if packed:
        entropy = output.entropy[:, -a:][idx]
    else:  # logits at position t predict token t + 1: the response tokens' are the a before the last
        entropy = compute_entropy(output["logits"][:, -a - 1 : -1][idx])
    return ForwardWithEntropy(log_probs, entropy.float() * action_mask[idx.to(action_mask.device)].to(entropy.device))
