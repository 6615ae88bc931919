"""The remedies AVSPO is ranked against (docs/algorithm.md#remedies): NGRPO, GRESO and RL-ZVP in
closed form, their state, their flags, and each one run through `avspo-train --backend cpu`."""

from __future__ import annotations

import math
import shutil
import sys

import pytest
import torch
from helpers import tiny_assets
from test_preflight import GOOD, _fails, _flags, _rows

from avspo_openrlhf.algo import (
    CollapseController,
    GRESOConfig,
    GRESOSelector,
    GroupNormConfig,
    NGRPOConfig,
    SignConfig,
    group_advantages,
    prompt_key,
    rl_zvp_token_advantages,
    zero_variance_sign,
)
from avspo_openrlhf.cli.train import main, run
from avspo_openrlhf.trainer.samples import StateWithExtras

G = 8


def _group(k: int, g: int = G) -> list[float]:
    return [1.0] * k + [0.0] * (g - k)


# ── NGRPO ──


def test_ngrpo_closed_forms():
    rewards = torch.tensor([_group(k) for k in (0, 1, 4, 7, 8)])
    adv, info = group_advantages(rewards, "ngrpo", NGRPOConfig(std_convention="unbiased", eps=1e-6))
    # all-right: R' is constant at r_max, nothing to learn: exactly zero, and still collapsed
    assert adv[4].eq(0).all() and info["acr_effective"] == pytest.approx(1 / 5)
    # all-wrong: every sample -1/sqrt(G+1) (mean' = 1/9, unbiased std over 9 values = 1/3)
    assert adv[0] == pytest.approx(torch.full((G,), -1 / math.sqrt(G + 1)), abs=1e-5)
    # mixed, the values REMEDIES.md quotes for G=8 (a published worked example): k=1, 4, 7
    for row, (pos, neg) in zip((1, 2, 3), [(1.764, -0.504), (0.843, -1.054), (0.333, -2.667)]):
        assert adv[row, 0].item() == pytest.approx(pos, abs=1e-3) and adv[row, -1].item() == pytest.approx(
            neg, abs=1e-3
        )
    # every group: the equation itself, mean and unbiased std over the G real rewards plus m r_max
    for m in (1, 3):
        adv_m, _ = group_advantages(rewards, "ngrpo", NGRPOConfig(std_convention="unbiased", eps=1e-6, num_max=m))
        for r, a in zip(rewards, adv_m):
            aug = torch.cat([r, torch.ones(m)])
            if aug.std() < 1e-6:
                assert a.eq(0).all()
            else:
                assert a == pytest.approx((r - aug.mean()) / (aug.std() + 1e-6), abs=1e-5)
    # population std over G+1 values: all-wrong -1/sqrt(G) instead
    adv_pop, _ = group_advantages(rewards[:1], "ngrpo", NGRPOConfig(std_convention="population", eps=0.0))
    assert adv_pop[0, 0].item() == pytest.approx(-1 / math.sqrt(G), abs=1e-6)
    # non-binary rewards: the virtual sample sits at the range maximum
    r = torch.tensor([[0.2, 0.2, 0.2, 0.2]])
    a, _ = group_advantages(r, "ngrpo", NGRPOConfig(std_convention="unbiased", eps=0.0), reward_range=(0.0, 2.0))
    aug = torch.tensor([0.2, 0.2, 0.2, 0.2, 2.0])
    assert a[0] == pytest.approx((r[0] - aug.mean()) / aug.std(), abs=1e-6)


def test_ngrpo_gated_is_grpo_while_the_gate_is_closed_and_the_controller_runs_it():
    rewards = torch.tensor([_group(k) for k in (0, 3, 8)])
    closed, info = group_advantages(
        rewards, "ngrpo", NGRPOConfig(std_convention="unbiased", eps=1e-6, gated=True), acr_gate=0.2, tau_adapt=0.5
    )
    grpo, _ = group_advantages(rewards, "grpo", GroupNormConfig(std_convention="unbiased", eps=1e-6))
    assert torch.equal(closed, grpo) and not info["gate_open"]
    opened, info = group_advantages(
        rewards, "ngrpo", NGRPOConfig(std_convention="unbiased", eps=1e-6, gated=True), acr_gate=0.7, tau_adapt=0.5
    )
    assert info["gate_open"] and (opened[0] < 0).all()

    c = CollapseController("ngrpo")
    adv, m = c.step(rewards)
    assert adv is not None and (adv[0] < 0).all() and adv[2].eq(0).all()
    assert m["gate_open"] == 1.0 and m["num_virtual_k"] == 1.0
    assert m["acr"] == pytest.approx(2 / 3) and m["acr_effective"] == pytest.approx(1 / 3)  # the all-right group
    with pytest.raises(ValueError, match="unknown estimator"):
        CollapseController("ppo")
    with pytest.raises(ValueError, match="num_max"):
        group_advantages(rewards, "ngrpo", NGRPOConfig(num_max=0))


# ── RL-ZVP ──


def test_rl_zvp_signs_and_entropy_scaling_on_a_hand_computed_group():
    rewards = torch.tensor([_group(0, 4), _group(4, 4), _group(2, 4), [0.5] * 4])
    assert zero_variance_sign(rewards).tolist() == [-1, 1, 0, -1]  # a constant below the maximum is negative

    h = torch.tensor([[0.5, 1.0, 2.0, 9.0], [0.5, 1.0, 2.0, 9.0], [0.5, 1.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]] * 3)  # the 9.0 is padding: neither used nor in the max
    sign = torch.tensor([1, -1, 0], dtype=torch.int8)
    a = rl_zvp_token_advantages(h, mask, sign, alpha=0.1)
    assert a[0].tolist() == pytest.approx([0.05, 0.1, 0.2, 0.0])  # +alpha * H_t
    assert a[1].tolist() == pytest.approx([-0.15, -0.1, 0.0, 0.0])  # -alpha * (max H - H_t); the max token 0
    assert a[2].eq(0).all()  # mixed groups keep GRPO's advantage: nothing added
    assert (a[0] >= 0).all() and (a[1] <= 0).all()
    with pytest.raises(ValueError, match="do not match"):
        rl_zvp_token_advantages(h, mask[:, :2], sign)
    with pytest.raises(ValueError, match="non-finite"):
        rl_zvp_token_advantages(torch.full((1, 2), float("nan")), torch.ones(1, 2), torch.tensor([1]))

    # the registered estimator: GRPO on mixed groups (OpenRLHF's unbiased std), zero on collapsed ones,
    # whose signal is the token part; none stays without signal
    c = CollapseController("rl_zvp")
    adv, m = c.step(rewards[:3])
    grpo, _ = group_advantages(rewards[:3], "grpo", GroupNormConfig(std_convention="unbiased", eps=1e-9))
    assert torch.equal(adv, grpo) and m["acr"] == pytest.approx(2 / 3) and m["acr_effective"] == 0.0
    assert c.needs_entropy and torch.equal(c.token_advantages(h, mask, sign), a * 1.0)
    assert not CollapseController("avspo").needs_entropy


# ── sign advantage ──


def test_sign_advantage_closed_form_on_collapsed_groups_and_grpo_elsewhere():
    rewards = torch.tensor([_group(0, 4), _group(4, 4), _group(1, 4), [0.5] * 4])
    adv, info = group_advantages(rewards, "sign")
    grpo, _ = group_advantages(rewards, "grpo")
    assert adv[0].tolist() == [-1.0] * 4 and adv[1].tolist() == [1.0] * 4  # A = 2r - 1
    assert torch.equal(adv[2], grpo[2])  # mixed: GRPO (population std, eps 1e-6)
    assert adv[3].eq(0).all()  # constant at the middle of the range: 2 * 0.5 - 1 = 0, still collapsed
    assert info["acr"] == 0.75 and info["acr_effective"] == 0.25
    # every group, and any reward range: A = 2 (r - lo) / (hi - lo) - 1
    every, info = group_advantages(rewards * 4 - 2, "sign", SignConfig(scope="all"), reward_range=(-2.0, 2.0))
    # the group at the middle of the range gets A = 0 there too: still collapsed, read from the advantages
    assert torch.allclose(every, 2 * rewards - 1) and info["acr_effective"] == 0.25
    # what AVSPO and NGRPO give a collapsed group has the same sign
    for name in ("avspo", "ngrpo"):
        a, _ = group_advantages(rewards[:1], name, acr_gate=1.0, tau_adapt=0.0)
        assert (a.sign() == adv[:1]).all()


# ── GRESO ──


def test_greso_never_skips_a_prompt_without_history():
    g = GRESOSelector(GRESOConfig(p_easy=0.05, p_hard=0.05), seed=0)
    keys = [prompt_key(f"q{i}") for i in range(200)]
    skip, audit = g.select(keys)
    assert not skip.any() and not audit.any() and g.skip_probability(keys).eq(0).all()
    g.observe(keys[:1], torch.tensor([_group(3)]))  # mixed: z = 0, still never skipped
    assert g.skip_probability(keys[:1]).item() == 0.0


def test_greso_skips_after_k_collapsed_rounds_with_the_stated_probability():
    p_easy, p_hard = 0.5, 0.3
    g = GRESOSelector(GRESOConfig(p_easy=p_easy, p_hard=p_hard, delta=0.0), seed=1)
    easy, hard = prompt_key("easy"), prompt_key("hard")
    for k in range(1, 9):
        g.observe([easy, hard], torch.tensor([_group(G), _group(0)]))
        prob = g.skip_probability([easy, hard])
        assert prob[0].item() == pytest.approx(1 - max(p_easy**k, 0.01))
        assert prob[1].item() == pytest.approx(1 - max(p_hard**k, 0.01))
    # the draws follow it: z = 2 all-wrong rounds at p_hard 0.3 -> skipped with probability 0.91
    g2 = GRESOSelector(GRESOConfig(p_hard=p_hard, delta=0.0), seed=2)
    keys = [prompt_key(f"h{i}") for i in range(4000)]
    for _ in range(2):
        g2.observe(keys, torch.zeros(len(keys), G))
    skip, _ = g2.select(keys)
    assert skip.float().mean().item() == pytest.approx(1 - p_hard**2, abs=0.015)
    # a skipped visit records nothing: z is frozen; a mixed round resets it
    g2.select(keys)
    assert g2.skip_probability(keys[:1]).item() == pytest.approx(1 - p_hard**2)
    g2.observe(keys[:1], torch.tensor([_group(1)]))
    assert g2.skip_probability(keys[:1]).item() == 0.0
    g2.observe(keys[:1], torch.tensor([_group(G)]))  # all-right now: z restarts at 1 with p_easy
    assert g2.skip_probability(keys[:1]).item() == pytest.approx(0.5)


def test_greso_adapts_p_toward_the_targets_only_once_prompts_come_back():
    g = GRESOSelector(
        GRESOConfig(p_easy=0.5, p_hard=0.5, target_easy=0.25, target_hard=0.25, delta=0.1, p_bounds=(0.3, 0.7))
    )
    first = [prompt_key(f"a{i}") for i in range(4)]
    g.observe(first, torch.tensor([_group(G), _group(G), _group(0), _group(3)]))
    assert g.p == {"easy": 0.5, "hard": 0.5}  # first visits only: nothing can have been skipped yet
    # revisited: all-right share 0.5 >= 0.25 -> skip easy more (p down); all-wrong share 0 -> p_hard up
    g.observe(first, torch.tensor([_group(G), _group(G), _group(2), _group(3)]))
    assert g.p["easy"] == pytest.approx(0.4) and g.p["hard"] == pytest.approx(0.6)
    for _ in range(5):
        g.observe(first, torch.tensor([_group(G), _group(G), _group(2), _group(3)]))
    assert g.p["easy"] == pytest.approx(0.3) and g.p["hard"] == pytest.approx(0.7)  # clipped to p_bounds


def test_greso_audit_counts_false_skips_and_the_state_round_trips():
    g = GRESOSelector(GRESOConfig(p_hard=0.05, delta=0.01, audit=0.5), seed=3)
    keys = [prompt_key(f"p{i}") for i in range(64)]
    g.observe(keys, torch.zeros(64, G))
    g.observe(keys, torch.zeros(64, G))
    skip, audit = g.select(keys)
    assert skip.any() and audit.any() and not (audit & ~skip).any()  # audited prompts are skipped ones
    assert g.record_audit(torch.tensor([_group(0), _group(2), _group(G)]), tokens=120) == 1  # only the mixed one
    m = g.metrics()
    assert m["greso/false_skips_cum"] == 1 and m["greso/audited_cum"] == int(audit.sum())
    assert m["greso/audit_tokens_cum"] == 120
    assert m["greso/skipped_cum"] + m["greso/kept_cum"] == 64

    restored = GRESOSelector(GRESOConfig(p_hard=0.05, delta=0.01, audit=0.5), seed=99)  # same options, another seed
    restored.load_state_dict(g.state_dict())
    assert restored.metrics() == pytest.approx(g.metrics(), nan_ok=True)  # audit tokens included
    old = g.state_dict()  # a checkpoint written before the audit-token counter existed
    del old["counts"]["audit_tokens"]
    legacy = GRESOSelector(GRESOConfig(p_hard=0.05, delta=0.01, audit=0.5))
    legacy.load_state_dict(old)
    assert legacy.metrics()["greso/audit_tokens_cum"] == 0
    for _ in range(3):  # the same future: history, p and the random generator all came back
        a, b = g.select(keys), restored.select(keys)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        g.observe(keys[:5], torch.ones(5, G))
        restored.observe(keys[:5], torch.ones(5, G))
    assert torch.equal(g.skip_probability(keys), restored.skip_probability(keys))
    with pytest.raises(ValueError, match="p_easy"):
        GRESOSelector(GRESOConfig(p_easy=0.99))


def test_the_dataloader_state_carries_the_greso_state():
    class Loader:
        def __init__(self):
            self.pos = 0

        def state_dict(self):
            return {"pos": self.pos}

        def load_state_dict(self, s):
            assert set(s) == {"pos"}  # our extras never reach the real dataloader
            self.pos = s["pos"]

        def __iter__(self):
            return iter(range(3))

        def __len__(self):
            return 3

    g = GRESOSelector(seed=0)
    g.observe([prompt_key("x")], torch.zeros(1, G))
    loader = Loader()
    loader.pos = 7
    wrapped = StateWithExtras(loader, {"greso": g})
    state = wrapped.state_dict()
    fresh_g, fresh = GRESOSelector(seed=5), Loader()
    StateWithExtras(fresh, {"greso": fresh_g}).load_state_dict(state)
    assert fresh.pos == 7 and fresh_g.state_dict() == g.state_dict()
    assert len(wrapped) == 3 and list(wrapped) == [0, 1, 2] and wrapped.pos == 7
    # a dataloader state written before the rename (key "_avspo_extras") restores the same
    legacy = {("_avspo_extras" if k == StateWithExtras.KEY else k): v for k, v in state.items()}
    old_g, old_loader = GRESOSelector(seed=5), Loader()
    StateWithExtras(old_loader, {"greso": old_g}).load_state_dict(legacy)
    assert old_loader.pos == 7 and old_g.state_dict() == g.state_dict()


# ── flags ──


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--remedy", "avspo", "--ngrpo.num_max", "2"],
            "--ngrpo.num_max is an option of --remedy ngrpo, but --remedy is avspo: drop it, or choose --remedy ngrpo",
        ),
        (
            ["--remedy", "ngrpo", "--avspo.alpha", "0.5"],
            "--avspo.alpha is an option of --remedy avspo, but --remedy is ngrpo",
        ),
        (["--sign.scope", "all"], "--sign.scope is an option of --remedy sign, but --remedy is none"),
        (["--remedy", "avpso"], "argument --remedy: invalid choice: 'avpso'"),
        (["--avspo.enable"], "--avspo.enable was replaced by --remedy avspo"),
        (
            ["--remedy", "ngrpo", "--algo.advantage.estimator", "rloo"],
            "--remedy ngrpo needs --algo.advantage.estimator group_norm",
        ),
        (["--remedy", "rl_zvp", "--rl_zvp.alpha", "0"], "--rl_zvp.alpha must be > 0"),
        (["--remedy", "ngrpo", "--ngrpo.num_max", "0"], "--ngrpo.num_max must be >= 1, got 0"),
        (["--remedy", "sign", "--sign.eps", "-1"], "--sign.eps must be >= 0"),
        (
            ["--monitor.stop_on_alarm", "kl_drift"],
            "--monitor.stop_on_alarm names kl_drift, which needs --monitor.kl_bound (the KL-drift alarm is off)",
        ),
        (
            ["--greso.enable", "--greso.p_easy", "0.99"],
            "--greso.p_easy must lie within --greso.p_bounds [0.05, 0.95], got 0.99",
        ),
        (["--greso.enable", "--greso.audit", "2"], "--greso.audit must be in [0, 1], got 2.0"),
        (["--run.max_generated_tokens", "0"], "--run.max_generated_tokens must be >= 1"),
        (["--remedy", "avspo", "--avspo.alpha", "-1"], "--avspo.alpha must be > 0, got -1.0"),
        (["--acr.tau_init", "2"], "--acr.tau_init must be in [0, 1], got 2.0"),
        (["--acr.tau_init", "0.95"], "--acr.tau_init must lie within --acr.tau_bounds [0.1, 0.9], got 0.95"),
        (["--acr.window", "0"], "--acr.window must be >= 1, got 0"),
        (["--acr.reward_range", "1", "0"], "--acr.reward_range needs LO < HI, got 1.0 0.0"),
        (
            ["--remedy", "avspo", "--avspo.num_virtual", "2", "--avspo.strategy", "opposite"],
            "--avspo.num_virtual cannot be combined with --avspo.strategy opposite",
        ),
        (["--monitor.kl_bound", "-0.1"], "--monitor.kl_bound must be >= 0, got -0.1"),
        (["--buffer.max_staleness", "-1"], "--buffer.max_staleness must be >= 0, got -1"),
    ],
)
def test_remedy_flags_fail_in_one_line_before_ray(tmp_path, capsys, extra, message):
    flags = _flags(tmp_path, _rows(tmp_path, GOOD))
    if "--algo.advantage.estimator" in extra:
        i = flags.index("--algo.advantage.estimator")
        flags = flags[:i] + flags[i + 2 :]
    assert message in _fails(capsys, [*flags, *extra])


def test_only_the_chosen_remedys_options_are_read_and_its_defaults_fill_the_rest(tmp_path, capsys):
    """One way to choose: ``--remedy``; another remedy's option is refused (not ignored), even at a
    valid value; the chosen remedy's config has its defaults where no flag was given."""
    from avspo_openrlhf.algo import NGRPOConfig
    from avspo_openrlhf.trainer.run_settings import controller_from_flags

    flags = _flags(tmp_path, _rows(tmp_path, GOOD))
    assert "--avspo.alpha is an option of --remedy avspo" in _fails(
        capsys, [*flags, "--remedy", "ngrpo", "--avspo.alpha", "0.5"]
    )
    controller = controller_from_flags(run([*flags, "--remedy", "ngrpo", "--ngrpo.num_max", "2"], dry_run=True))
    assert controller.estimator == "ngrpo" and controller.config == NGRPOConfig(num_max=2)
    assert controller_from_flags(run(flags, dry_run=True)).estimator is None  # --remedy none: OpenRLHF's own


def test_every_old_flag_spelling_fails_in_one_line_naming_the_new_one(tmp_path, capsys):
    from avspo_openrlhf.trainer.parser import renamed_flags

    flags = _flags(tmp_path, _rows(tmp_path, GOOD))
    old_switches = {f"--{r}.enable" for r in ("avspo", "ngrpo", "rl_zvp", "sign")}
    assert old_switches <= set(renamed_flags())  # the switches before --remedy
    for old, new in renamed_flags().items():
        with pytest.raises(SystemExit) as e:
            main([*flags, old, "0.3"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err == [f"avspo-train: error: {old} was replaced by {new}"]
    # and from a config file (@file) as well
    (tmp_path / "old.args").write_text("--rlzvp.enable\n--avspo.enable\n")
    with pytest.raises(SystemExit):
        main([*flags, f"@{tmp_path / 'old.args'}"])
    assert capsys.readouterr().err.strip() == "avspo-train: error: --rlzvp.enable was replaced by --remedy rl_zvp"


# ── through avspo-train --backend cpu (tiny model) ──


@pytest.fixture(scope="module")
def cpu_run():
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    import test_cpu_pipeline as pipeline

    return pipeline


def _remedy_flags(pipeline, assets, out, *extra):
    flags = pipeline._flags(assets, out, *extra)
    i = flags.index("--remedy")
    return flags[:i] + flags[i + 2 :]


@pytest.mark.slow
def test_ngrpo_and_rl_zvp_train_through_avspo_train(cpu_run, tmp_path_factory):
    """Each remedy's own metrics through a whole avspo-train run. The two runs carry two pipeline
    checks that need a run and no flag of their own (test_cpu_pipeline.py's helpers): NGRPO's is
    stopped by SIGTERM at its last step and tells the truth about it; RL-ZVP's joins a launcher's
    Ray cluster (RAY_ADDRESS) and finishes there."""
    from avspo_openrlhf.cpu.models import model_is_complete
    from avspo_openrlhf.report import read_metrics

    assets = _assets(tmp_path_factory)
    out = tmp_path_factory.mktemp("ngrpo")
    flags = _remedy_flags(cpu_run, assets, out, "--remedy", "ngrpo", "--actor.eps_clip_low_high", "0.16", "0.24")
    cpu_run.train_with_sigterm_at_the_last_step([*flags, "--ckpt.save_steps", "100"], out, 8)
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    assert len(rows) == 8 and all(r["gate_open"] == 1.0 and r["num_virtual_k"] == 1.0 for r in rows)
    # only all-right groups stay collapsed under NGRPO
    assert all(r["acr_effective"] == pytest.approx(r["acr_shaped_all_right"]) for r in rows)
    assert any(r["acr_all_wrong"] > 0 for r in rows)
    assert all(r["tokens/generated"] > 0 for r in rows)

    out = tmp_path_factory.mktemp("rl_zvp")
    with cpu_run.joined_ray_cluster() as env:
        log = cpu_run._train(_remedy_flags(cpu_run, assets, out, "--remedy", "rl_zvp"), env=env)
    assert f"joined the Ray cluster at {env['RAY_ADDRESS']}" in log
    assert model_is_complete(str(out / "final"))
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(r["acr_effective"] == 0.0 for r in rows)
    n_samples = 16  # 4 prompts x G=4 per step
    for r in rows:  # token advantages reached exactly the zero-variance groups' responses
        assert r["rl_zvp/zero_variance_samples"] == pytest.approx(r["acr_shaped"] * n_samples)
        assert (r["rl_zvp/token_adv_abs_mean"] > 0) == (r["acr_shaped"] > 0)
        if r["acr_shaped"] > 0:
            assert 0 < r["rl_zvp/entropy_mean"] < math.log(200_000)


def _assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("remedies"))


@pytest.mark.slow
def test_greso_with_avspo_skips_stops_at_the_token_budget_and_resumes_its_history(cpu_run, tmp_path_factory):
    from avspo_openrlhf.report import read_metrics

    assets = _assets(tmp_path_factory)
    out = tmp_path_factory.mktemp("greso")
    common = ["--greso.enable", "--greso.audit", "1.0", "--greso.p_hard", "0.05", "--greso.p_easy", "0.05",
              "--train.num_episodes", "6", "--ckpt.load_enable", "--remedy", "avspo"]  # fmt: skip
    # part 1: 10 steps (two passes over the 32 prompts at 4 per step, and two more steps)
    cpu_run._train(_remedy_flags(cpu_run, assets, out, *common, "--run.max_steps", "10"))
    first, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    assert [r["step"] for r in first] == list(range(1, 11))
    # (resumed at --run.max_steps 10 it would train no step: test_openrlhf_integration.py, in-process)
    # part 2: the same run resumed (its checkpoint of step 10) until its tokens reach a budget
    budget = int(first[-1]["tokens/generated_cum"] + 1200)
    shutil.rmtree(out / "final")
    log = cpu_run._train(_remedy_flags(cpu_run, assets, out, *common, "--run.max_generated_tokens", str(budget)))
    assert "restored ACR/threshold state" in log
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    resumed = [r for r in rows if r["step"] > 10]
    assert resumed, "the resumed run trained no step"
    # its global step restored: it goes on from step 11, each step logged once
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    # GRESO's history and counters continued (a fresh selector would restart its counts at 0)
    assert resumed[0]["greso/kept_cum"] > first[-1]["greso/kept_cum"]
    assert resumed[0]["greso/prompts_tracked"] >= first[-1]["greso/prompts_tracked"]
    # the token budget: the run stops at the first step that reaches it
    tokens = [r["tokens/generated_cum"] for r in rows]
    assert tokens == sorted(tokens) and tokens[-1] >= budget > tokens[-2]
    # with p = 0.05 every prompt collapsed twice is skipped ~95 % of the time: skips happened, and with
    # --greso.audit 1 each was audited (at 0.5, two skips went unaudited a quarter of the time)
    last = rows[-1]
    assert last["greso/skipped_cum"] > 0 and last["greso/audited_cum"] == last["greso/skipped_cum"]
    assert 0 <= last["greso/false_skips_cum"] <= last["greso/audited_cum"]
    assert last["greso/audit_tokens_cum"] > 0
    assert (out / "final" / "config.json").exists()


def test_the_typed_settings_are_built_once_and_a_plugin_imported_once_per_process(tmp_path, monkeypatch):
    """``--avspo.alpha`` becomes typed once: every reader of the run's flags in this process (the
    validation, the trainer, the experience maker's controller) gets the one frozen object, and a
    ``--plugin`` module runs once however often the flags are read."""
    import builtins

    from avspo_openrlhf.trainer.run_settings import controller_from_flags, settings

    plugin = tmp_path / "counted_plugin.py"
    plugin.write_text("import builtins\nbuiltins.AVSPO_TEST_IMPORTS = getattr(builtins, 'AVSPO_TEST_IMPORTS', 0) + 1\n")
    monkeypatch.setattr(builtins, "AVSPO_TEST_IMPORTS", 0, raising=False)
    monkeypatch.delitem(sys.modules, "counted_plugin", raising=False)
    flags = [
        *_flags(tmp_path, _rows(tmp_path, GOOD)),
        "--plugin",
        str(plugin),
        *"--remedy avspo --avspo.alpha 0.3".split(),
    ]
    args = run(flags, dry_run=True)
    first = settings(args)
    assert settings(args) is first and first.remedy_config.alpha == 0.3
    assert controller_from_flags(args).config is first.remedy_config  # the controller reads that object
    assert builtins.AVSPO_TEST_IMPORTS == 1
    args.avspo.alpha = 0.4  # other values are other settings, built once too
    assert settings(args).remedy_config.alpha == 0.4 and settings(args) is settings(args) is not first
    sys.modules.pop("counted_plugin", None)


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_check_config_only_reads_the_args(tmp_path, backend):
    """``args`` are written once, while parsed (``complete_args``: the remedy's every option, the CPU
    backend's settings, the entropy for the monitor); ``check_config`` and OpenRLHF's checks after it
    leave them as they are, and the typed settings are the ones built then."""
    import copy
    from types import SimpleNamespace

    from avspo_openrlhf.cli.train import _to_dict, check_config
    from avspo_openrlhf.trainer.run_settings import settings

    flags = [*_flags(tmp_path, _rows(tmp_path, GOOD)), *f"--remedy avspo --avspo.alpha 0.3 --backend {backend}".split()]
    args = run(flags, dry_run=True)
    built = settings(args)
    assert vars(args.avspo)["alpha"] == 0.3 and "strategy" in vars(args.avspo)  # every option, written once
    assert args.actor.entropy_coef == 0.0  # the monitor's entropy, asked of OpenRLHF while parsing
    before = copy.deepcopy(_to_dict(args))

    class ReadOnly(SimpleNamespace):
        def __setattr__(self, name, value):
            raise AssertionError(f"check_config wrote {name} = {value!r}")

    def read_only(ns):
        if not isinstance(ns, SimpleNamespace):
            return ns
        out = ReadOnly()
        out.__dict__.update({k: read_only(v) for k, v in vars(ns).items()})
        return out

    frozen = read_only(args)
    check_config(frozen)  # any write raises
    assert _to_dict(frozen) == before
    assert settings(frozen) is built


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
