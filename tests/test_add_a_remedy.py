"""docs/add_a_remedy.md's worked example, examples/qae_remedy.py (a quantile baseline registered from
outside the package), in every front-end: the pure estimator's closed forms, ``avspo-train``
(``--plugin``: flags, ``--help``, one-line errors, and a short ``--backend cpu`` run on the tiny model
whose Ray workers re-import the module), TRL's trainer and verl's ``compute_advantage``.

The module registers ``qae`` in this process; the ``qae`` fixture takes it out of every registry
afterwards, so other tests see the package's own estimators only."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from avspo_openrlhf.algo import ESTIMATORS, ACRConfig, CollapseController, group_advantages, register_estimator
from avspo_openrlhf.trainer import plugins
from avspo_openrlhf.trainer.run_settings import controller_from_flags

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/qae_remedy.py"
REWARDS = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]], dtype=torch.float64)


@pytest.fixture
def qae(monkeypatch):
    """examples/qae_remedy.py loaded as ``--plugin`` loads it; every registry restored afterwards."""
    monkeypatch.chdir(ROOT)
    before = dict(ESTIMATORS)
    plugins.load_plugins([EXAMPLE])
    yield sys.modules["qae_remedy"]
    sys.modules.pop("qae_remedy", None)
    _restore_registries(before)


def _restore_registries(before: dict) -> None:
    """The estimator registry as it was, in verl's registry too (the plugin mirrors every registration)."""
    verl = sys.modules.get("avspo_openrlhf.integrations.verl")
    for name in set(ESTIMATORS) - set(before):
        if verl is not None and name in verl.REMEDIES:
            verl.REMEDIES.remove(name)
            verl.core_algos.ADV_ESTIMATOR_REGISTRY.pop(verl.PREFIX + name, None)
    ESTIMATORS.clear()
    ESTIMATORS.update(before)


def test_the_quantile_baseline_closed_forms(qae):
    adv, info = group_advantages(REWARDS, "qae")  # median baseline, population std
    s1, s2 = 1 / (0.1875**0.5 + 1e-6), 1 / (0.25**0.5 + 1e-6)  # std of 1-of-4 and 2-of-4 right
    expected = torch.tensor(
        [[s1, 0, 0, 0], [0, 0, 0, -s1], [0] * 4, [0] * 4, [0.5 * s2, -0.5 * s2, 0.5 * s2, -0.5 * s2]],
        dtype=torch.float64,
    )  # a minority answer is pushed, the majority's gets exactly 0; collapsed groups stay 0
    assert torch.allclose(adv, expected) and (adv[:4] == 0).sum() == 14 and info["acr"] == 0.4
    plain, _ = group_advantages(REWARDS, "qae", qae.QAEConfig(quantile=0.25, scale="none"))
    q = torch.tensor([0.0, 0.75, 1, 0, 0])  # linear interpolation: [0,1,1,1] at 0.75 of the way -> 0.75
    assert torch.allclose(plain, REWARDS - q[:, None].double())
    # vectorized over groups: equal to one torch.quantile per row on random rewards
    r = torch.rand(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    cfg = qae.QAEConfig(quantile=0.3, std_convention="unbiased")
    got, _ = group_advantages(r, "qae", cfg)
    ref = torch.stack([(row - torch.quantile(row, 0.3)) / (row.std() + 1e-6) for row in r])
    assert torch.allclose(got, ref)
    with pytest.raises(ValueError, match=r"^QAEConfig.quantile must be in \[0, 1\], got 2$"):
        qae.QAEConfig(quantile=2)


# ── avspo-train ──


def test_avspo_train_offers_the_plugins_remedy_in_help_and_refuses_its_mistakes_in_one_line(qae, capsys):
    from orl import parse

    from avspo_openrlhf.cli.train import main, plugin_specs

    with pytest.raises(SystemExit):
        main(["--plugin", EXAMPLE, "--help"])
    out = capsys.readouterr().out
    assert "--qae.quantile" in out and "Quantile baseline (avspo-openrlhf)" in out and "--plugin" in out
    args = parse("--plugin", EXAMPLE, "--remedy", "qae", "--qae.quantile", "0.25")
    assert args.plugin == [str(ROOT / EXAMPLE)]  # absolute: Ray workers re-import it from another folder
    ctrl = controller_from_flags(args)
    assert ctrl.estimator == "qae" and ctrl.config == qae.QAEConfig(quantile=0.25)
    for flags, message in [
        (["--remedy", "qae", "--qae.quantile", "2"], "--qae.quantile must be in [0, 1], got 2.0"),
        (
            ["--remedy", "qae", "--qae.scale", "mad"],
            "argument --qae.scale: invalid choice: 'mad' (choose from 'std', 'none')",
        ),
        (
            ["--remedy", "sign", "--qae.quantile", "0.5"],
            "--qae.quantile is an option of --remedy qae, but --remedy is sign: drop it, or choose --remedy qae",
        ),
    ]:
        with pytest.raises(SystemExit):
            parse("--plugin", EXAMPLE, *flags)
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"avspo-train: error: {message}"
    with pytest.raises(SystemExit):
        parse("--plugin", "examples/no_such_remedy.py", "--remedy", "qae")
    assert capsys.readouterr().err.strip().endswith("--plugin examples/no_such_remedy.py: no such file")
    assert plugin_specs(["--plugin", "a", "--x", "--plugin", "b.py"]) == ["a", "b.py"]


@pytest.mark.parametrize("name, clash", [("actor", "--actor."), ("monitor", "--monitor.*")])
def test_a_plugin_remedy_named_like_a_flag_group_is_refused_in_one_line(qae, tmp_path, capsys, name, clash):
    from orl import parse

    plugin = tmp_path / f"clash_{name}.py"
    plugin.write_text(
        "from dataclasses import dataclass\n"
        "from avspo_openrlhf.algo import register_estimator\n"
        "from avspo_openrlhf.algo.options import Options, flag\n"
        "@dataclass(frozen=True)\nclass C(Options):\n    x: float = flag(1.0, 'x', valid='>0')\n"
        f"register_estimator({name!r}, C)(lambda stats, cfg, ctx: None)\n"
    )
    with pytest.raises(SystemExit):
        parse("--plugin", str(plugin))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"avspo-train: error: estimator {name!r}") and clash in err, err


@pytest.mark.slow
def test_the_pages_complete_cpu_command_trains_with_the_plugins_remedy(tmp_path):
    """docs/add_a_remedy.md's complete ``--backend cpu`` command, run as it stands (only ``.venv/bin/``
    is this interpreter's folder) from a folder that has the repository's ``examples/``: the driver
    imports the plugin before the parser, every Ray worker that builds the controller re-imports it
    (an unknown estimator would stop the run)."""
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    from helpers import undocumented_metrics
    from test_cpu_pipeline import ENV
    from test_docs_snippets import blocks

    from avspo_openrlhf.report import read_metrics

    [block] = [
        b
        for b in blocks("docs/add_a_remedy.md")
        if b.reason and "tests/test_add_a_remedy.py runs this block" in b.reason
    ]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    code = block.code.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True, timeout=480, env=ENV, cwd=tmp_path
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = tmp_path / "runs" / "qae"
    rows, _ = read_metrics(str(out / "report" / "metrics.jsonl"))
    assert [row["step"] for row in rows] == [1, 2]
    assert not undocumented_metrics(k for row in rows for k in row), "docs/metrics.md misses a name avspo-train logged"
    # the remedy's controller ran (tau_adapt_used is logged only with an estimator), collapsed groups stay 0
    assert all("tau_adapt_used" in row and row["acr_effective"] == pytest.approx(row["acr_shaped"]) for row in rows)
    assert (out / "final" / "model.safetensors").exists() and list((out / "report" / "plots").glob("*.png"))


# ── TRL ──


def test_trl_trains_on_the_plugins_advantages(qae, tmp_path):
    pytest.importorskip("trl")
    from test_trl_integration import PATTERNS, Recorder, common, correct, grouped

    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.integrations import trl as acr_trl
    from datasets import Dataset

    assets = {"root": tmp_path}
    with pytest.raises(ValueError, match=r"^remedy_options\['quantile'\] must be in \[0, 1\], got 2$"):
        acr_trl.GRPOConfig(remedy="qae", remedy_options={"quantile": 2}, **common(assets, "bad"))
    args = acr_trl.GRPOConfig(remedy="qae", remedy_options={"quantile": 0.25}, **common(assets, "qae"))
    data = Dataset.from_list([{"prompt": f"What is {k}?", "pattern": k} for k in PATTERNS])
    tr = Recorder(model=build_tiny_model(str(tmp_path / "tiny")), reward_funcs=correct, args=args, train_dataset=data)
    tr.train()
    # TRL's conventions (unbiased std, eps 1e-4) fixed on the plugin's config, as on the package's remedies
    cfg = qae.QAEConfig(quantile=0.25, std_convention=acr_trl.TRL_STD_CONVENTION, eps=acr_trl.TRL_EPS)
    assert tr.controller.config == cfg and len(tr.advantages) == 2
    for rewards, adv in zip(tr.rewards, tr.advantages):
        expected, _ = group_advantages(grouped(rewards), "qae", cfg)
        assert torch.allclose(adv, expected.reshape(-1), atol=1e-6)
        assert not torch.allclose(adv, torch.zeros_like(adv))


# ── verl ──


def test_verl_compute_advantage_dispatches_to_the_plugin(qae):
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed (requirements-verl.txt)")
    from test_verl_integration import REWARDS as VERL_REWARDS
    from test_verl_integration import advantages, algorithm
    from verl.trainer.ppo import core_algos

    from avspo_openrlhf.integrations import verl as plugin

    assert (
        "qae" in plugin.REMEDIES and core_algos.get_adv_estimator_fn("acr_qae").__name__ == "compute_acr_qae_advantage"
    )
    cfg = algorithm("acr_qae", qae={"quantile": 0.75})
    adv, returns, mask, perm = advantages(cfg)
    qcfg = qae.QAEConfig(quantile=0.75, std_convention="unbiased", eps=1e-6)  # verl's GRPO conventions
    expected = CollapseController("qae", qcfg, acr=ACRConfig()).step(VERL_REWARDS)[0]
    assert torch.allclose(adv, expected.reshape(-1)[perm][:, None] * mask, atol=1e-6) and torch.equal(adv, returns)
    with pytest.raises(ValueError, match=r"^algorithm\.qae\.quantile must be in \[0, 1\], got 2$"):
        plugin.check_config(algorithm("acr_qae", qae={"quantile": 2}))
    assert json.dumps(plugin.acr_metrics(cfg))  # plain floats for verl's logger


@pytest.fixture
def half_sign():
    """A user remedy that reports nothing: the sign advantage on the even collapsed groups only."""
    before = dict(ESTIMATORS)

    def fn(stats, cfg, ctx):
        lo, hi = ctx.reward_range
        even = stats.collapsed & (torch.arange(stats.mean.shape[0]) % 2 == 0)
        scale = torch.where(
            stats.collapsed, torch.zeros_like(stats.mean), 1.0 / (stats.ssd.div(stats.group_size).sqrt() + 1e-6)
        )
        offset = torch.where(even, 2 * (stats.mean - lo) / (hi - lo) - 1, -stats.mean * scale)
        return scale, torch.where(stats.collapsed & ~even, torch.zeros_like(offset), offset), {}

    register_estimator("half_sign")(fn)
    yield "half_sign"
    _restore_registries(before)


def test_a_user_remedys_effective_acr_is_read_from_its_advantages(half_sign):
    """acr_effective = the share of groups that are collapsed and still all zero, whatever the remedy
    reports: here 2 of the 4 collapsed groups (rows 1 and 3) of 6 are left at zero."""
    rewards = torch.tensor(
        [[1.0, 1, 1, 1], [0.0, 0, 0, 0], [0.0, 0, 0, 0], [1.0, 1, 1, 1], [1.0, 0, 1, 0], [0, 1, 0, 0.0]]
    )
    adv, info = group_advantages(rewards, half_sign)
    assert info["acr"] == pytest.approx(4 / 6) and info["acr_effective"] == pytest.approx(2 / 6)
    ctrl = CollapseController(half_sign)
    _, metrics = ctrl.step(rewards)
    assert metrics["acr_effective"] == pytest.approx(2 / 6)


def test_the_gate_metric_reads_the_gate_even_when_every_group_has_an_unscored_completion():
    """Every group holds an unscored completion: the remedy acts on none of them, and gate_open says
    what the gate decided from acr/gate and tau (open here), not 0."""
    ctrl = CollapseController("avspo", acr=ACRConfig(tau_init=0.5, window=1))
    rewards = torch.zeros(4, 4)
    scored = torch.ones(4, 4, dtype=torch.bool)
    scored[:, 0] = False
    adv, m = ctrl.step(rewards, scored=scored)
    assert m["acr"] == 1.0 and m["acr_gate"] > m["tau_adapt_used"] == 0.5 and m["gate_open"] == 1.0
    assert torch.isnan(adv).all()  # the trainer keeps its own advantages for those groups


def test_a_plugin_named_as_a_module_is_found_in_the_current_folder(tmp_path, monkeypatch):
    """--plugin NAME says the current folder is searched: a console script's sys.path lacks it."""
    (tmp_path / "my_cwd_remedy.py").write_text(
        "from avspo_openrlhf.algo import register_estimator\n"
        "register_estimator('cwd_remedy')(lambda stats, cfg, ctx: (stats.mean * 0, stats.mean * 0, {}))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = dict(ESTIMATORS)
    try:
        plugins.load_plugins(["my_cwd_remedy"])
        assert "cwd_remedy" in ESTIMATORS
    finally:
        sys.modules.pop("my_cwd_remedy", None)
        _restore_registries(before)
