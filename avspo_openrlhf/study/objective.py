"""The update's objective, written once for both engines (``study/hf_engine.py``: one run per
process; ``study/engine.py``: K runs stacked in one process): the completion tokens' log-probs and
entropies under the sampling policy, the policy loss, the finiteness checks and the diagnosis of a
skipped step, and the attention rule of the training forward for rows with left padding. Pure tensor functions: a leading run axis (``[R, ...]``) is carried
through, so the stacked engine gets one loss per run from the same lines."""

from __future__ import annotations

import torch


def token_logprobs_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool):
    """``(log pi_T(targets) [B, T], H(pi_T) [B, T] or None)`` with pi_T = softmax(logits / T), in fp32.

    T is the temperature the completions were sampled at: with it the samples are on-policy, and a
    constant advantage on a group has an expected update of zero (E_pi[grad log pi] = 0); with the raw
    logits (T = 1) after sampling at T < 1 it is not, and a negative one raises the entropy."""
    z = logits.float() / temperature
    # log pi = z - logsumexp(z): one [B, T, V] tensor kept for backward, not a second log-softmax
    lp = z.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(z, -1)
    ent = None
    if entropy:
        with torch.no_grad():  # entr(p) = -p log p, 0 at p = 0 (a -inf logit gives no NaN)
            ent = torch.special.entr(torch.softmax(z, -1)).sum(-1)
    return lp, ent


def policy_loss(lp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """- sum over the completion tokens of A * log pi_T, divided by ``total`` (the whole batch's token
    count, so micro-batches add up to the mean over the batch): the last two axes ``[b, T]`` reduced,
    a scalar for one run, ``[R]`` for R stacked runs (``total`` then ``[R]``). ``adv`` is the tokens'
    advantages ``[..., b, T]`` and carries no gradient. A masked position adds an exact 0 even where its
    log-prob is not finite (``0 * NaN`` would poison the sum)."""
    return -torch.where(mask > 0, adv.detach() * lp, 0.0).sum((-2, -1)) / total


def masked_finite(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Whether ``x`` is finite at every completion token: ``[b, T]`` gives a 0-d bool, ``[R, b, T]``
    one per run (a masked position is not read)."""
    return torch.where(mask > 0, x, 0.0).isfinite().all(-1).all(-1)


def diagnosis(loss_finite: bool, logprobs_finite: bool, entropy_finite: bool, bad_grads: list[str]) -> dict:
    """What a skipped step reports: which of the forward's outputs were finite, and the parameters
    whose gradient was not (their count, the first five names)."""
    return {
        "loss_finite": bool(loss_finite),
        "logprobs_finite": bool(logprobs_finite),
        "entropy_finite": bool(entropy_finite),
        "nonfinite_grads": len(bad_grads),
        "first_nonfinite_grads": bad_grads[:5],
    }


def causal_mask(keys_valid: torch.Tensor, queries: int, start: int = 0) -> torch.Tensor:
    """The boolean attention mask ``[n, 1, queries, S]`` of ``queries`` positions, the first at
    ``start``, over the keys ``keys_valid`` ``[n, S]`` (True: a real token): causal, padded keys
    masked, and a query that would see no key (a left-padding position) sees every key.

    Why: a left-padding query with no key attends to nothing. The forward of CUDA's SDPA kernels stays
    finite there, but the backward of some of them gives NaN, and 0 x NaN reaches every parameter. The
    first GPU pilot's GRPO seed 0 stopped so at step 35 on an H200 (bf16 autocast): the forward and the
    fp32 recomputation were finite, and only the rows with left padding gave non-finite gradients,
    whatever their advantage (PyTorch issues 103749, 110213). A padding row's output is never read (its
    key is masked for every other row, its logits are not kept), so opening it changes nothing else;
    transformers' former ``_unmask_unattended`` did the same."""
    size = keys_valid.shape[1]
    causal = torch.ones(queries, size, dtype=torch.bool, device=keys_valid.device).tril(start)
    mask = causal[None] & keys_valid[:, None, :]  # [n, queries, S]
    return (mask | ~mask.any(-1, keepdim=True))[:, None]
