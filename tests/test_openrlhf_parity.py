"""Our GRPO equals OpenRLHF 0.11.2's `group_norm`, computed by OpenRLHF's own
`RemoteExperienceMaker.compute_advantages_and_returns` (sources untouched, CPU)."""

from types import SimpleNamespace as NS

import pytest
import torch

from avspo_openrlhf.algo import GroupNormConfig, group_advantages

experience_maker = pytest.importorskip("openrlhf.trainer.ppo_utils.experience_maker")
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402


def openrlhf_group_norm(rewards: torch.Tensor, micro_batch: int = 4, seed: int = 0) -> torch.Tensor:
    """Run OpenRLHF's advantage code on ``[N, G]`` rewards split into shuffled micro-batches."""
    n, g = rewards.shape
    args = NS(
        rollout=NS(n_samples_per_prompt=g, max_new_tokens=16),
        data=NS(max_len=32),
        reward=NS(overlong_buffer_len=None, stop_properly_penalty_coef=None, clip_range=(-10, 10)),
        algo=NS(advantage=NS(estimator="group_norm", gamma=1.0, lambd=1.0, no_std_norm=False)),
    )
    maker = experience_maker.RemoteExperienceMaker.__new__(experience_maker.RemoteExperienceMaker)
    maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, "group_norm"
    maker.kl_ctl = NS(value=0.0)
    order = torch.randperm(n * g, generator=torch.Generator().manual_seed(seed))  # out-of-order samples
    flat = rewards.reshape(-1)
    experiences = []
    for idx in order.split(micro_batch):
        t = 5
        experiences.append(
            Experience(
                rewards=flat[idx].clone(),
                action_mask=torch.ones(len(idx), t, dtype=torch.bool),
                kl=torch.zeros(len(idx), t),
                index=idx.tolist(),
                info={},
            )
        )
    experiences = maker.compute_advantages_and_returns(experiences)
    out = torch.empty(n * g)
    for exp in experiences:
        out[exp.index] = exp.advantages[:, 0]  # gamma=1, reward at the last token: A_t0 = A
    return out.reshape(n, g)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_grpo_unbiased_equals_openrlhf_group_norm(g):
    rewards = torch.rand(16, g, generator=torch.Generator().manual_seed(g))
    ours, _ = group_advantages(rewards, "grpo", GroupNormConfig(std_convention="unbiased", eps=1e-9))
    theirs = openrlhf_group_norm(rewards)
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-6)


def test_grpo_matches_openrlhf_on_binary_rewards_with_collapse():
    rewards = (torch.rand(32, 8, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    rewards[:5] = 1.0
    rewards[5:10] = 0.0
    ours, info = group_advantages(rewards, "grpo", GroupNormConfig(std_convention="unbiased", eps=1e-9))
    assert info["acr"] >= 10 / 32
    assert torch.allclose(ours, openrlhf_group_norm(rewards), atol=1e-6)
