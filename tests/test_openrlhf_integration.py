"""avspo-train on OpenRLHF 0.11.2: the CLI and its flags, and our experience maker inside
OpenRLHF's own advantage code (CPU, no Ray)."""

import copy
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from orl import experiences_with_kl, make_maker, parse, rollout_samples, sample_advantage

from avspo_openrlhf.algo import group_advantages
from avspo_openrlhf.cli.train import main
from avspo_openrlhf.trainer.parser import flags
from avspo_openrlhf.trainer.run_settings import Settings, controller_from_flags, settings

pytest.importorskip("openrlhf")
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402

from avspo_openrlhf.trainer.experience_maker import RemedyExperienceMaker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUR_FLAGS = ["--remedy", "--plugin", *(f for flags in flags().values() for f, _ in flags)]


# ── CLI ──


def test_help_lists_openrlhf_and_our_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ["--algo.advantage.estimator", "--train.async_enable", "--reward.remote_url", *OUR_FLAGS]:
        assert flag in out, flag
    assert "ACR-gated virtual samples" in out  # help text, not just names


def test_flags_parse_into_namespaces_with_openrlhf_validation():
    args = parse(
        "--remedy",
        "avspo",
        "--avspo.strategy",
        "opposite",
        "--acr.window",
        "1",
        "--buffer.max_staleness",
        "2",
        "--actor.eps_clip",
        "0.2",
    )
    assert args.remedy == "avspo" and args.avspo.strategy == "opposite" and args.acr.window == 1
    assert args.buffer.max_staleness == 2
    assert args.actor.eps_clip_low_high == (0.2, 0.2)  # OpenRLHF's own post-parse validation ran
    assert args.reward.remote_url == ["reward.py"]
    assert args.actor.entropy_coef == 0.0  # entropy measured for the monitor, no loss term


@pytest.mark.parametrize(
    "flags, msg",
    [
        (["--remedy", "avspo", "--algo.advantage.estimator", "rloo"], "group_norm"),
        (["--remedy", "avspo", "--acr.tau_init", "0.95"], "tau_bounds"),
        (["--acr.tau_init", "1.5"], "--acr.tau_init must be in [0, 1], got 1.5"),  # AVSPO off: still built, in an actor
        (["--acr.tau_bounds", "0.5", "1.5"], "--acr.tau_bounds must lie in [0, 1], got (0.5, 1.5)"),  # ACR is a rate
        (["--run.max_steps", "-3"], "--run.max_steps must be >= 1"),
        (["--data.max_len", "8", "--rollout.max_new_tokens", "12"], "leaves no room for a prompt"),
        (["--remedy", "avspo", "--avspo.alpha", "-1"], "--avspo.alpha must be > 0, got -1.0"),
        (
            ["--remedy", "avspo", "--avspo.strategy", "opposite", "--avspo.num_virtual", "2"],
            "--avspo.num_virtual cannot",
        ),
        (["--actor.eps_clip", "-0.2"], "--actor.eps_clip must be > 0"),
        (["--actor.eps_clip_low_high", "0.2", "-0.1"], "--actor.eps_clip_low_high must be >= 0"),
        (["--actor.lr_warmup_ratio", "2"], "--actor.lr_warmup_ratio must be in [0, 1]"),
        (["--dynamic.std_filter", "--algo.dynamic_filtering_enable"], "not both"),
        (["--acr.reward_range", "1", "0"], "LO < HI"),
        (["--train.async_enable", "--buffer.max_staleness", "0"], ">= 1 in async"),
        (["--remedy", "avspo", "--algo.advantage.estimator", "reinforce"], "group_norm"),
        (["--backend", "cpu", "--cpu.engine_cores", "0", "--cpu.train_cores", "0"], "disjoint"),
        (["--backend", "cpu", "--cpu.engine_cores", "9999"], "not available"),
        (["--backend", "cpu", "--cpu.train_cores", "x-1"], "cpulist"),
        (["--train.partial_rollout_enable"], "requires --train.async_enable"),  # OpenRLHF's own assertion
        # values no run can mean: accepted by --dry-run before, then a crash after Ray or nonsense
        (["--acr.ema_decay", "2"], "--acr.ema_decay must be in [0, 1), got 2"),
        (["--actor.adam.lr", "-1"], "--actor.adam.lr must be > 0"),
        (["--rollout.temperature", "-1"], "--rollout.temperature must be >= 0"),
        (["--rollout.max_new_tokens", "0"], "--rollout.max_new_tokens must be >= 1"),
        (["--train.batch_size", "15"], "multiple of --rollout.n_samples_per_prompt 8"),
        (["--ckpt.max_num", "0"], "--ckpt.max_num must be >= 1"),
        (["--ckpt.save_steps", "0"], "--ckpt.save_steps must be -1 (never) or >= 1"),
        (["--train.async_enable", "--train.async_queue_size", "0"], "--train.async_queue_size must be >= 1"),
        (["--acr.volatility_window", "1"], "--acr.volatility_window must be >= 2"),
        # a bound on a KL that OpenRLHF logs as 0 (no reference model without a KL coefficient)
        (
            ["--algo.kl.init_coef", "0", "--monitor.kl_bound", "0.1"],
            "--monitor.kl_bound watches the KL to the reference",
        ),
    ],
)
def test_invalid_flag_combinations_are_rejected(flags, msg, capsys):
    # one line like argparse's, exit 2, no traceback, before anything starts
    with pytest.raises(SystemExit) as exc:
        parse(*flags)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("avspo-train: error: ") and msg in err[0], err


@pytest.mark.parametrize("flags", [["--acr.tau_i", "0.3"], ["--logger.wandb.ke", "sk-secret"], ["--actor.adam.l", "1"]])
def test_a_flag_prefix_is_refused_not_taken_for_the_flag(flags, capsys):
    """argparse would take `--acr.tau_i 0.3` for --acr.tau_init without a word."""
    with pytest.raises(SystemExit) as exc:
        parse(*flags)
    assert exc.value.code == 2 and f"unrecognized arguments: {flags[0]}" in capsys.readouterr().err


def test_our_command_line_tools_refuse_flag_prefixes():
    from avspo_openrlhf.cli import evaluate as eval_cli
    from avspo_openrlhf.cli import prepare_data as data_cli
    from avspo_openrlhf.cli import prepare_model as models
    from avspo_openrlhf.cli import quickstart
    from avspo_openrlhf.cli import simulate as sim_cli

    for build, argv in [
        (quickstart.build_parser, ["--st", "3"]),
        (eval_cli.build_parser, ["--model", "m", "--temp", "1"]),
        (sim_cli.build_parser, ["--see", "1"]),
        (data_cli.build_parser, ["arithmetic", "--se", "1"]),
    ]:
        with pytest.raises(SystemExit):
            build().parse_args(argv)
    with pytest.raises(SystemExit):  # would prepare the model into the folder given to "--out"
        models.main(["tiny", "--out", "unused"])


def test_typed_config_is_frozen_defaulted_and_reaches_the_controller():
    from dataclasses import FrozenInstanceError

    assert settings(SimpleNamespace()) == Settings()  # args built without our parser
    args = parse(
        "--remedy",
        "avspo",
        "--avspo.alpha",
        "0.7",
        "--acr.window",
        "3",
        "--monitor.stop_on_alarm",
        "kl_drift",
        "acr_stall",
        "--monitor.kl_bound",
        "0.1",
        "--avspo.num_virtual",
        "4",
        "--monitor.disable_entropy",
    )
    cfg = settings(args)
    assert cfg.remedy == "avspo" and cfg.remedy_config.alpha == 0.7 and cfg.remedy_config.strategy == "stratified"
    assert cfg.acr.window == 3 and cfg.monitor.stop_on_alarm == ("kl_drift", "acr_stall")
    with pytest.raises(FrozenInstanceError):
        cfg.remedy_config.alpha = 1.0
    ctrl = controller_from_flags(args)
    # the controller holds the typed configs themselves (tests/test_config_defaults.py checks that each
    # field changes what it does)
    assert ctrl.estimator == "avspo" and ctrl.config == cfg.remedy_config and ctrl.acr == cfg.acr
    assert ctrl.config.alpha == 0.7 and ctrl.config.num_virtual == 4
    assert ctrl.tracker.recent.maxlen == 3 and ctrl.entropy is None
    for remedy in ("ngrpo", "rl_zvp", "sign"):
        ctrl = controller_from_flags(parse("--remedy", remedy))
        assert ctrl.estimator == remedy and ctrl.config == type(ctrl.config)()  # its defaults


def test_parsing_patches_nothing_and_leaves_openrlhf_main_untouched():
    import argparse

    import openrlhf.cli.train_ppo_ray as main_mod
    import openrlhf.utils.config as orl_config
    import ray

    watched = [
        (argparse.ArgumentParser, "parse_args"),
        (orl_config, "hierarchize"),
        (ray, "is_initialized"),
        (main_mod, "train"),
        (main_mod, "argparse"),
    ]
    before = [getattr(o, n) for o, n in watched]
    globals_before = set(vars(main_mod))
    args = parse("--remedy", "avspo")
    assert args.remedy == "avspo" and args.actor.eps_clip_low_high == (0.2, 0.2)
    assert [getattr(o, n) for o, n in watched] == before
    assert set(vars(main_mod)) == globals_before  # the __main__ block ran in a copy of its namespace


def test_the_main_block_runs_without_its_module_and_parses_the_same(monkeypatch):
    """``openrlhf_args`` runs train_ppo_ray's __main__ block on the two globals it reads and
    ``hierarchize`` from ``openrlhf/utils/config.py`` alone: the same args, every flag, as in a copy of the
    imported module's namespace."""
    import avspo_openrlhf.cli.train as cli

    argv = ("--remedy", "avspo", "--acr.window", "3", "--actor.eps_clip", "0.3", "--rollout.temperature", "0.7")
    light = cli._to_dict(parse(*argv))
    made = []
    real = cli._block_namespace
    monkeypatch.setattr(cli, "_block_namespace", lambda *a: made.append(real(*a)) and None)
    assert cli._to_dict(parse(*argv)) == light
    assert made and made[0] is not None  # the installed OpenRLHF takes the light path


def test_the_main_block_falls_back_to_its_module_where_it_reads_more(tmp_path):
    """Another global read by the block, or a ``config.py`` that imports beyond the standard library:
    ``_block_namespace`` declines (the module is imported, as before)."""
    import ast

    from avspo_openrlhf.cli.train import _block_namespace, _main_block

    (tmp_path / "openrlhf" / "cli").mkdir(parents=True)
    (tmp_path / "openrlhf" / "utils").mkdir()
    config = tmp_path / "openrlhf" / "utils" / "config.py"
    path = str(tmp_path / "openrlhf" / "cli" / "train_ppo_ray.py")
    block = (
        "if __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n    args = parser.parse_args()\n"
        "    from openrlhf.utils.config import hierarchize\n    args = hierarchize(args)\n{check}    train(args)\n"
    )

    def namespace(check: str):
        return _block_namespace(path, *_main_block(ast.parse(block.format(check=check)), path))

    config.write_text(
        "from types import SimpleNamespace\n\ndef hierarchize(args):\n    return SimpleNamespace(n=args)\n"
    )
    ns, hier = namespace("    assert datetime.now()\n")
    assert ns["hierarchize"](1).n == 1 and [ast.unparse(s) for s in hier] == ["args = hierarchize(args)"]
    assert namespace("    get_strategy(args)\n") is None  # a global of the module
    config.write_text("import torch\n\ndef hierarchize(args):\n    return args\n")
    assert namespace("") is None


def test_a_changed_openrlhf_main_block_is_named():
    import ast

    from avspo_openrlhf.cli.train import OpenRLHFMainChanged, _main_block

    ok = "import x\nif __name__ == '__main__':\n    parser = P()\n    args = parser.parse_args()\n    args = hierarchize(args)\n    check(args)\n    train(args)\n"
    setup, hier, checks = _main_block(ast.parse(ok), "m.py")
    assert [ast.unparse(s) for s in setup + hier + checks] == [
        "parser = P()",
        "args = hierarchize(args)",
        "check(args)",
    ]
    for bad in (ok.replace("    train(args)\n", ""), ok.replace("args = hierarchize(args)", "pass"), "x = 1\n"):
        with pytest.raises(OpenRLHFMainChanged, match="re-check avspo_openrlhf/cli/train.py"):
            _main_block(ast.parse(bad), "m.py")


def test_cpu_core_split_is_resolved_and_normalized():
    from avspo_openrlhf.cpu.cores import parse_cpulist, resolve_split

    assert resolve_split(None, None, [0, 1, 2, 3]) == (None, None)
    assert resolve_split("0-1", None, [0, 1, 2, 3]) == ([0, 1], [2, 3])  # one side alone: the other gets the rest
    assert resolve_split(None, "n1", [0, 1, 2, 3]) == ([1, 2, 3], [0])
    assert resolve_split("n1", "n2", [4, 5, 6, 7]) == ([4], [5, 6])  # counts: allowed cores in order, disjoint
    assert parse_cpulist("0,2-3", [0, 1, 2, 3]) == [0, 2, 3]
    with pytest.raises(ValueError, match="no core left"):
        resolve_split("0-3", None, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="asks for 5 cores"):
        resolve_split("n5", None, [0, 1, 2, 3])
    args = parse("--backend", "cpu", "--cpu.engine_cores", "n1")
    assert args.cpu.engine_cores == "0" and args.cpu.train_cores == ",".join(
        str(c) for c in sorted(os.sched_getaffinity(0))[1:]
    )


def _command(text: str) -> list[str]:
    """The ``avspo-train ...`` command in a shell text, continuation lines joined, ${VAR:-x} -> x."""
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    lines, out, on = text.splitlines(), [], False
    for line in lines:
        s = line.strip()
        if s.startswith("avspo-train") or (s.startswith("python -m avspo_openrlhf.cli.train")):
            on = True
        if on:
            out.append(s.rstrip("\\").strip())
            if not s.endswith("\\"):
                break
    assert out, "no avspo-train command found"
    return " ".join(out).split()[1:] if out[0].startswith("avspo-train") else " ".join(out).split()[3:]


@pytest.mark.parametrize("where", ["README.md", "launch_scripts/train_level3_avspo.sh"])
def test_documented_gpu_command_parses_with_the_real_parser(where):
    text = (ROOT / where).read_text()
    if where == "README.md":
        text = text.split("<!-- gpu-command -->", 1)[1]
    args = parse(*_command(text), base=[])
    assert args.remedy == "avspo" and args.rollout.n_samples_per_prompt == 8
    assert args.rollout.temperature == 1.0 and args.actor.adam.lr == 1e-6 and args.actor.eps_clip == 0.2
    assert args.algo.kl.init_coef == 0 and args.algo.advantage.estimator == "group_norm"
    assert "Qwen2.5-Math-1.5B" in args.actor.model_name_or_path


def test_docs_flag_table_lists_every_flag():
    flags_page = (ROOT / "docs" / "flags.md").read_text()
    for flag in OUR_FLAGS:
        assert f"`{flag}`" in flags_page, flag


# ── experience maker ──


def _both(args, samples, kl_coef=0.0):
    ours = make_maker(args, RemedyExperienceMaker, kl_coef)
    theirs = make_maker(copy.deepcopy(args), RemoteExperienceMaker, kl_coef)
    e1 = ours.compute_advantages_and_returns(experiences_with_kl(ours, copy.deepcopy(samples)))
    e2 = theirs.compute_advantages_and_returns(experiences_with_kl(theirs, copy.deepcopy(samples)))
    return ours, e1, e2


REWARDS = torch.tensor(
    [[1.0] * 8, [0.0] * 8, [1, 0, 1, 1, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0, 0]]
)  # one all-right, one all-wrong, two mixed groups: ACR 0.5


@pytest.mark.parametrize("avspo", [False, True])
def test_maker_equals_openrlhf_group_norm_when_off_or_gate_closed(avspo):
    flags = (
        ["--remedy", "avspo", "--avspo.std_convention", "unbiased", "--avspo.eps", "1e-9", "--acr.tau_init", "0.9"]
        if avspo
        else []
    )
    args = parse(*flags, "--acr.window", "1")
    ours, e1, e2 = _both(args, rollout_samples(REWARDS), kl_coef=0.05)
    # off: OpenRLHF's numbers untouched; gate closed: our GRPO (same float ops as AVSPO's) vs theirs
    same = torch.equal if not avspo else lambda x, y: torch.allclose(x, y, atol=1e-6, rtol=1e-6)
    for a, b in zip(e1, e2):
        assert same(a.advantages, b.advantages) and same(a.returns, b.returns)
        assert torch.equal(a.info["reward"], b.info["reward"])
        assert torch.allclose(a.info["group_reward_std"], b.info["group_reward_std"])
    m = ours.last_metrics
    assert m["acr"] == 0.5 and m["acr_all_right"] == 0.25 and m["acr_all_wrong"] == 0.25
    assert m["acr_effective"] == 0.5 and m["frac_reward_zero_std"] == 0.5
    if avspo:
        assert m["gate_open"] == 0.0 and m["tau_adapt"] <= 0.9


def test_maker_gives_algorithm_md_numbers_with_the_gate_open_and_keeps_kl():
    args = parse("--remedy", "avspo", "--acr.window", "1", "--acr.tau_init", "0.3")
    kl_coef = 0.05
    ours, e1, _ = _both(args, rollout_samples(REWARDS), kl_coef=kl_coef)
    m = ours.last_metrics
    assert m["gate_open"] == 1.0 and m["num_virtual_k"] == 6  # K = ceil(8 * 0.5**0.5)
    assert m["acr_effective"] == 0.0 and m["num_virtual_per_collapsed"] == 6
    # per-token KL is still subtracted: first-token advantage = A - kl_coef * sum_t kl_t
    kl_sum = {}
    for e in experiences_with_kl(ours, rollout_samples(REWARDS)):  # the same seeded KL
        for k, idx in enumerate(e.index):
            kl_sum[idx] = float(e.kl[k].sum())
    adv = sample_advantage(e1) + kl_coef * torch.tensor([kl_sum[i] for i in sorted(kl_sum)])
    adv = adv.reshape(4, 8)
    assert torch.allclose(adv[0], torch.full((8,), 0.728), atol=5e-4)  # docs/algorithm.md#advantages, K=6
    assert torch.allclose(adv[1], torch.full((8,), -0.728), atol=5e-4)
    expected, _ = group_advantages(REWARDS[2:], "grpo")  # mixed groups: plain GRPO (population, 1e-6)
    assert torch.allclose(adv[2:], expected, atol=1e-5)


def test_overlong_penalty_is_applied_before_the_group_statistics():
    flags = ["--reward.overlong_buffer_len", "4", "--rollout.max_new_tokens", "12"]
    lengths = torch.full((4, 8), 4)
    lengths[1, 0] = 12  # an all-wrong group with one overlong sample: a "phantom" advantage
    args = parse(
        *flags,
        "--remedy",
        "avspo",
        "--avspo.std_convention",
        "unbiased",
        "--avspo.eps",
        "1e-9",
        "--acr.tau_init",
        "0.9",
    )
    ours, e1, e2 = _both(args, rollout_samples(REWARDS, lengths))
    for a, b in zip(e1, e2):
        assert torch.allclose(a.advantages, b.advantages, atol=1e-6, rtol=1e-6)
        assert torch.equal(a.info["reward"], b.info["reward"])  # shaped reward logged
    m = ours.last_metrics
    assert m["acr"] == 0.5 and m["acr_shaped"] == 0.25  # raw vs shaped view
    assert m["acr_shaped_all_wrong"] == 0.0
    assert args.reward.overlong_buffer_len == 4 and args.algo.advantage.estimator == "group_norm"  # restored


def test_nan_reward_is_reported():
    rewards = REWARDS.clone()
    rewards[2, 3] = float("nan")
    args = parse()
    maker = make_maker(args, RemedyExperienceMaker)
    with pytest.raises(ValueError, match="non-finite"):
        maker.compute_advantages_and_returns(experiences_with_kl(maker, rollout_samples(rewards)))


def test_a_reward_outside_the_declared_range_is_refused():
    """Rewards on 0..10 with --acr.reward_range left at (0, 1): refused at the first batch, naming the
    range and the value (an all-10 group would otherwise be pushed down as if all wrong)."""
    args = parse("--remedy", "avspo")
    maker = make_maker(args, RemedyExperienceMaker)
    with pytest.raises(ValueError, match=r"acr\.reward_range is \(0, 1\) but a raw reward is 10"):
        maker.compute_advantages_and_returns(experiences_with_kl(maker, rollout_samples(10 * REWARDS)))
    args = parse("--remedy", "avspo", "--acr.reward_range", "0", "10")
    maker = make_maker(args, RemedyExperienceMaker)
    maker.compute_advantages_and_returns(experiences_with_kl(maker, rollout_samples(10 * REWARDS)))
    assert maker.last_metrics["acr_all_right"] == pytest.approx(float((REWARDS == 1).all(1).float().mean()))


def _with_statuses(samples, timeout: torch.Tensor):
    """The reward file's one-hot statuses in each sample's info: ``timeout`` ``[N, G]`` bool."""
    for sample, t in zip(samples, timeout.reshape(-1).tolist(), strict=True):
        sample.info["verify/timeout"] = torch.tensor([float(t)])
        sample.info["verify/error"] = torch.tensor([0.0])
    return samples


@pytest.mark.parametrize("avspo", [False, True])
def test_a_verification_timeout_is_an_unscored_completion(avspo):
    """docs/algorithm.md#unscored: the mixed group 2 (1 0 1 1 0 0 1 0) whose four 0s are timeouts is
    all-right on its scored completions (ACR on correctness); OpenRLHF, and the remedy, train on
    their reward 0 as ever, so on the shaped view (what is trained on) group 2 is mixed."""
    timeout = torch.zeros(4, 8, dtype=torch.bool)
    timeout[2] = REWARDS[2] == 0
    flags = ["--remedy", "avspo", "--acr.tau_init", "0.3"] if avspo else []
    args = parse(*flags, "--acr.window", "1")
    ours = make_maker(args, RemedyExperienceMaker)
    theirs = make_maker(copy.deepcopy(args), RemoteExperienceMaker)
    e1 = ours.compute_advantages_and_returns(
        experiences_with_kl(ours, _with_statuses(rollout_samples(REWARDS), timeout))
    )
    e2 = theirs.compute_advantages_and_returns(
        experiences_with_kl(theirs, _with_statuses(rollout_samples(REWARDS), timeout))
    )
    m = ours.last_metrics
    assert (m["acr"], m["acr_all_right"], m["acr_all_wrong"], m["acr_unscored"]) == (0.75, 0.5, 0.25, 4 / 32)
    assert (m["acr_shaped"], m["acr_shaped_all_right"]) == (0.5, 0.25)
    a, b = sample_advantage(e1).reshape(4, 8), sample_advantage(e2).reshape(4, 8)
    if avspo:  # the gate (on correctness: 0.75 > 0.3) is open; group 2 gets AVSPO's GRPO on its rewards
        assert m["gate_open"] == 1.0 and m["acr_gate"] == 0.75 and (a[:2] != 0).all() and m["acr_effective"] == 0.0
        assert torch.allclose(a[2], (REWARDS[2] - 0.5) / (0.5 + 1e-6), atol=1e-6)
    else:  # OpenRLHF's numbers untouched
        assert torch.equal(a, b) and m["acr_effective"] == 0.5


# ── trainer state in checkpoints, alarms ──


class _Group:
    """Records the calls a trainer makes on OpenRLHF's actor group."""

    def __init__(self):
        self.calls = []

    def async_run_method(self, method_name, **kwargs):
        self.calls.append((method_name, kwargs))
        return []


@pytest.fixture
def plain_refs(monkeypatch):
    """``ray.get`` of the fake group's refs (plain values) returns them: the real one would start a
    local Ray cluster in the test process (its auto-init), which outlived the test and the session."""
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, **kwargs: list(refs))


def _trainer(args):
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    from avspo_openrlhf.trainer.trainers import RemedyTrainerMixin

    class Trainer(RemedyTrainerMixin, BasePPOTrainer):
        pass

    t = Trainer.__new__(Trainer)
    t.args, t.strategy = args, SimpleNamespace(args=args)
    t.actor_model_group, t.critic_model_group = _Group(), None
    t.reward_model_group = t.reference_model_group = t.tokenizer = None
    t.kl_ctl = SimpleNamespace(value=0.0)
    t.wandb_logger = t.tensorboard_logger = None
    t.best_eval_metric_key, t.best_eval_metric_value, t._latest_eval_metric_value = "", float("-inf"), None
    t._remedy_setup()
    t.samples_generator = SimpleNamespace(stop=False)
    return t


def test_state_is_saved_in_checkpoints_and_restored_exactly(plain_refs):
    args = parse("--remedy", "avspo", "--acr.window", "2", "--ckpt.save_steps", "3")
    t = _trainer(args)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.rand(4, 8, generator=gen) < p).float() for p in (0.1, 0.9, 0.5, 0.05, 0.95, 0.5)]
    for step, r in enumerate(batches[:3], start=1):
        t.controller.step(r)
        t.save_logs_and_checkpoints(step, {"policy_loss": 0.0}, {"global_step": step})
    saves = [kw for name, kw in t.actor_model_group.calls if name == "save_checkpoint"]
    assert len(saves) == 1 and saves[0]["tag"] == "global_step3"
    ckpt = json.loads(json.dumps(saves[0]["client_states"]))  # JSON-safe, as a checkpoint stores it

    resumed = _trainer(copy.deepcopy(args))
    resumed.restore_best_checkpoint_state(ckpt)
    assert resumed.policy_version == 3
    for r in batches[3:]:
        a1, m1 = t.controller.step(r)
        a2, m2 = resumed.controller.step(r)
        assert torch.equal(a1, a2) and m1 == m2


def test_a_run_without_a_checkpoint_logs_each_step_once(tmp_path):
    """An earlier attempt in the same folder that saved no checkpoint (stopped by --run.max_steps
    before --save-steps, or killed writing its final model) is trained again from step 1: its rows
    go, as rows after a checkpoint's step go on a resume, instead of the log holding steps 1 2 3 1 2 3."""
    from avspo_openrlhf.report import JsonlLogger, read_metrics

    log = JsonlLogger(str(tmp_path))
    for step in (1, 2, 3):
        log.log_train(step, {"acr": 0.5})
    t = _trainer(parse("--remedy", "avspo", "--report.dir", str(tmp_path)))
    t.restore_best_checkpoint_state({"global_step": 0, "episode": 0})  # what OpenRLHF passes without one
    assert t.policy_version == 0 and read_metrics(str(tmp_path / "metrics.jsonl"))[0] == []
    log.log_train(1, {"acr": 0.25})
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))[0]] == [1]


def test_a_checkpoint_written_before_the_rename_resumes_exactly():
    """tests/fixtures/client_states_4799b8b.json: the client states 4799b8b's trainer saved (key
    ``avspo_state``) and what its controller computed on the next batches; today's trainer resumes
    from them and computes the same."""
    from avspo_openrlhf.trainer.remedy_state import LEGACY_STATE_KEYS, STATE_KEY

    old = json.loads((Path(__file__).parent / "fixtures" / "client_states_4799b8b.json").read_text())
    assert "avspo_state" in old["client_states"] and "avspo_state" in LEGACY_STATE_KEYS and STATE_KEY != "avspo_state"
    # its command chose AVSPO with the switch before --remedy (docs/flags.md#choosing-the-remedy)
    flags = [w for f in old["flags"] for w in (["--remedy", f.split(".")[0][2:]] if f.endswith(".enable") else [f])]
    t = _trainer(parse(*flags))
    t.restore_best_checkpoint_state(old["client_states"])
    assert t.policy_version == 3 and t.controller.steps == 3
    for batch in old["continuation"]:
        adv, metrics = t.controller.step(torch.tensor(batch["rewards"]))
        # the same numbers; acr_unscored (docs/algorithm.md#unscored) is logged since
        assert adv.tolist() == batch["advantages"] and metrics == {**batch["metrics"], "acr_unscored": 0.0}


def test_non_finite_loss_stops_before_the_weights_are_synced(monkeypatch):
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    t = _trainer(parse())
    status = {"policy_loss": 0.3, "actor_grad_norm": 1.0, "entropy_loss": 0.9}
    monkeypatch.setattr(BasePPOTrainer, "ppo_train", lambda self, step: dict(status))
    assert t.ppo_train(4) == status
    status["actor_grad_norm"] = float("inf")
    with pytest.raises(FloatingPointError, match=r"actor_grad_norm.*training step 5"):
        t.ppo_train(4)  # inside train_step this is before broadcast_to_vllm and any checkpoint


def test_alarm_stops_the_run_after_a_checkpoint(plain_refs):
    args = parse("--acr.stall_patience", "2", "--acr.stall_threshold", "0.35", "--monitor.stop_on_alarm", "acr_stall")
    args.ckpt.save_steps = float("inf")  # what PPOTrainer.__init__ makes of the default -1
    t = _trainer(args)
    collapsed = torch.ones(4, 8)
    for step in range(1, 5):
        t.controller.step(collapsed)
        t.save_logs_and_checkpoints(step, {}, {"global_step": step})
        if t.stop_reason:
            break
    assert step == 3 and "acr_stall" in t.stop_reason  # ACR 1.0 for more than 2 steps
    assert t.samples_generator.stop  # the generator reports exhausted; fit() returns normally
    assert [kw["tag"] for n, kw in t.actor_model_group.calls if n == "save_checkpoint"] == ["global_step3"]
    status, step = t.train_step([], 3)  # batches still in flight are not trained
    assert status.get("_avspo_skipped") and step == 3


def test_prompt_order_follows_the_seed_not_the_process_rng():
    """OpenRLHF's own prompt dataloader (no torch.distributed in the trainer process) shuffles with a
    generator drawn from the unseeded global RNG; seed_prompt_order pins it to --train.seed."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from avspo_openrlhf.trainer.trainers import seed_prompt_order

    def order(seed, noise):
        torch.manual_seed(noise)  # a different process-level RNG state each time
        # what DeepspeedStrategy.setup_dataloader builds when torch.distributed is not initialized
        dl = StatefulDataLoader(list(range(32)), batch_size=1, shuffle=True, drop_last=True)
        before = [int(b[0]) for b in dl]
        seed_prompt_order(dl, seed)
        return before, [int(b[0]) for b in dl]

    (raw_a, a), (raw_b, b), (_, c) = order(7, 0), order(7, 1), order(8, 0)
    assert raw_a != raw_b  # unpinned: the order depends on the process RNG
    assert a == b and a != c and sorted(a) == list(range(32))

    # a resumed run: a fresh loader is pinned to the seed, then OpenRLHF loads the checkpointed
    # dataloader state; it continues the interrupted order instead of restarting it
    torch.manual_seed(3)
    dl = StatefulDataLoader(list(range(32)), batch_size=1, shuffle=True, drop_last=True)
    seed_prompt_order(dl, 7)
    it = iter(dl)
    head = [int(next(it)[0]) for _ in range(5)]
    state = dl.state_dict()
    torch.manual_seed(4)
    resumed = StatefulDataLoader(list(range(32)), batch_size=1, shuffle=True, drop_last=True)
    seed_prompt_order(resumed, 7)
    resumed.load_state_dict(state)
    assert head + [int(b[0]) for b in resumed] == a


@pytest.mark.parametrize(
    "limit, step, tokens, reason",
    [
        (("--run.max_steps", "10"), 10, 0.0, "--run.max_steps 10 reached"),
        (("--run.max_generated_tokens", "500"), 7, 512.0, "--run.max_generated_tokens 500 reached (512)"),
    ],
)
def test_a_resumed_run_at_its_limit_trains_no_step(monkeypatch, limit, step, tokens, reason):
    """A run resumed at its step limit or past its token budget (its checkpoint's global step and
    counters restored) trains no further batch: the first one is skipped unseen, the generator told to
    stop. (That a resume restores the step and counters: the GRESO run of test_remedies.py.)"""
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    from avspo_openrlhf.trainer.trainers import SKIPPED

    def trained(self, samples, global_step):
        raise AssertionError("a batch past the run's limit was trained")

    monkeypatch.setattr(BasePPOTrainer, "train_step", trained)
    t = _trainer(parse(*limit))
    t.counters["generated_tokens"] = tokens
    status, new_step = t.train_step([], step)
    assert status == {SKIPPED: True} and new_step == step
    assert t.stop_reason == reason and t.samples_generator.stop
    # below the limit the batch goes on to OpenRLHF's step
    fresh = _trainer(parse(*limit))
    with pytest.raises(AssertionError, match="was trained"):
        fresh.train_step([], 1)
