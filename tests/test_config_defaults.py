"""One home per default: the algorithm's options (algo/options.py) are the only place a default of
the pure math is written; the functions take theirs from there, the controller is built from them
field by field, and the README's flag table is generated from the parser that prints ``--help``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from avspo_openrlhf.algo import options

ROOT = Path(__file__).resolve().parents[1]
ALGO = ROOT / "avspo_openrlhf" / "algo"
OPTION_CLASSES = [options.ACRConfig, options.AVSPOConfig, options.MonitorConfig, options.NGRPOConfig,
                  options.RLZVPConfig, options.GRESOConfig]  # fmt: skip
FIELD_NAMES = {f.name for c in OPTION_CLASSES for f in dataclasses.fields(c)} - {"seed", "enable"}
# parameter names of algo/ that mean an option under another name
ALIASES = {"fixed_k", "tau_adapt", "bounds", "threshold", "patience", "ema_decay", "tau_bounds"}


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
    from avspo_openrlhf.algo import ACRTracker, AdaptiveThreshold, GRESOSelector, group_advantages
    from avspo_openrlhf.algo.controller import AVSPOController

    acr, av, mon, ng, gr = options.ACRConfig(), options.AVSPOConfig(), options.MonitorConfig(), options.NGRPOConfig(), options.GRESOConfig()  # fmt: skip

    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    ga = defaults(group_advantages)
    assert ga["alpha"] == av.alpha and ga["strategy"] == av.strategy and ga["std"] == av.std and ga["eps"] == av.eps
    assert ga["tau_adapt"] == av.tau_init and ga["tol"] == acr.tol and ga["num_max"] == ng.num_max
    assert defaults(ACRTracker) == {f: getattr(acr, f) for f in defaults(ACRTracker)}
    th = defaults(AdaptiveThreshold)
    assert (th["tau_init"], th["eta"], th["bounds"], th["ema_decay"]) == (
        av.tau_init,
        av.eta,
        av.tau_bounds,
        av.reward_ema_decay,
    )
    g = defaults(GRESOSelector)
    assert all(g[f] == getattr(gr, f) for f in ("p_easy", "p_hard", "target_easy", "target_hard", "delta", "p_bounds"))
    c = defaults(AVSPOController.__init__)
    assert c["entropy_threshold"] == mon.entropy_threshold and c["kl_bound"] == mon.kl_bound and c["alpha"] == av.alpha


def test_the_controller_is_built_from_the_options_field_by_field():
    from avspo_openrlhf.algo.controller import AVSPOController

    acr = options.ACRConfig(window=7, smoothing="ema", ema_decay=0.5, gate_view="shaped", reward_range=(-1.0, 1.0))
    av = options.AVSPOConfig(enable=True, alpha=0.25, num_virtual=3, tau_init=0.3, tau_bounds=(0.2, 0.8), eta=0.0)
    mon = options.MonitorConfig(disable_entropy=True, kl_bound=0.2, kl_patience=4)
    ng = options.NGRPOConfig(num_max=2)
    c = AVSPOController.from_config(acr, av, mon, ng, seed=5)
    assert c.estimator == "avspo" and c.gate_view == "shaped" and c.reward_range == (-1.0, 1.0)
    assert c.tracker.recent.maxlen == 7 and c.tracker.smoothing == "ema" and c.tracker.ema_decay == 0.5
    assert c.adv_kwargs["alpha"] == 0.25 and c.adv_kwargs["fixed_k"] == 3
    assert c.threshold.tau == 0.3 and c.threshold.bounds == (0.2, 0.8) and c.threshold.eta == 0.0
    assert c.entropy is None and c.kl.threshold == 0.2 and c.kl.patience == 4 and c.ngrpo_kwargs["num_max"] == 2
    # every field of the three groups is read by from_config (a new field must be wired or fail here)
    src = inspect.getsource(AVSPOController.from_config)
    for cls, name in [(options.ACRConfig, "acr"), (options.AVSPOConfig, "avspo"), (options.MonitorConfig, "monitor"),
                      (options.NGRPOConfig, "ngrpo")]:  # fmt: skip
        unused = {f.name for f in dataclasses.fields(cls) if f"{name}.{f.name}" not in src}
        trainer_reads = {"seed", "enable", "kl_source", "stop_on_alarm"}  # the trainer's (trainer/trainers.py)
        assert unused <= trainer_reads, f"{cls.__name__} fields not passed to the controller: {sorted(unused)}"


def test_readme_flag_table_is_the_generated_one():
    from avspo_openrlhf.cli.train import flag_table

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- flag-table:", 1)[1].split("-->\n", 1)[1].split("<!-- /flag-table -->", 1)[0]
    assert table == flag_table(), (
        "README's flag table differs from --help; regenerate it with "
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
