"""One home per default: the algorithm's options (algo/options.py) are the only place a default of
the pure math is written; the functions take theirs from there, the controller and every estimator
read every field of their configs (checked by behaviour), and the flag table is generated from the
parser that prints ``--help``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from avspo_openrlhf.algo import options

ROOT = Path(__file__).resolve().parents[1]
ALGO = ROOT / "avspo_openrlhf" / "algo"
OPTION_CLASSES = [
    options.ACRConfig,
    options.AVSPOConfig,
    options.MonitorConfig,
    options.NGRPOConfig,
    options.RLZVPConfig,
    options.SignConfig,
    options.GroupNormConfig,
    options.GRESOConfig,
]
FIELD_NAMES = {f.name for c in OPTION_CLASSES for f in dataclasses.fields(c)} - {"seed", "enable"}
# parameter names of algo/ that mean an option under another name
ALIASES = {"tau_adapt", "bounds", "threshold", "patience", "ema_decay", "tau_bounds"}


def _literal(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.Tuple):
        return all(isinstance(e, ast.Constant) for e in node.elts)
    return isinstance(node, ast.BinOp)  # 1 / 12


def _literal_defaults(path: Path):
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        pos = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults))
        kw = [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        for arg, default in pos + kw:
            if (arg.arg in FIELD_NAMES or arg.arg in ALIASES) and _literal(default):
                yield f"{path.name}:{default.lineno}: {fn.name}({arg.arg}={ast.unparse(default)})"


def test_no_option_default_is_written_twice_in_the_algorithm():
    offenders = [o for p in sorted(ALGO.glob("*.py")) if p.name != "options.py" for o in _literal_defaults(p)]
    assert not offenders, "literal defaults of options (take them from algo/options.py):\n" + "\n".join(offenders)


def test_the_check_sees_a_literal_default(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def g(rewards, *, alpha: float = 0.5, other=3, tol=DEFAULT_TOL):\n    pass\n")
    assert list(_literal_defaults(f)) == ["x.py:1: g(alpha=0.5)"]


def test_algorithm_defaults_equal_the_options():
    from avspo_openrlhf.algo import ESTIMATORS, ACRTracker, AdaptiveThreshold, GRESOSelector, group_advantages

    acr, gr = options.ACRConfig(), options.GRESOConfig()

    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    ga = defaults(group_advantages)
    assert ga["tau_adapt"] == acr.tau_init and ga["tol"] == acr.tol and ga["reward_range"] == acr.reward_range
    # the stateful components take their config object, not a restated list of its fields
    assert list(inspect.signature(ACRTracker).parameters) == ["config"]
    assert list(inspect.signature(AdaptiveThreshold).parameters) == ["config"]
    assert list(inspect.signature(GRESOSelector).parameters) == ["config", "acr", "seed"]
    tracker, threshold, greso = ACRTracker(), AdaptiveThreshold(), GRESOSelector()
    assert tracker.recent.maxlen == acr.window and tracker.stall.patience == acr.stall_patience
    assert (threshold.tau, threshold.eta, threshold.bounds, threshold.ema_decay) == (
        acr.tau_init,
        acr.eta,
        acr.tau_bounds,
        acr.reward_ema_decay,
    )
    assert greso.p == {"easy": gr.p_easy, "hard": gr.p_hard} and greso.p_bounds == gr.p_bounds
    assert (greso.delta, greso.min_keep, greso.tol) == (gr.delta, gr.min_keep, acr.tol)
    # every remedy is one registry entry plus one config: its flag group (when it has one) is that config
    from avspo_openrlhf.trainer.parser import groups, remedy_choices

    assert remedy_choices() == ["none", *ESTIMATORS]
    assert all(groups()[name][1] is e.config for name, e in ESTIMATORS.items() if e.config is not None)


BATCH = [[1.0] * 8, [0.0] * 8, [1.0, 0.0] * 4, [1.0] * 6 + [0.0] * 2, [0.25] * 8]


def _run(estimator, acr=None, monitor=None, config=None, steps=3):
    """Everything a controller produces over a few batches: metrics, advantages, monitor alarms, state."""
    import json

    import torch

    from avspo_openrlhf.algo import CollapseController

    c = CollapseController(estimator, config, acr=acr, monitor=monitor, seed=1)
    out = []
    for i in range(steps):
        raw = torch.tensor(BATCH[: 3 + i % 3])
        adv, m = c.step(raw, raw * 0.5)
        out.append((m, adv.tolist() if adv is not None else None, c.after_train({"entropy_loss": 1.0, "kl": 0.05})))
    return json.dumps([out, c.state_dict()], sort_keys=True, default=str)


# a valid non-default value for every field the controller reads; each one must change its output
ACR_CHANGES = dict(
    tol=0.3,
    reward_range=(-1.0, 1.0),
    smoothing="ema",
    window=1,
    ema_decay=0.1,
    gate_view="shaped",
    early_steps=1,
    stall_threshold=0.0,
    stall_patience=0,
    volatility_window=2,
    volatility_threshold=0.0,
    tau_init=0.2,
    eta=0.5,
    tau_bounds=(0.0, 1.0),
    reward_ema_decay=0.0,
)
MONITOR_CHANGES = dict(entropy_threshold=5.0, entropy_patience=0, disable_entropy=True, kl_bound=0.01, kl_patience=0)
TRAINER_READS = {"kl_source", "stop_on_alarm"}  # the trainer's (trainer/trainers.py)


def test_every_acr_and_monitor_field_changes_what_the_controller_does():
    """Behaviour, not source text: a field the controller ignored would leave its output unchanged."""
    assert set(ACR_CHANGES) == {f.name for f in dataclasses.fields(options.ACRConfig)}
    assert set(MONITOR_CHANGES) | TRAINER_READS == {f.name for f in dataclasses.fields(options.MonitorConfig)}
    base = _run("avspo")
    for name, value in ACR_CHANGES.items():
        assert _run("avspo", acr=options.ACRConfig(**{name: value})) != base, f"--acr.{name} changes nothing"
    for name, value in MONITOR_CHANGES.items():
        base_mon = {"kl_bound": 0.01} if name == "kl_patience" else {}  # the patience of an alarm that is on
        a = _run("avspo", monitor=options.MonitorConfig(**base_mon))
        assert _run("avspo", monitor=options.MonitorConfig(**base_mon, **{name: value})) != a, f"--monitor.{name}"


def _changed(f: dataclasses.Field, value):
    if isinstance(value, bool):
        return not value
    if "choices" in f.metadata:
        return next(c for c in f.metadata["choices"] if c != value)
    if f.name == "num_virtual" or f.name == "num_max":
        return 3
    if f.metadata.get("valid") == "(0,1)":  # a decay: tripled it would leave its range
        return value / 3
    return value * 3 if value > 1e-4 else value + 1e-3  # a tiny eps tripled is below float32 resolution


# fields whose effect needs another field set: (estimator, field) -> (config base, acr_gate)
NEEDS = {("avspo", "gamma"): ({"strategy": "exp_decay"}, 0.9), ("ngrpo", "gated"): ({}, 0.2)}


def test_every_estimator_reads_every_field_of_its_own_config():
    import torch

    from avspo_openrlhf.algo import ESTIMATORS, group_advantages

    r = torch.tensor(BATCH)
    h, mask, sign = (
        torch.rand(5, 6, generator=torch.Generator().manual_seed(0)),
        torch.ones(5, 6),
        torch.tensor([1, -1, 0, 0, -1]),
    )

    def out(name, cfg, gate):
        adv, _ = group_advantages(
            r, name, cfg, acr_gate=gate, tau_adapt=0.5, generator=torch.Generator().manual_seed(0)
        )
        e = ESTIMATORS[name]
        return adv, e.token_fn(h, mask, sign, cfg) if e.token_fn else None

    checked = 0
    for name, e in ESTIMATORS.items():
        for f in dataclasses.fields(e.config) if e.config else ():
            if f.name in ("enable", "seed"):  # the flag that picks the remedy; the trainer's seed
                continue
            extra, gate = NEEDS.get((name, f.name), ({}, 0.9))
            base = e.config(**extra)
            a = out(name, base, gate)
            b = out(name, dataclasses.replace(base, **{f.name: _changed(f, getattr(base, f.name))}), gate)
            same = torch.equal(a[0], b[0]) and (a[1] is None or torch.equal(a[1], b[1]))
            assert not same, f"{name}: {f.name} changes no advantage"
            checked += 1
    assert checked >= 15


def test_a_config_of_another_remedy_is_refused():
    import torch

    from avspo_openrlhf.algo import AVSPOConfig, CollapseController, NGRPOConfig, group_advantages

    with pytest.raises(TypeError, match="takes a NGRPOConfig config, got AVSPOConfig"):
        group_advantages(torch.zeros(2, 4), "ngrpo", AVSPOConfig())
    with pytest.raises(TypeError, match="got NGRPOConfig"):
        CollapseController("avspo", NGRPOConfig())
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        CollapseController("ppo")


def test_docs_flag_table_is_the_generated_one():
    from avspo_openrlhf.cli.train import flag_table

    text = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    table = text.split("<!-- flag-table:", 1)[1].split("-->\n", 1)[1].split("<!-- /flag-table -->", 1)[0]
    assert table == flag_table(), (
        "docs/flags.md's flag table differs from --help; regenerate it with "
        "python -c 'from avspo_openrlhf.cli.train import flag_table; print(flag_table())'"
    )


@pytest.mark.parametrize("flag", ["--avspo.alpha", "--greso.p_easy", "--cpu.dtype", "--backend"])
def test_the_table_says_what_help_says(flag):
    import argparse

    from avspo_openrlhf.cli.train import extend_parser, flag_table

    parser = argparse.ArgumentParser(add_help=False)
    extend_parser(parser)
    action = next(a for a in parser._actions if flag in a.option_strings)
    row = next(r for r in flag_table().splitlines() if r.startswith(f"| `{flag}` |"))
    assert row.endswith(f"| {action.help.replace('%%', '%')} |")


def test_every_flag_group_checks_itself_when_built_and_argparse_offers_the_same_choices():
    """Every avspo-train group (the algorithm's and the run's) is valid by construction: each field
    refuses a value of the wrong type, an unknown choice and a number outside its range, in one line
    naming the field; argparse's choices are the dataclass's own list (one source)."""
    import argparse

    from avspo_openrlhf.algo.options import OptionError
    from avspo_openrlhf.trainer.parser import add_args, flags, groups

    parser = add_args(argparse.ArgumentParser(add_help=False))
    outside = {">0": 0, ">=0": -1, ">=1": 0, ">=2": 1, "[0,1]": 1.5, "[0,1)": 1, "(0,1]": 0, "(0,1)": 1}
    for ns, (_, cls) in groups().items():
        cls()  # the defaults are valid
        for f in dataclasses.fields(cls):
            ann, flag = str(f.type), f"--{ns}.{f.name}"
            bad = [3 if ann.startswith("str") else "x"]
            if ann.startswith(("int", "float")):
                assert "valid" in f.metadata, f"{flag}: a number without a range"
                bad.append(outside[f.metadata["valid"]])
            if "choices" in f.metadata and ann.startswith("str"):
                bad.append("bogus")
                action = next(a for a in parser._actions if flag in a.option_strings)
                assert action.choices is f.metadata["choices"], flag
            for value in bad:
                with pytest.raises(OptionError, match=rf"^{cls.__name__}\.{f.name} "):
                    cls(**{f.name: value})
    assert all("valid" not in kw and "order" not in kw for group in flags().values() for _, kw in group)


def test_docs_metric_names_of_trl_and_verl_are_the_mapping_the_code_uses():
    """One mapping of metric names across the front-ends: every row of docs/metrics.md's table is what
    ``framework_metrics`` (TRL's trainer, ``measure_acr``, verl's ``acr_metrics``) makes of the name."""
    from avspo_openrlhf.integrations import framework_metrics

    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    table = text.split("<!-- metric-names:", 1)[1].split("<!-- /metric-names -->", 1)[0]
    rows = [re.findall(r"`([^`]+)`", line) for line in table.splitlines()[3:] if line.startswith("| `")]
    assert len(rows) >= 10
    for ours, theirs, *_ in rows:  # TRL logs its own frac_reward_zero_std: the mapping drops ours
        assert list(framework_metrics({ours: 0.0})) == ([] if ours == "frac_reward_zero_std" else [theirs]), ours
