"""verl's own ``compute_advantage`` (verl 0.9.1, installed without its pins beside transformers 5.19:
requirements-verl.txt) dispatching to the ``acr_*`` estimators of avspo_openrlhf/integrations/verl.py:
the closed forms on a DataProto (``acr_avspo`` with each of its strategies), a closed gate is verl's
``grpo`` bit for bit, one controller per run, both plugin loading paths, and the verl names the plugin
relies on."""

import importlib.metadata as md
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    md.version("verl")
except md.PackageNotFoundError:
    pytest.skip(
        "verl is not installed: pip install --no-deps -r requirements-verl.txt (setup.sh does)", allow_module_level=True
    )

from helpers import undocumented_metrics  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from avspo_openrlhf.algo import ESTIMATORS, AVSPOConfig, group_advantages, num_virtual  # noqa: E402
from avspo_openrlhf.algo.options import STRATEGIES  # noqa: E402
from avspo_openrlhf.integrations import verl as plugin  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REWARDS = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, 1]])  # ACR 0.5
OPTIONS = {"ngrpo": {"num_max": 2}, "sign": {"scope": "all"}}
OPTIONS |= {f"avspo-{s}": {"alpha": 1.0, "strategy": s} for s in STRATEGIES}  # algorithm.avspo.strategy=<s>
# every estimator once, acr_avspo once per virtual-reward strategy ("avspo-<strategy>")
CASES = [r for r in plugin.REMEDIES if r != "avspo"] + [f"avspo-{s}" for s in STRATEGIES]


def data(rewards: torch.Tensor, seed: int = 0):
    """A DataProto as verl's trainer hands it over: the groups' rows interleaved, responses of several
    lengths, each outcome reward on its response's last token. Returns it and ``perm`` (row r holds
    sample ``perm[r]`` of ``rewards.reshape(-1)``)."""
    n, g = rewards.shape
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n * g, generator=gen)
    lengths = torch.randint(1, 7, (n * g,), generator=gen)
    mask = (torch.arange(6) < lengths[:, None]).float()
    scores = torch.zeros(n * g, 6)
    scores[torch.arange(n * g), lengths - 1] = rewards.reshape(-1)[perm]
    uid = np.array([f"prompt-{int(i) // g}" for i in perm], dtype=object)
    return DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask}, non_tensors={"uid": uid}
    ), perm


def algorithm(estimator: str, **sections):
    return OmegaConf.create(
        {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0, **sections}
    )


def advantages(cfg, rewards=REWARDS, seed=0):
    batch, perm = data(rewards, seed)
    # verl's trainer passes algorithm.norm_adv_by_std_in_grpo on its own as well as the config
    out = compute_advantage(
        batch,
        adv_estimator=cfg.adv_estimator,
        config=cfg,
        norm_adv_by_std_in_grpo=cfg.get("norm_adv_by_std_in_grpo", True),
    )
    return out.batch["advantages"], out.batch["returns"], out.batch["response_mask"], perm


def closed_form(remedy: str, options: dict, tau: float) -> torch.Tensor:
    cls = ESTIMATORS[remedy].config
    cfg = (
        cls(**{**options, **{k: v for k, v in (("std_convention", "unbiased"), ("eps", 1e-6)) if hasattr(cls, k)}})
        if cls
        else None
    )
    # the run's generator: algorithm.acr.seed, 0 by default (AVSPO's random_uniform draws from it)
    adv, _ = group_advantages(REWARDS, remedy, cfg, tau_adapt=tau, generator=torch.Generator().manual_seed(0))
    return adv


@pytest.mark.parametrize("case", CASES)
def test_compute_advantage_gives_the_closed_forms(case):
    remedy, options = case.partition("-")[0], OPTIONS.get(case, {})
    cfg = algorithm(plugin.PREFIX + remedy, acr={"tau_init": 0.3}, **({remedy: options} if options else {}))
    adv, returns, mask, perm = advantages(cfg)
    expected = closed_form(remedy, options, 0.3).reshape(-1)[perm]
    assert torch.allclose(adv, expected[:, None] * mask, atol=1e-6) and torch.equal(adv, returns)
    if options:  # the options came from algorithm.<remedy>: the defaults give other numbers
        assert not torch.allclose(expected, closed_form(remedy, {}, 0.3).reshape(-1)[perm], atol=1e-3)
    if remedy in ("avspo", "ngrpo", "sign"):  # collapsed groups got the remedy's non-zero advantages
        assert (adv.abs().sum(dim=1) > 0).sum() > 8  # more rows than the two mixed groups' 8
    m = plugin.acr_metrics(cfg)
    assert m["acr"] == 0.5 and m["acr/all_right"] == 0.25 and m["acr/all_wrong"] == 0.25
    assert not undocumented_metrics(m), (
        f"docs/metrics.md does not list these names verl logs: {undocumented_metrics(m)}"
    )
    if remedy == "avspo":  # the strategy reached the run's controller: its K (opposite: one virtual sample)
        assert plugin.controller_of(cfg).config.strategy == options["strategy"] and m["acr/gate_open"] == 1.0
        assert m["acr/num_virtual_k"] == num_virtual(4, 0.5, 1.0, options["strategy"])
    assert m["acr/remedy_groups"] == {"grpo": 0.0, "dr_grpo": 0.5, "avspo": 0.5, "ngrpo": 0.75, "sign": 1.0}[remedy]


@pytest.mark.parametrize("estimator,tau", [("acr_avspo", 0.9), ("acr_ngrpo", 0.9), ("acr_grpo", 0.3)])
def test_a_closed_gate_is_verls_grpo_bit_for_bit(estimator, tau):
    sections = {"ngrpo": {"gated": True}} if estimator == "acr_ngrpo" else {}
    cfg = algorithm(estimator, acr={"tau_init": tau}, **sections)
    ours, ours_returns, _, _ = advantages(cfg)
    theirs, theirs_returns, _, _ = advantages(algorithm("grpo"))
    assert torch.equal(ours, theirs) and torch.equal(ours_returns, theirs_returns)
    assert plugin.acr_metrics(cfg).get("acr/gate_open", 0.0) == 0.0 and plugin.acr_metrics(cfg)["acr"] == 0.5


def test_one_controller_per_run_keeps_the_window_and_threshold():
    cfg = algorithm("acr_avspo", acr={"window": 2, "tau_init": 0.6, "seed": 3})
    advantages(cfg, torch.ones(4, 4))  # ACR 1: the gate opens
    advantages(cfg)  # ACR 0.5 alone would keep it shut; the window's mean 0.75 keeps it open
    m = plugin.acr_metrics(cfg)
    assert plugin.controller_of(cfg).state_dict()["steps"] == 2 and m["acr/gate"] == 0.75 and m["acr/gate_open"] == 1.0
    other = algorithm("acr_avspo", acr={"window": 2, "tau_init": 0.6})
    advantages(other)  # a new run: its own window
    assert plugin.controller_of(other).state_dict()["steps"] == 1 and plugin.acr_metrics(other)["acr/gate_open"] == 0.0
    assert plugin.controller_of(cfg).state_dict()["steps"] == 2 and plugin.controller_of() is plugin.controller_of(
        other
    )


def test_random_uniform_draws_on_across_one_runs_calls_from_its_seed():
    """``acr_avspo`` with ``strategy random_uniform`` and ``algorithm.acr.seed 7``: three calls of one run
    give what one controller seeded 7 gives over three steps (its generator carried from call to call),
    not three first draws."""
    from avspo_openrlhf.algo import ACRConfig, AVSPOConfig, CollapseController

    options = {"strategy": "random_uniform", "alpha": 1.0}
    cfg = algorithm("acr_avspo", acr={"tau_init": 0.3, "window": 1, "seed": 7}, avspo=options)
    ref = CollapseController(
        "avspo",
        AVSPOConfig(**options, std_convention="unbiased", eps=1e-6),
        acr=ACRConfig(tau_init=0.3, window=1),
        seed=7,
    )
    got = []
    for call in range(3):
        adv, _, mask, perm = advantages(cfg, seed=call)
        expected, _ = ref.step(REWARDS)
        assert torch.allclose(adv, expected.reshape(-1)[perm][:, None] * mask, atol=1e-6), call
        got.append(expected)
    assert not torch.allclose(got[0], got[1], atol=1e-4)  # the second call drew new virtual rewards


def test_dr_grpo_without_std_division_is_verls_own():
    """``acr_dr_grpo`` accepts ``norm_adv_by_std_in_grpo=False`` (the other estimators divide by the std
    and refuse it): it then equals verl's ``grpo`` with the same setting, r minus the group mean."""
    cfg = OmegaConf.merge(algorithm("acr_dr_grpo"), {"norm_adv_by_std_in_grpo": False})
    theirs_cfg = OmegaConf.merge(algorithm("grpo"), {"norm_adv_by_std_in_grpo": False})
    ours, _, mask, perm = advantages(cfg)
    theirs, _, _, _ = advantages(theirs_cfg)
    centred = (REWARDS - REWARDS.mean(dim=1, keepdim=True)).reshape(-1)[perm]
    assert torch.equal(ours, theirs) and torch.allclose(ours, centred[:, None] * mask, atol=1e-7)
    assert plugin.acr_metrics(cfg)["acr/remedy_groups"] == 0.0


def test_bad_setups_fail_in_one_line():
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        advantages(OmegaConf.merge(algorithm("acr_avspo"), {"norm_adv_by_std_in_grpo": False}))
    with pytest.raises(ValueError, match="one size G >= 2"):
        batch, _ = data(REWARDS)
        batch.non_tensor_batch["uid"][0] = "a-prompt-alone"
        compute_advantage(batch, adv_estimator="acr_sign", config=algorithm("acr_sign"))


# a mistake in an option section -> the one line that refuses it at the run's first use (before any
# advantage is computed), naming the option as the verl user set it
SECTION_MISTAKES = [
    ("acr_avspo", {"avspo": {"alpha": -1}}, "algorithm.avspo.alpha must be > 0, got -1"),
    (
        "acr_avspo",
        {"avspo": {"strategy": "bogus"}},
        "algorithm.avspo.strategy must be one of exp_decay, fixed_partial, opposite, random_uniform, stratified, got 'bogus'",
    ),
    ("acr_avspo", {"avspo": {"alpah": 1.0}}, "algorithm.avspo has no option 'alpah'; AVSPOConfig takes alpha, "),
    (
        "acr_avspo",
        {"avspo": {"eps": 1e-3}},
        "algorithm.avspo.eps cannot be set: it follows the framework's GRPO (eps=1e-06), got 0.001",
    ),
    (
        "acr_avspo",
        {"avspo": {"num_virtual": 2, "strategy": "opposite"}},
        "algorithm.avspo.num_virtual cannot be combined with algorithm.avspo.strategy opposite",
    ),
    ("acr_grpo", {"acr": {"tau_init": 2}}, "algorithm.acr.tau_init must be in [0, 1], got 2"),
    ("acr_grpo", {"acr": {"window": 0}}, "algorithm.acr.window must be >= 1, got 0"),
    (
        "acr_grpo",
        {"acr": {"tau_bounds": [0.6, 0.9]}},
        "algorithm.acr.tau_init must lie within algorithm.acr.tau_bounds [0.6, 0.9], got 0.5",
    ),
    ("acr_grpo", {"acr": {"windw": 3}}, "algorithm.acr has no option 'windw'"),
    ("acr_grpo", {"acr": {"seed": -1}}, "algorithm.acr.seed must be an integer >= 0, got -1"),
    ("acr_sign", {"sign": {"scope": "some"}}, "algorithm.sign.scope must be one of collapsed, all, got 'some'"),
    ("acr_ngrpo", {"ngrpo": {"num_max": 0}}, "algorithm.ngrpo.num_max must be >= 1, got 0"),
    ("acr_ngrpo", {"ngrpo": {"gated": "yes"}}, "algorithm.ngrpo.gated must be True or False, got 'yes'"),
    ("acr_sign", {"monitor": {"kl_bound": -1}}, "algorithm.monitor.kl_bound must be >= 0, got -1"),
    (
        "acr_sign",
        {"monitor": {"stop_on_alarm": ["kl_drift"]}},
        "algorithm.monitor.stop_on_alarm names kl_drift, which needs algorithm.monitor.kl_bound",
    ),
    (
        "acr_sign",
        {"avspo": {"alpha": 0.5}},
        "algorithm.avspo holds the options of acr_avspo, but algorithm.adv_estimator is acr_sign",
    ),
]


@pytest.mark.parametrize(
    "estimator, sections, message", SECTION_MISTAKES, ids=[str(i) for i in range(len(SECTION_MISTAKES))]
)
def test_every_section_mistake_is_refused_at_the_first_use_naming_the_option(estimator, sections, message):
    cfg = algorithm(estimator, **sections)
    for call in (lambda: plugin.check_config(cfg), lambda: advantages(cfg)):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    assert plugin.controller_of(cfg) is None  # refused before a controller existed
    plugin.check_config(algorithm("grpo", acr={"window": 0}))  # verl's own estimator: our sections unused


def test_a_nan_score_is_an_unscored_completion():
    """docs/algorithm.md#unscored: a NaN score marks a completion without one: its group is judged on
    its scored completions (the all-wrong group stays all-wrong) and keeps verl's own advantages."""
    nan = float("nan")
    rewards = torch.tensor([[1.0, 1, 1, 1], [nan, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, nan]])
    cfg = algorithm("acr_avspo", acr={"tau_init": 0.3})
    batch, perm = data(rewards)
    out = compute_advantage(batch, adv_estimator="acr_avspo", config=cfg, norm_adv_by_std_in_grpo=True)
    theirs = compute_advantage(
        data(rewards)[0], adv_estimator="grpo", config=algorithm("grpo"), norm_adv_by_std_in_grpo=True
    )
    m = plugin.acr_metrics(cfg)
    assert (m["acr"], m["acr/all_wrong"], m["acr/all_right"], m["acr/unscored"]) == (0.5, 0.25, 0.25, 2 / 16)
    full = [0, 2]  # the fully scored groups: AVSPO at the gate the batch opened (0.5 > 0.3)
    cf = AVSPOConfig(std_convention="unbiased", eps=1e-6)
    expected, _ = group_advantages(rewards[full], "avspo", cf, acr_gate=0.5, tau_adapt=0.3)
    grid = torch.full((4, 4), nan)
    grid[full] = expected
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    rows = torch.isin(perm // 4, torch.tensor(full))
    assert torch.allclose(adv[rows], (grid.reshape(-1)[perm][:, None] * mask)[rows], atol=1e-6)
    assert torch.equal(adv[~rows].isnan(), theirs.batch["advantages"][~rows].isnan())  # verl's own there
    assert m["acr/remedy_groups"] == 0.25  # the all-right group only


def _registered(env: dict[str, str]) -> list[str]:
    code = "import verl\nfrom verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\nprint(sorted(k for k in R if k.startswith('acr_')))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_verl_loads_the_plugin_by_entry_point_or_by_module_list():
    ours = sorted(plugin.PREFIX + r for r in plugin.REMEDIES)
    assert _registered({}) == ours  # the "verl.plugins" entry point (pyproject.toml)
    assert _registered({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": plugin.__name__}) == ours


def test_the_verl_surface_we_rely_on():
    pin = re.search(r"^verl==(\S+)", (ROOT / "requirements-verl.txt").read_text(), re.M).group(1)
    assert md.version("verl") == pin == plugin.TESTED_VERL, "verl changed: re-check the names below and docs/verl.md"
    for name in plugin.REMEDIES:
        assert core_algos.get_adv_estimator_fn(plugin.PREFIX + name).__name__ == f"compute_acr_{name}_advantage"
    sig = inspect.signature(core_algos.compute_grpo_outcome_advantage).parameters
    assert sig["epsilon"].default == plugin.VERL_EPS and {"index", "norm_adv_by_std_in_grpo"} <= set(sig)
    # docs/verl.md's metrics recipe overrides this method of verl's v1 trainer (not importable here: TransferQueue)
    v1 = Path(core_algos.__file__).parent / "v1" / "trainer_base.py"
    assert re.search(r"def _compute_advantage\(self, batch[^,]*, metrics: dict\)", v1.read_text())
    assert "rl_zvp" in ESTIMATORS and "rl_zvp" not in plugin.REMEDIES  # token-level: see the plugin's docstring


def test_a_reward_outside_the_declared_range_is_refused():
    """A 0..10 reward with algorithm.acr.reward_range left at (0, 1): an all-10 group would be pushed
    down as if all wrong; the first batch fails naming the range and the value instead."""
    with pytest.raises(ValueError, match=r"acr\.reward_range is \(0, 1\) but a raw reward is 10"):
        advantages(algorithm("acr_avspo"), rewards=10 * REWARDS)
    adv, *_ = advantages(algorithm("acr_avspo", acr={"reward_range": [0, 10]}), rewards=10 * REWARDS)
    assert torch.isfinite(adv).all()


def test_monitor_options_that_cannot_act_in_verl_are_refused():
    cfg = algorithm("acr_sign", monitor={"kl_bound": 0.1})
    with pytest.raises(
        ValueError, match=r"algorithm\.monitor \(kl_bound\): a verl advantage estimator sees no entropy"
    ):
        plugin.check_config(cfg)
