"""OpenRLHF's micro-batches of samples <-> ``[N, G]`` prompt groups: ``split_rollout_samples`` tags
each sample with its original index, and the samples of one prompt are consecutive there.
Torch only (no Ray): the experience maker and ``token_level.py`` use it.
"""

from __future__ import annotations

import itertools

import torch


def group_order(experiences) -> torch.Tensor:
    """Positions of the concatenated experience samples in prompt-group order (OpenRLHF's
    ``split_rollout_samples`` tags each sample with its original index)."""
    return torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)), device="cpu")


def to_groups(values: list[torch.Tensor], order: torch.Tensor, n: int) -> torch.Tensor:
    flat = torch.cat(values).float()
    out = torch.empty_like(flat)
    out[order] = flat
    return out.reshape(-1, n)


def from_groups(grouped: torch.Tensor, order: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    return grouped.reshape(-1)[order].split(sizes)
