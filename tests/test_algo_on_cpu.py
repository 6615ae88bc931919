"""The pure ACR/AVSPO math (avspo_openrlhf.algo): closed forms of docs/algorithm.md#advantages, invariants,
edge cases and state round trips. CPU only, torch only."""

import json
import math

import pytest
import torch

from avspo_openrlhf.algo import (
    VIRTUAL_STRATEGIES,
    ACRConfig,
    ACRTracker,
    AdaptiveThreshold,
    AVSPOConfig,
    EntropyCollapseMonitor,
    GroupNormConfig,
    KLDriftMonitor,
    collapse_stats,
    dynamic_sampling_keep_mask,
    group_advantages,
    num_virtual,
    virtual_rewards,
)

DETERMINISTIC = [s for s, v in VIRTUAL_STRATEGIES.items() if v.deterministic]


def gate_for_k(k: int, g: int) -> float:
    """An acr_gate whose K rule gives exactly k (G * sqrt(gate) = k)."""
    return (k / g) ** 2


def reference_avspo(rewards, virtual, correction, eps):
    """Naive AVSPO for one batch: concatenate the virtual rewards and normalize (no tricks)."""
    full = torch.cat([rewards, virtual], dim=1).double()
    std, mean = torch.std_mean(full, dim=1, correction=correction)
    return ((rewards.double() - mean[:, None]) / (std[:, None] + eps)).float()


# ── ACR ──────────────────────────────────────────────────────────────────────────────────────


def test_collapse_stats_split_and_population_std():
    r = torch.tensor([[1.0] * 4, [0.0] * 4, [1, 0, 1, 1.0], [0.0] * 4, [0.5] * 4])
    s = collapse_stats(r)
    assert s.collapsed.tolist() == [True, True, False, True, True]
    assert (s.acr, s.acr_all_wrong, s.acr_all_right) == (0.8, 0.4, 0.2)
    assert s.acr_other == pytest.approx(0.2)
    assert s.group_std[2].item() == pytest.approx(math.sqrt(3 / 16))  # population, not unbiased


def test_collapse_tolerance_is_strict_and_uses_std():
    r = torch.tensor([[0.0, 0.0, 0.0, 4e-6], [0.0, 0.0, 0.0, 1e-6]])  # pop std 1.7e-6, 4.3e-7
    assert collapse_stats(r, tol=1e-6).collapsed.tolist() == [False, True]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_raise_clearly(bad):
    r = torch.zeros(3, 4)
    r[1, 2] = bad
    with pytest.raises(ValueError, match=r"1 non-finite value.*groups: \[1\]"):
        group_advantages(r, "avspo")
    with pytest.raises(ValueError, match="non-finite"):
        collapse_stats(r)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        collapse_stats(torch.zeros(8))
    with pytest.raises(ValueError, match="G >= 1"):
        collapse_stats(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="unknown estimator"):
        group_advantages(torch.zeros(2, 2), "ppo")
    with pytest.raises(ValueError, match="AVSPOConfig.strategy must be one of .*, got 'nope'"):
        group_advantages(torch.zeros(2, 2), "avspo", AVSPOConfig(strategy="nope"), acr_gate=1.0)


def test_empty_batch_is_defined():
    for est in ("grpo", "dr_grpo", "avspo"):
        adv, info = group_advantages(torch.zeros(0, 8), est, acr_gate=1.0)
        assert adv.shape == (0, 8)
        assert info["acr"] == 0.0 and info["acr_effective"] == 0.0


def test_group_size_one():
    r = torch.tensor([[1.0], [0.0]])
    adv, info = group_advantages(r, "grpo")
    assert torch.equal(adv, torch.zeros(2, 1)) and info["acr"] == 1.0
    adv, info = group_advantages(r, "avspo", tau_adapt=0.5)  # gate = batch ACR = 1
    assert adv[0, 0] > 0 > adv[1, 0] and info["num_virtual_k"] == 1
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(r, "grpo", GroupNormConfig(std_convention="unbiased"))


def test_dynamic_sampling_keep_mask_on_std():
    r = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]])
    assert dynamic_sampling_keep_mask(r).tolist() == [False, True, False, False]


# ── K rule and virtual values ────────────────────────────────────────────────────────────────


def test_k_rule():
    assert num_virtual(8, 0.25) == 4  # 8 * 0.5 exactly, no float bump to 5
    assert num_virtual(8, 0.3) == 5  # ceil(4.38)
    assert num_virtual(8, 0.0) == 1  # at least one
    assert num_virtual(8, 1.0) == 8  # at most G
    assert num_virtual(16, 0.5, alpha=1.0) == 8
    assert num_virtual(8, 0.9, strategy="opposite") == 1
    for k in range(1, 9):
        assert num_virtual(8, gate_for_k(k, 8)) == k
    with pytest.raises(ValueError):
        num_virtual(8, 1.5)


def test_stratified_values_match_spec_example():
    v = virtual_rewards(torch.tensor([1.0, 0.0]), torch.tensor([True, False]), 4)
    assert torch.allclose(v, torch.tensor([[0.8, 0.6, 0.4, 0.2], [0.1, 0.075, 0.05, 0.025]]))


def test_other_strategy_values():
    right, wrong = torch.tensor([True, False]), torch.tensor([1.0, 0.0])
    assert torch.allclose(virtual_rewards(wrong, right, 3, "fixed_partial"), torch.full((2, 3), 0.5))
    assert torch.allclose(virtual_rewards(wrong, right, 5, "opposite"), torch.tensor([[0.0], [1.0]]))
    assert torch.allclose(
        virtual_rewards(wrong, right, 3, "exp_decay", gamma=0.5), torch.tensor([[0.5, 0.25, 0.125], [0.1, 0.05, 0.025]])
    )
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = virtual_rewards(wrong, right, 6, "random_uniform", generator=g1)
    b = virtual_rewards(wrong, right, 6, "random_uniform", generator=g2)
    assert torch.equal(a, b) and a.min() >= 0 and a.max() <= 1 and a.shape == (2, 6)


# ── Closed forms (docs/algorithm.md#advantages) ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("g", [2, 4, 8, 16])
def test_opposite_unbiased_closed_form(g):
    r = torch.tensor([[1.0] * g, [0.0] * g])
    adv, info = group_advantages(
        r, "avspo", AVSPOConfig(std_convention="unbiased", strategy="opposite", eps=0.0), acr_gate=1.0
    )
    expected = 1 / math.sqrt(g + 1)  # G=8: 1/3
    assert torch.allclose(adv[0], torch.full((g,), expected), atol=1e-6)
    assert torch.allclose(adv[1], torch.full((g,), -expected), atol=1e-6)
    assert info["num_virtual"].tolist() == [1, 1]


STRATIFIED_TABLE_G8 = [0.354, 0.469, 0.552, 0.620, 0.678, 0.728, 0.772, 0.812]


@pytest.mark.parametrize("k", range(1, 9))
def test_stratified_table_population(k):
    r = torch.tensor([[1.0] * 8, [0.0] * 8])
    adv, info = group_advantages(r, "avspo", acr_gate=gate_for_k(k, 8), tau_adapt=0.0)
    assert info["num_virtual_k"] == k
    # the table is rounded to 3 decimals (K=8: 0.81150 -> 0.812)
    assert adv[0, 0].item() == pytest.approx(STRATIFIED_TABLE_G8[k - 1], abs=6e-4)
    assert -adv[1, 0].item() == pytest.approx(STRATIFIED_TABLE_G8[k - 1], abs=6e-4)
    assert (adv[0] > 0).all() and (adv[1] < 0).all()


@pytest.mark.parametrize("strategy", sorted(VIRTUAL_STRATEGIES))
@pytest.mark.parametrize("g", [2, 4, 8, 16])
def test_advantage_bound_sqrt_k_over_g(strategy, g):
    r = torch.tensor([[1.0] * g, [0.0] * g])
    for k in range(1, g + 1):
        adv, info = group_advantages(
            r,
            "avspo",
            AVSPOConfig(strategy=strategy),
            acr_gate=gate_for_k(k, g),
            tau_adapt=0.0,
            generator=torch.Generator().manual_seed(k),
        )
        kk = info["num_virtual_k"]
        assert adv.abs().max().item() <= math.sqrt(kk / g) + 1e-6


# ── Invariants ───────────────────────────────────────────────────────────────────────────────


def random_batch(n, g, seed, collapsed_frac=0.4, binary=True):
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(n, g, generator=gen) < 0.5).float() if binary else torch.rand(n, g, generator=gen)
    coll = torch.rand(n, generator=gen) < collapsed_frac
    side = (torch.rand(n, generator=gen) < 0.5).float()
    r[coll] = side[coll][:, None].expand(-1, g)
    return r


@pytest.mark.parametrize("std", ["population", "unbiased"])
@pytest.mark.parametrize("strategy", sorted(VIRTUAL_STRATEGIES))
def test_gate_closed_is_grpo_bit_for_bit(std, strategy):
    r = random_batch(257, 8, seed=1)
    grpo, _ = group_advantages(r, "grpo", GroupNormConfig(std_convention=std))
    for gate, tau in [(0.3, 0.5), (0.5, 0.5), (0.0, 0.1)]:  # acr_gate <= tau_adapt: closed
        avspo, info = group_advantages(
            r, "avspo", AVSPOConfig(std_convention=std, strategy=strategy), acr_gate=gate, tau_adapt=tau
        )
        assert not info["gate_open"] and torch.equal(avspo, grpo)
        assert info["num_virtual"].sum() == 0 and info["acr_effective"] == info["acr"]


@pytest.mark.parametrize("std", ["population", "unbiased"])
@pytest.mark.parametrize("strategy", sorted(VIRTUAL_STRATEGIES))
def test_mixed_batch_matches_naive_reference(std, strategy):
    """Collapsed and non-collapsed groups, all-0 and all-1 in one batch, vs explicit concatenation."""
    r = random_batch(300, 8, seed=2)
    correction = 1 if std == "unbiased" else 0
    gen, ref_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    adv, info = group_advantages(
        r, "avspo", AVSPOConfig(std_convention=std, strategy=strategy), acr_gate=0.6, tau_adapt=0.5, generator=gen
    )
    stats = info["stats"]
    k = info["num_virtual_k"]
    assert k == num_virtual(8, 0.6, strategy=strategy)
    assert stats.num_all_right > 0 and stats.num_all_wrong > 0 and not stats.collapsed.all()
    grpo, _ = group_advantages(r, "grpo", GroupNormConfig(std_convention=std))
    coll = stats.collapsed
    assert torch.equal(adv[~coll], grpo[~coll])  # non-collapsed groups are untouched, bit for bit
    v = virtual_rewards(r.mean(1), stats.all_right, k, strategy, generator=ref_gen)
    ref = reference_avspo(r, v, correction, 1e-6)
    assert torch.allclose(adv[coll], ref[coll], atol=1e-5)
    assert (adv[stats.all_right] > 0).all() and (adv[stats.all_wrong] < 0).all()
    assert info["num_virtual"].tolist() == (coll.long() * k).tolist()
    assert info["acr_effective"] == 0.0


@pytest.mark.parametrize("strategy", DETERMINISTIC)
def test_fast_path_equals_general_path(strategy):
    """A group inside the range forces the general path; the lo/hi groups must not change."""
    r = random_batch(64, 8, seed=3)
    extra = torch.full((1, 8), 0.25)  # constant at an interior value: 'other'
    fast, _ = group_advantages(r, "avspo", AVSPOConfig(strategy=strategy), acr_gate=0.7)
    general, info = group_advantages(torch.cat([r, extra]), "avspo", AVSPOConfig(strategy=strategy), acr_gate=0.7)
    assert info["stats"].acr_other > 0
    assert torch.allclose(fast, general[:-1], atol=1e-6)


def test_non_binary_rewards_and_custom_range():
    # rewards in [-1, 2]: all at 2 = all-right, all at -1 = all-wrong, all at 0.5 = other
    r = torch.tensor([[2.0] * 4, [-1.0] * 4, [0.5] * 4, [-1.0, 0.0, 1.5, 2.0]])
    adv, info = group_advantages(r, "avspo", acr_gate=0.75, reward_range=(-1.0, 2.0))
    s = info["stats"]
    assert (s.num_all_right, s.num_all_wrong, s.num_collapsed) == (1, 1, 3)
    assert (adv[0] > 0).all() and (adv[1] < 0).all() and (adv[2] < 0).all()  # 'other' treated like all-wrong
    v = virtual_rewards(r.mean(1), s.all_right, info["num_virtual_k"], reward_range=(-1.0, 2.0))
    assert torch.allclose(adv[:3], reference_avspo(r, v, 0, 1e-6)[:3], atol=1e-5)
    # affine invariance: the same batch mapped to [0, 1] gives the same advantages
    adv01, _ = group_advantages((r + 1) / 3, "avspo", acr_gate=0.75)
    assert torch.allclose(adv, adv01, atol=1e-4)


def test_fixed_partial_cannot_lift_a_midpoint_group():
    """A group constant at the range midpoint stays collapsed under fixed_partial: effective ACR sees it."""
    r = torch.tensor([[0.5] * 4, [1.0] * 4, [0.0, 1.0, 0.0, 1.0]])
    adv, info = group_advantages(r, "avspo", AVSPOConfig(strategy="fixed_partial"), acr_gate=0.9)
    assert torch.equal(adv[0], torch.zeros(4)) and info["acr_effective"] == pytest.approx(1 / 3)
    assert info["acr"] == pytest.approx(2 / 3)


def test_grpo_zeroes_sub_tolerance_noise():
    r = torch.tensor([[0.3, 0.3, 0.3, 0.3000001], [0.0, 1.0, 1.0, 1.0]])
    adv, info = group_advantages(r, "grpo")
    assert torch.equal(adv[0], torch.zeros(4)) and info["acr"] == 0.5


def test_dr_grpo_centres_only():
    r = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    adv, _ = group_advantages(r, "dr_grpo")
    assert torch.allclose(adv, torch.tensor([[-0.75, 0.25, 0.25, 0.25]]))


def test_random_uniform_is_seeded():
    r = random_batch(50, 8, seed=4)
    a, _ = group_advantages(
        r, "avspo", AVSPOConfig(strategy="random_uniform"), acr_gate=0.8, generator=torch.Generator().manual_seed(0)
    )
    b, _ = group_advantages(
        r, "avspo", AVSPOConfig(strategy="random_uniform"), acr_gate=0.8, generator=torch.Generator().manual_seed(0)
    )
    c, _ = group_advantages(
        r, "avspo", AVSPOConfig(strategy="random_uniform"), acr_gate=0.8, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_default_gate_is_batch_acr():
    r = torch.tensor([[1.0] * 8] * 3 + [[0.0, 1.0] * 4])  # ACR 0.75 > 0.5
    _, info = group_advantages(r, "avspo")
    assert info["gate_open"] and info["acr_gate"] == 0.75 and info["num_virtual_k"] == 7


# ── Adaptive threshold ───────────────────────────────────────────────────────────────────────


def test_threshold_follows_equation_step_by_step():
    th = AdaptiveThreshold(ACRConfig(tau_init=0.5, eta=0.1, tau_bounds=(0.1, 0.9), reward_ema_decay=0.5))
    out = th.update(acr=0.8, mean_reward=0.2)  # first step: no previous EMA, dJ = 0, no move
    assert out["tau_adapt"] == 0.5 and out["tau_delta_j"] == 0.0
    out = th.update(acr=0.8, mean_reward=0.6)  # ema 0.2 -> 0.4, dJ = +0.2: tau += 0.1 * (0.8 - 0.5)
    assert out["tau_delta_j"] == pytest.approx(0.2) and out["tau_adapt"] == pytest.approx(0.53)
    out = th.update(acr=0.2, mean_reward=0.0)  # ema 0.4 -> 0.2, dJ < 0: tau -= 0.1 * (0.2 - 0.53)
    assert out["tau_adapt"] == pytest.approx(0.53 - 0.1 * (0.2 - 0.53))
    out = th.update(acr=0.9, mean_reward=0.2)  # ema 0.2 -> 0.2, dJ = 0: sign(0) = 0, no move
    assert out["tau_adapt"] == pytest.approx(0.563)


def test_threshold_clips_to_bounds():
    th = AdaptiveThreshold(ACRConfig(tau_init=0.85, eta=1.0, reward_ema_decay=0.0))
    th.update(acr=1.0, mean_reward=0.0)
    th.update(acr=1.0, mean_reward=1.0)  # dJ > 0: tau -> 0.85 + (1 - 0.85) = 1.0, clipped
    assert th.tau == 0.9
    th.update(acr=0.0, mean_reward=2.0)  # tau -> 0.0, clipped
    assert th.tau == 0.1
    with pytest.raises(ValueError, match="finite"):
        th.update(acr=float("nan"), mean_reward=0.0)


# ── Tracker and monitors ─────────────────────────────────────────────────────────────────────


def feed(tracker, acrs, n=20):
    for a in acrs:
        k = round(a * n)
        r = torch.cat([torch.zeros(k, 4), torch.tensor([[0.0, 1.0, 0.0, 1.0]] * (n - k))])
        tracker.observe(collapse_stats(r))


def test_tracker_gate_window_and_cumulative():
    t = ACRTracker(ACRConfig(window=3, early_steps=4))
    feed(t, [0.1, 0.2, 0.6])
    assert t.acr_gate == pytest.approx(0.3)
    feed(t, [0.7])
    assert t.acr_gate == pytest.approx(0.5)  # window drops 0.1
    m = t.metrics()
    assert m["acr_cum"] == pytest.approx(0.4) and m["acr_all_wrong_cum"] == pytest.approx(0.4)
    assert m["acr_100"] == pytest.approx(0.4)
    assert m["acr_100_fit_math500_acc"] == pytest.approx(51.4 - 29.6 * 0.4)
    t2 = ACRTracker(ACRConfig(smoothing="ema", ema_decay=0.5))
    feed(t2, [0.0, 1.0])
    assert t2.acr_gate == pytest.approx(0.5)


def test_tracker_alarms():
    t = ACRTracker(ACRConfig(stall_patience=50, volatility_window=25))
    feed(t, [0.4] * 50)
    assert t.metrics()["alarm/acr_stall"] == 0.0  # 50 steps is not "more than 50"
    feed(t, [0.4])
    assert t.metrics()["alarm/acr_stall"] == 1.0
    feed(t, [0.3])
    assert t.metrics()["alarm/acr_stall"] == 0.0
    feed(t, [0.0, 0.5] * 13)
    m = t.metrics()
    assert m["acr_volatility"] == pytest.approx(0.25, abs=0.01) and m["alarm/acr_volatility"] == 1.0


def test_entropy_and_kl_monitors():
    e = EntropyCollapseMonitor(threshold=0.5, patience=2)
    assert [e.update(x)["alarm/entropy_collapse"] for x in (0.4, 0.4, 0.4, 0.6, 0.4)] == [0, 0, 1, 0, 0]
    k = KLDriftMonitor(bound=0.1, patience=1)
    assert [k.update(x)["alarm/kl_drift"] for x in (0.2, 0.2, 0.05)] == [0, 1, 0]
    with pytest.raises(ValueError, match="entropy must be finite"):
        e.update(float("nan"))


def test_state_dicts_round_trip_exactly():
    """Stop mid-run, restore from a JSON copy of the state, and continue identically."""
    gen = torch.Generator().manual_seed(0)
    acrs = torch.rand(60, generator=gen).tolist()
    rewards = torch.rand(60, generator=gen).tolist()

    def make():
        return (
            ACRTracker(ACRConfig(window=5, early_steps=30)),
            AdaptiveThreshold(),
            EntropyCollapseMonitor(patience=3),
            KLDriftMonitor(patience=3),
        )

    def run(objs, lo, hi, log):
        tr, th, en, kl = objs
        for i in range(lo, hi):
            feed(tr, [acrs[i]])
            log.append((tr.metrics(), th.update(acrs[i], rewards[i]), en.update(rewards[i]), kl.update(acrs[i])))

    full, resumed = [], []
    run(make(), 0, 60, full)
    first = make()
    run(first, 0, 25, resumed)
    states = json.loads(json.dumps([o.state_dict() for o in first]))
    second = make()
    for o, s in zip(second, states):
        o.load_state_dict(s)
    assert [o.state_dict() for o in second] == [o.state_dict() for o in first]
    run(second, 25, 60, resumed)
    assert resumed == full


def test_range_ends_match_despite_float32_rounding():
    # 12 * 1 + 4.1089 computed in float32 lands ~1e-6 from the float64 range end (found by hypothesis)
    shift = 4.108906851164958
    r = torch.ones(1, 2) * 12.0 + shift
    s = collapse_stats(r, reward_range=(shift, 12.0 + shift))
    assert s.num_all_right == 1


@pytest.mark.parametrize("strategy", ["stratified", "fixed_partial", "exp_decay", "random_uniform"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_fixed_num_virtual_equals_the_k_rule_at_the_same_k(strategy, k):
    """--avspo.num_virtual K: the paper's fixed-K ablation is the K rule's result at that K."""
    r = random_batch(200, 8, seed=5)
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, ia = group_advantages(
        r, "avspo", AVSPOConfig(strategy=strategy, num_virtual=k), acr_gate=0.9, tau_adapt=0.1, generator=gen_a
    )
    b, ib = group_advantages(
        r, "avspo", AVSPOConfig(strategy=strategy), acr_gate=gate_for_k(k, 8), tau_adapt=0.0, generator=gen_b
    )
    assert ia["num_virtual_k"] == ib["num_virtual_k"] == k
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="num_virtual"):
        group_advantages(r, "avspo", AVSPOConfig(num_virtual=0), acr_gate=0.9)


@pytest.mark.parametrize("strategy", ["stratified", "random_uniform"])
def test_fix_groups_augments_only_the_chosen_collapsed_groups(strategy):
    """--avspo.fix_groups all_wrong / all_right: the paper's mechanism isolation. The chosen kind gets
    exactly full AVSPO's advantages; the other kind keeps GRPO's zeros; mixed groups are untouched."""
    r = torch.cat([random_batch(120, 8, seed=6), torch.full((1, 8), 0.25)])  # + an 'other' constant group
    full, _ = group_advantages(
        r, "avspo", AVSPOConfig(strategy=strategy), acr_gate=0.6, generator=torch.Generator().manual_seed(1)
    )
    grpo, _ = group_advantages(r, "grpo")
    for fix, kind in [("all_wrong", "wrong"), ("all_right", "right")]:
        adv, info = group_advantages(
            r,
            "avspo",
            AVSPOConfig(strategy=strategy, fix_groups=fix),
            acr_gate=0.6,
            generator=torch.Generator().manual_seed(1),
        )
        s = info["stats"]
        chosen = s.all_right if kind == "right" else s.collapsed & ~s.all_right  # 'other' counts as all-wrong
        other = s.collapsed & ~chosen
        assert torch.allclose(adv[chosen], full[chosen], atol=1e-6) and (adv[chosen] != 0).all()
        assert (adv[other] == 0).all()
        assert torch.equal(adv[~s.collapsed], grpo[~s.collapsed])
        assert info["num_virtual"][other].sum() == 0 and (info["num_virtual"][chosen] == info["num_virtual_k"]).all()
        assert info["acr_effective"] == pytest.approx(int(other.sum()) / r.shape[0])
    with pytest.raises(ValueError, match="fix_groups"):
        group_advantages(r, "avspo", AVSPOConfig(fix_groups="neither"))


def test_registries_refuse_a_duplicate_name():
    from avspo_openrlhf.algo import register_estimator, register_virtual_strategy

    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")
    with pytest.raises(ValueError, match="already registered"):
        register_virtual_strategy("stratified")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("strategy", sorted(VIRTUAL_STRATEGIES))
def test_every_strategy_matches_cpu_on_cuda(strategy):
    """CUDA rewards with the controller's CPU generator (random_uniform used to raise "Expected a
    'cuda' device type for generator"); the same seed gives the CPU values."""
    r = random_batch(300, 8, seed=4)
    cpu, _ = group_advantages(
        r, "avspo", AVSPOConfig(strategy=strategy), acr_gate=0.6, generator=torch.Generator().manual_seed(2)
    )
    gpu, _ = group_advantages(
        r.cuda(), "avspo", AVSPOConfig(strategy=strategy), acr_gate=0.6, generator=torch.Generator().manual_seed(2)
    )
    assert gpu.device.type == "cuda" and torch.allclose(gpu.cpu(), cpu, atol=2e-6)


# ── valid by construction ────────────────────────────────────────────────────────────────────

from dataclasses import fields as _fields  # noqa: E402

from avspo_openrlhf.algo import (  # noqa: E402
    CollapseController,
    GRESOConfig,
    MonitorConfig,
    NGRPOConfig,
    OptionError,
    RLZVPConfig,
    SignConfig,
)
from avspo_openrlhf.algo import GroupNormConfig as GroupNorm  # noqa: E402

OPTION_CLASSES = [ACRConfig, AVSPOConfig, NGRPOConfig, RLZVPConfig, SignConfig, GroupNorm, GRESOConfig, MonitorConfig]


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (AVSPOConfig, dict(alpha=-1), "AVSPOConfig.alpha must be > 0, got -1"),
        (
            AVSPOConfig,
            dict(strategy="bogus"),
            "AVSPOConfig.strategy must be one of exp_decay, fixed_partial, opposite, random_uniform, stratified, got 'bogus'",
        ),
        (ACRConfig, dict(tau_init=2), "ACRConfig.tau_init must be in [0, 1], got 2"),
        (ACRConfig, dict(window=0), "ACRConfig.window must be >= 1, got 0"),
        (NGRPOConfig, dict(num_max=0), "NGRPOConfig.num_max must be >= 1, got 0"),
        (
            ACRConfig,
            dict(tau_init=0.95),
            "ACRConfig.tau_init must lie within ACRConfig.tau_bounds [0.1, 0.9], got 0.95",
        ),
        (ACRConfig, dict(tau_bounds=(0.9, 0.1)), "ACRConfig.tau_bounds must have LO <= HI, got 0.9 > 0.1"),
        (ACRConfig, dict(reward_range=(1, 1)), "ACRConfig.reward_range needs LO < HI, got 1.0 1.0"),
        (ACRConfig, dict(reward_range=(1, 0)), "ACRConfig.reward_range needs LO < HI, got 1.0 0.0"),
        (ACRConfig, dict(tol="0.1"), "ACRConfig.tol must be a finite number, got '0.1'"),
        (ACRConfig, dict(ema_decay=float("nan")), "ACRConfig.ema_decay must be a finite number, got nan"),
        (ACRConfig, dict(window=2.5), "ACRConfig.window must be an integer, got 2.5"),
        (ACRConfig, dict(window=True), "ACRConfig.window must be an integer, got True"),
        (NGRPOConfig, dict(gated="yes"), "NGRPOConfig.gated must be True or False, got 'yes'"),
        (
            AVSPOConfig,
            dict(num_virtual=2, strategy="opposite"),
            "AVSPOConfig.num_virtual cannot be combined with AVSPOConfig.strategy opposite",
        ),
        (
            GRESOConfig,
            dict(p_easy=0.99),
            "GRESOConfig.p_easy must lie within GRESOConfig.p_bounds [0.05, 0.95], got 0.99",
        ),
        (GRESOConfig, dict(p_bounds=(0.0, 0.5)), "GRESOConfig.p_bounds must lie in (0, 1), got (0.0, 0.5)"),
        (
            MonitorConfig,
            dict(stop_on_alarm="acr_stall"),
            "MonitorConfig.stop_on_alarm must be a list of names, got 'acr_stall'",
        ),
        (
            MonitorConfig,
            dict(stop_on_alarm=("stall",)),
            "MonitorConfig.stop_on_alarm must name only any, acr_stall, acr_volatility, entropy_collapse, kl_drift, got 'stall'",
        ),
        (MonitorConfig, dict(kl_source=None), "MonitorConfig.kl_source must be set (str), got None"),
    ],
)
def test_each_mistake_is_refused_when_the_config_is_built(cls, kwargs, message):
    with pytest.raises(OptionError) as e:
        cls(**kwargs)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert isinstance(e.value, ValueError) and e.value.config == cls.__name__ and e.value.field in kwargs


# one value outside each `valid` range of algo/options.py
OUTSIDE = {
    ">0": [0, -1],
    ">=0": [-1],
    ">=1": [0],
    ">=2": [1],
    "[0,1]": [-0.5, 1.5],
    "[0,1)": [1, -0.1],
    "(0,1]": [0, 1.1],
    "(0,1)": [0, 1],
}


def _every_field():
    return [(cls, f) for cls in OPTION_CLASSES for f in _fields(cls)]


@pytest.mark.parametrize("cls, f", _every_field(), ids=lambda x: getattr(x, "__name__", None) or x.name)
def test_every_field_refuses_a_wrong_type_and_a_value_outside_its_range(cls, f):
    """Each field of each options class: a value of the wrong type, an unknown choice, a number
    outside its range, a pair with LO > HI are refused in one line naming ``Class.field``."""
    ann = str(f.type)
    wrong = 3 if ann.startswith("str") else "x"
    bad = [wrong]
    if "choices" in f.metadata and ann.startswith("str"):
        bad.append("bogus")
    if ann.startswith(("int", "float")):
        assert "valid" in f.metadata, f"{cls.__name__}.{f.name}: a number without a valid range"
        bad += OUTSIDE[f.metadata["valid"]]
    if ann == "tuple[float, float]":
        lo, hi = f.default
        bad += [(hi, lo), (lo,), (lo, "x")]
    for value in bad:
        with pytest.raises(OptionError, match=rf"^{cls.__name__}\.{f.name} ") as e:
            cls(**{f.name: value})
        assert "\n" not in str(e.value), value
    cls(**{f.name: f.default})  # the default itself is valid


def test_the_valid_values_are_normalised_and_equal():
    assert AVSPOConfig(alpha=1) == AVSPOConfig(alpha=1.0) and isinstance(AVSPOConfig(alpha=1).alpha, float)
    assert ACRConfig(tau_bounds=[0.1, 0.9]) == ACRConfig() and MonitorConfig(stop_on_alarm=["any"]).stop_on_alarm == (
        "any",
    )
    # the range ends that mean something are accepted
    ACRConfig(ema_decay=0.0, eta=0.0, tau_bounds=(0.0, 1.0), tau_init=1.0, stall_patience=0, volatility_window=2)
    AVSPOConfig(r_anchor=1.0, num_virtual=1, eps=0.0, seed=0)
    GRESOConfig(p_easy=0.05, p_hard=0.95, audit=1.0, min_keep=0.0, delta=0.0)


def test_a_registered_virtual_strategy_becomes_a_valid_choice():
    from avspo_openrlhf.algo import VIRTUAL_STRATEGIES, register_virtual_strategy
    from avspo_openrlhf.algo.options import STRATEGY_CHOICES

    name = "test_mid_only"
    with pytest.raises(OptionError, match="strategy must be one of"):
        AVSPOConfig(strategy=name)
    try:
        register_virtual_strategy(name)(VIRTUAL_STRATEGIES["fixed_partial"].fn)
        assert AVSPOConfig(strategy=name).strategy == name
    finally:
        VIRTUAL_STRATEGIES.pop(name, None)
        if name in STRATEGY_CHOICES:
            STRATEGY_CHOICES.remove(name)


# ── unscored completions (docs/algorithm.md#unscored) ────────────────────────────────────────


def test_unscored_completions_are_left_out_of_their_group():
    nan = float("nan")
    r = torch.tensor([[nan, 0, 0, 0], [1, 0, 1, nan], [nan] * 4, [1, 1, 0.7, 1], [0.5, nan, nan, nan]])
    scored = ~torch.isnan(r)
    scored[3, 2] = False  # a value there is not read either
    s = collapse_stats(r, scored=scored)
    # group 0: all-wrong on its 3 scored; 1: mixed; 2: no score (not measured); 3: all-right on 3; 4: one scored, 0.5
    assert s.collapsed.tolist() == [True, False, False, True, True]
    assert (s.num_all_wrong, s.num_all_right, s.num_measured, s.num_unscored, s.num_unscored_groups) == (1, 1, 4, 10, 1)
    assert (s.acr, s.acr_all_wrong, s.acr_all_right, s.acr_other) == (0.75, 0.25, 0.25, 0.25)
    assert s.acr_unscored == 10 / 20 and s.metrics()["acr_unscored"] == 0.5
    assert s.group_std[1].item() == pytest.approx(math.sqrt(2 / 9)) and s.mean[1].item() == pytest.approx(2 / 3)
    assert torch.isnan(s.mean[2]) and s.group_std[2] == 0
    with pytest.raises(ValueError, match="non-finite scored value"):
        collapse_stats(r, scored=torch.ones_like(scored))
    with pytest.raises(ValueError, match="bool mask"):
        collapse_stats(r, scored=scored.float())
    nothing = collapse_stats(r[2:3], scored=scored[2:3])  # no score at all: every rate 0, unscored 1
    assert (nothing.acr, nothing.acr_all_wrong, nothing.acr_unscored) == (0.0, 0.0, 1.0)


def test_the_scored_mask_equals_each_group_measured_alone():
    gen = torch.Generator().manual_seed(7)
    r = (torch.rand(300, 6, generator=gen) < 0.3).float()
    scored = torch.rand(300, 6, generator=gen) > 0.25
    r[~scored] = float("nan")
    s = collapse_stats(r, scored=scored)
    ref = [collapse_stats(r[i][scored[i]][None]) if scored[i].any() else None for i in range(300)]
    assert s.collapsed.tolist() == [x is not None and bool(x.collapsed[0]) for x in ref]
    assert s.all_wrong.tolist() == [x is not None and bool(x.all_wrong[0]) for x in ref]
    assert s.all_right.tolist() == [x is not None and bool(x.all_right[0]) for x in ref]
    full = collapse_stats(torch.nan_to_num(r), scored=torch.ones_like(scored))  # an all-True mask: the plain path
    plain = collapse_stats(torch.nan_to_num(r))
    assert torch.equal(full.collapsed, plain.collapsed) and full.metrics() == plain.metrics()


def test_the_controller_measures_scored_completions_and_leaves_unscored_groups_to_the_trainer():
    nan = float("nan")
    r = torch.tensor([[nan, 0, 0, 0], [1.0, 0, 1, 0]])  # an all-wrong group with an unscored completion
    c = CollapseController("avspo", acr=ACRConfig(window=1, tau_init=0.1))
    adv, m = c.step(r, scored=~torch.isnan(r))
    assert m["acr"] == m["acr_all_wrong"] == 0.5 and m["acr_unscored"] == 1 / 8 and m["acr_gate"] == 0.5
    assert m["acr_effective"] == 0.5  # the all-wrong group keeps the trainer's (zero) advantages
    assert torch.isnan(adv[0]).all() and torch.equal(adv[1], torch.tensor([1.0, -1, 1, -1]) * 0.5 / (0.5 + 1e-6))
    assert m["reward_raw_mean"] == pytest.approx(2 / 7)
    every = torch.full((2, 4), nan)  # a step without a single score still logs every view
    _, m = c.step(every, scored=torch.zeros(2, 4, dtype=torch.bool))
    assert (m["acr"], m["acr_all_wrong"], m["acr_unscored"]) == (0.0, 0.0, 1.0) and c.steps == 2


def test_components_take_their_config_object():
    from avspo_openrlhf.algo import GRESOSelector

    for build, message in [
        (
            lambda: CollapseController("avspo", acr={"window": 1}),
            r"acr must be a config object ACRConfig\(...\), got dict",
        ),
        (
            lambda: CollapseController(monitor={"kl_bound": 0.1}),
            r"monitor must be a config object MonitorConfig\(...\), got dict",
        ),
        (lambda: ACRTracker({"window": 3}), r"config must be a config object ACRConfig\(...\), got dict"),
        (lambda: AdaptiveThreshold(0.5), r"config must be a config object ACRConfig\(...\), got float"),
        (
            lambda: GRESOSelector(GRESOConfig(), acr=GRESOConfig()),
            r"acr must be a config object ACRConfig\(...\), got GRESOConfig",
        ),
    ]:
        with pytest.raises(TypeError, match=message):
            build()
    c = CollapseController("avspo", acr=ACRConfig(window=3, tau_init=0.2, eta=0.5))
    assert c.tracker.recent.maxlen == 3 and (c.threshold.tau, c.threshold.eta) == (0.2, 0.5)
