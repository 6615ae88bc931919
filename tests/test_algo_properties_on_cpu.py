"""Property-based invariants of the advantage estimators (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from avspo_openrlhf.algo import VIRTUAL_STRATEGIES, AVSPOConfig, GroupNormConfig, group_advantages

STRATEGIES = sorted(VIRTUAL_STRATEGIES)


@st.composite
def binary_batches(draw):
    n = draw(st.integers(1, 12))
    g = draw(st.integers(2, 10))
    bits = draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=g, max_size=g), min_size=n, max_size=n))
    return torch.tensor(bits)


@settings(max_examples=150, deadline=None)
@given(
    r=binary_batches(),
    strategy=st.sampled_from(STRATEGIES),
    gate=st.floats(0.0, 1.0),
    std=st.sampled_from(["population", "unbiased"]),
)
def test_non_collapsed_groups_unchanged_and_signs(r, strategy, gate, std):
    grpo, _ = group_advantages(r, "grpo", GroupNormConfig(std_convention=std))
    adv, info = group_advantages(
        r,
        "avspo",
        AVSPOConfig(std_convention=std, strategy=strategy),
        acr_gate=gate,
        tau_adapt=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    s = info["stats"]
    assert torch.equal(adv[~s.collapsed], grpo[~s.collapsed])
    assert torch.isfinite(adv).all()
    if info["gate_open"]:
        # all-right groups are pushed up, all-wrong groups down, each group by one common value
        assert (adv[s.all_right] > 0).all() and (adv[s.all_wrong] < 0).all()
        assert (adv[s.collapsed] == adv[s.collapsed][:, :1]).all()
        # |A| <= sqrt(K/G) (the unbiased std is larger, so the bound holds for it too)
        assert (adv[s.collapsed].abs() <= (info["num_virtual_k"] / r.shape[1]) ** 0.5 + 1e-5).all()
    else:
        assert torch.equal(adv, grpo)


@settings(max_examples=100, deadline=None)
@given(
    r=binary_batches(),
    scale=st.floats(0.25, 20.0),
    shift=st.floats(-5.0, 5.0),
    strategy=st.sampled_from([s for s in STRATEGIES if s != "random_uniform"]),
    estimator=st.sampled_from(["grpo", "avspo"]),
)
def test_affine_reward_invariance(r, scale, shift, strategy, estimator):
    """Advantages do not change when rewards and their range are mapped by r -> a r + b (a > 0)."""
    cfg = AVSPOConfig(strategy=strategy, eps=1e-9) if estimator == "avspo" else GroupNormConfig(eps=1e-9)
    base, _ = group_advantages(r, estimator, cfg, acr_gate=0.9)
    moved, _ = group_advantages(r * scale + shift, estimator, cfg, acr_gate=0.9, reward_range=(shift, scale + shift))
    assert torch.allclose(base, moved, atol=2e-4)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 20), g=st.integers(2, 9), seed=st.integers(0, 2**31 - 1))
def test_grpo_zero_mean_unit_std_on_continuous_rewards(n, g, seed):
    r = torch.rand(n, g, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    adv, info = group_advantages(r, "grpo", GroupNormConfig(eps=0.0))
    assert info["acr"] == 0.0
    assert torch.allclose(adv.mean(1), torch.zeros(n, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(adv.std(1, correction=0), torch.ones(n, dtype=torch.float64), atol=1e-6)
