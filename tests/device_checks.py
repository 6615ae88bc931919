"""Checks that the algorithm layer works whatever torch's default device is (trainers and notebooks
call ``torch.set_default_device``): the tensors it makes name their device. Run on CPU under the
``meta`` default device (it stands in for CUDA: anything made there cannot be computed with) by
tests/test_default_device.py, and under ``cuda`` by tests/gpu/."""

from __future__ import annotations

from contextlib import contextmanager

import torch

REWARDS = [[1.0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1]]


@contextmanager
def default_device(device: str):
    """``torch.set_default_device(device)`` inside the block, the previous default restored after."""
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None if before.type == "cpu" else before)


def every_estimator(device: str) -> dict[str, tuple[torch.Tensor, dict]]:
    """``group_advantages`` of every registered estimator (AVSPO with each virtual strategy) on rewards
    made on ``device``, with a CPU generator."""
    from avspo_openrlhf.algo import ESTIMATORS, VIRTUAL_STRATEGIES, AVSPOConfig, group_advantages

    r = torch.tensor(REWARDS, device=device)
    out = {}
    for name in sorted(ESTIMATORS):
        configs = {name: None}
        if name == "avspo":
            configs = {f"avspo/{s}": AVSPOConfig(strategy=s) for s in sorted(VIRTUAL_STRATEGIES)}
        for key, cfg in configs.items():
            gen = torch.Generator(device="cpu").manual_seed(3)
            adv, info = group_advantages(r, name, cfg, acr_gate=0.9, generator=gen)
            assert adv.device == r.device and adv.shape == r.shape, key
            out[key] = (adv.cpu(), info)
    # the token-level part (RL-ZVP): entropies and masks made on ``device``, signs from those rewards
    from avspo_openrlhf.algo import CollapseController, zero_variance_sign

    for name in sorted(n for n, e in ESTIMATORS.items() if e.token_fn is not None):
        sign = zero_variance_sign(r)
        entropy = torch.linspace(0.1, 2.0, len(REWARDS) * 3, device=device).reshape(len(REWARDS), 3)
        mask = torch.tensor([[1, 1, 0]] * len(REWARDS), dtype=torch.bool, device=device)
        tokens = CollapseController(name).token_advantages(entropy, mask, sign)
        assert tokens.device == r.device and tokens.shape == entropy.shape, name
        out[f"{name}/tokens"] = (tokens.cpu(), {"acr": float((sign != 0).float().mean())})
    return out


def greso_round_trip() -> tuple[dict, dict, torch.Tensor, torch.Tensor]:
    """A GRESO selector with history, its state through ``load_state_dict`` into a fresh one; returns
    both states and both selectors' next draws (equal when the state made it across)."""
    from avspo_openrlhf.algo import GRESOConfig, GRESOSelector

    keys = [f"p{i}" for i in range(5)]
    a = GRESOSelector(GRESOConfig(p_easy=0.5, p_hard=0.5, audit=0.5), seed=1)
    for _ in range(3):
        a.select(keys)
        a.observe(keys, torch.tensor(REWARDS, device="cpu"))
    b = GRESOSelector(GRESOConfig(p_easy=0.5, p_hard=0.5, audit=0.5), seed=99)  # the same settings, another seed
    b.load_state_dict(a.state_dict())
    return a.state_dict(), b.state_dict(), torch.stack(a.select(keys)), torch.stack(b.select(keys))
