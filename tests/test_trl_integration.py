"""TRL's own ``GRPOTrainer.train()`` (TRL 1.16.0, HF generation, no vLLM) on the tiny random model with
every remedy of avspo_openrlhf/integrations/trl.py (AVSPO with each of its strategies): the advantages
TRL trains on are the algo layer's closed forms, a closed gate is TRL's GRPO bit for bit and Dr. GRPO
(``scale_rewards="none"``) TRL's own bit for bit, the paper README's snippet trains and logs
``train/acr``, evaluation logs ``eval_acr`` without stepping the controller, a resume continues the
controller exactly (its random generator included), each process keeps its slice, and every TRL
private name the integration relies on still exists and still means what it did."""

import dataclasses
import importlib.metadata as md
import inspect
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

try:
    md.version("trl")
except md.PackageNotFoundError:
    pytest.skip("TRL is not installed: pip install -r requirements-trl.txt (setup.sh does)", allow_module_level=True)

import transformers  # noqa: E402
import trl  # noqa: E402
from helpers import undocumented_metrics  # noqa: E402
from transformers.integrations.integration_utils import rewrite_logs  # noqa: E402
from trl.trainer import grpo_trainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from avspo_openrlhf.algo import (  # noqa: E402
    ESTIMATORS,
    ACRConfig,
    AVSPOConfig,
    CollapseController,
    RLZVPConfig,
    group_advantages,
    num_virtual,
    rl_zvp_token_advantages,
    zero_variance_sign,
)
from avspo_openrlhf.algo import GroupNormConfig as GroupNorm  # noqa: E402
from avspo_openrlhf.algo.options import STRATEGIES  # noqa: E402
from avspo_openrlhf.cpu.tiny import build_tiny_model  # noqa: E402
from avspo_openrlhf.integrations import trl as acr_trl  # noqa: E402
from datasets import Dataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
G = 4
# shuffle off, two prompts a step: step 1 = all-right + mixed, step 2 = all-wrong + mixed (ACR 0.5 each)
PATTERNS = {"a": (1, 1, 1, 1), "c": (1, 0, 0, 1), "b": (0, 0, 0, 0), "d": (0, 1, 1, 1)}
TAU = 0.3  # below every step's ACR: the gate opens
OPTIONS = {"ngrpo": {"num_max": 2}, "sign": {"scope": "collapsed"}}
# one TRL run per case: every remedy, AVSPO once per virtual-reward strategy ("avspo-<strategy>")
CASES = [r for r in sorted(ESTIMATORS) if r != "avspo"] + [f"avspo-{s}" for s in STRATEGIES]
RESUMED = ("avspo-stratified", "avspo-random_uniform")  # these runs also write checkpoints
TRL_GRPO = GroupNorm(std_convention=acr_trl.TRL_STD_CONVENTION, eps=acr_trl.TRL_EPS)


def correct(completions, pattern, **_):
    """The fixed reward batch: completion i of a group scores ``PATTERNS[prompt][i]`` (TRL keeps each
    group's completions together, in order)."""
    return [float(PATTERNS[p][i % G]) for i, p in enumerate(pattern)]


class Recorder(acr_trl.GRPOTrainer):
    """Our trainer, recording what TRL computed and what its loss trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rewards, self.advantages, self.trained, self.zvp = [], [], [], []

    def _calculate_rewards(self, *args):
        out = super()._calculate_rewards(*args)
        self.rewards.append(out.clone())
        return out

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.advantages.append(out["advantages"].clone())
        return out

    def _compute_loss(self, model, inputs):
        self.trained.append(inputs["advantages"].clone())
        return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        pending = self._token_inputs
        before = None if pending is None else pending["advantages"].clone()
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if pending is not None:
            self.zvp.append(
                (
                    before,
                    pending["advantages"].clone(),
                    out[1].detach().clone(),
                    pending["completion_mask"].clone(),
                    pending[acr_trl.SIGN_KEY].clone(),
                )
            )
        return out


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    data = Dataset.from_list([{"prompt": f"What is {k}?", "pattern": k} for k in PATTERNS])
    return {"model": build_tiny_model(str(root / "tiny")), "root": root, "data": data, "runs": {}}


def common(assets, key: str, steps: int = 2) -> dict:
    return dict(
        output_dir=str(assets["root"] / key),
        per_device_train_batch_size=2 * G,
        num_generations=G,
        max_completion_length=4,
        max_steps=steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        shuffle_dataset=False,
        disable_tqdm=True,
    )


def run(assets, key: str, **config) -> Recorder:
    """TRL trains the tiny model two steps with ``GRPOConfig(**config)``; once per ``key`` and module."""
    if key not in assets["runs"]:
        args = acr_trl.GRPOConfig(**{**common(assets, key), **config})
        trainer = Recorder(model=assets["model"], reward_funcs=correct, args=args, train_dataset=assets["data"])
        trainer.train()
        assets["runs"][key] = trainer
    return assets["runs"][key]


def split(case: str) -> tuple[str, dict | None]:
    """``(remedy, remedy_options)`` of a case: ``"avspo-opposite"`` is AVSPO with that strategy."""
    remedy, _, strategy = case.partition("-")
    return remedy, ({"strategy": strategy} if strategy else OPTIONS.get(remedy))


def remedy_kwargs(case: str) -> dict:
    remedy, options = split(case)
    extra = dict(save_strategy="steps", save_steps=1) if case in RESUMED else {}  # the resume test's
    return dict(remedy=remedy, acr_threshold_init=TAU, acr_options={"window": 1}, remedy_options=options, **extra)


def remedy_run(assets, case: str) -> Recorder:
    return run(assets, case, **remedy_kwargs(case))


def remedy_config(case: str):
    remedy, options = split(case)
    cls = ESTIMATORS[remedy].config
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    fixed = {"std_convention": acr_trl.TRL_STD_CONVENTION, "eps": acr_trl.TRL_EPS}
    return cls(**(options or {}), **{k: v for k, v in fixed.items() if k in names})


def seeded() -> torch.Generator:
    """The controller's generator as GRPOConfig(seed=0) seeds it (AVSPO's random_uniform draws from it)."""
    return torch.Generator().manual_seed(0)


def grouped(rewards_per_func: torch.Tensor) -> torch.Tensor:
    return rewards_per_func.sum(dim=1).view(-1, G)  # one reward function, weight 1


def acr_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "acr" in h]


def test_measure_only_keeps_trls_advantages_and_logs_acr(assets):
    tr = run(assets, "none")
    assert tr.remedy is None and len(tr.rewards) == 2
    assert torch.equal(grouped(tr.rewards[0]), torch.tensor([PATTERNS["a"], PATTERNS["c"]], dtype=torch.float32))
    for rewards, adv in zip(tr.rewards, tr.advantages):  # TRL's GRPO is our GRPO closed form, unbiased std, eps 1e-4
        expected, _ = group_advantages(grouped(rewards), "grpo", TRL_GRPO)
        assert torch.allclose(adv, expected.reshape(-1), atol=1e-6)
    first, second = acr_logs(tr)
    assert first["acr"] == second["acr"] == 0.5 and first["frac_reward_zero_std"] == 0.5  # TRL's own, per completion
    assert first["acr/all_right"] == 0.5 and second["acr/all_wrong"] == 0.5 and first["acr/cum"] == 0.5
    assert {"train/acr", "train/acr/effective", "train/alarm/acr_stall"} <= set(rewrite_logs(first))
    entropy = [h for h in tr.state.log_history if "monitor/entropy" in h]  # TRL's entropy feeds the alarm
    assert len(entropy) == 2 and all(
        h["monitor/entropy"] == h["entropy"] and h["alarm/entropy_collapse"] == 0 for h in entropy
    )


def test_a_closed_gate_is_trls_grpo_bit_for_bit(assets):
    closed, theirs = run(assets, "closed", remedy="avspo", acr_threshold_init=0.9), run(assets, "none")
    assert len(closed.advantages) == 2
    for ours, trl_adv in zip(closed.advantages, theirs.advantages):
        assert torch.equal(ours, trl_adv)
    assert all(h["acr/gate_open"] == 0.0 and h["acr/remedy_groups"] == 0.0 for h in acr_logs(closed))


@pytest.mark.parametrize("case", CASES)
def test_trl_trains_on_the_closed_forms(assets, case):
    remedy, _ = split(case)
    tr = remedy_run(assets, case)
    ref = CollapseController(remedy, remedy_config(case), acr=ACRConfig(tau_init=TAU, window=1), seed=0)
    for step, (rewards, adv) in enumerate(zip(tr.rewards, tr.advantages)):
        expected, _ = ref.step(grouped(rewards))
        if step == 0:  # the first batch is group_advantages itself (window 1: the gate sees this batch's ACR)
            direct, _ = group_advantages(
                grouped(rewards), remedy, remedy_config(case), tau_adapt=TAU, generator=seeded()
            )
            assert torch.equal(direct, expected)
        assert torch.allclose(adv, expected.reshape(-1), atol=1e-6), (step, adv, expected)
    assert len(tr.advantages) == 2 and torch.equal(
        torch.cat(tr.trained).sort().values, torch.cat(tr.advantages).sort().values
    )
    if remedy in ("avspo", "ngrpo", "sign"):  # the collapsed groups train on non-zero advantages
        assert (torch.cat(tr.advantages) != 0).sum() > 8
    logs = acr_logs(tr)
    assert len(logs) == 2 and all(h["acr"] == 0.5 for h in logs)
    missing = undocumented_metrics(k for h in tr.state.log_history for k in h)
    assert not missing, f"docs/metrics.md does not list these names TRL logged: {missing}"
    if remedy == "avspo":  # the strategy reached the controller: its K (opposite: one virtual sample)
        strategy = remedy_config(case).strategy
        assert tr.controller.config.strategy == strategy and strategy == case.partition("-")[2]
        k = num_virtual(G, 0.5, AVSPOConfig.alpha, strategy)
        assert all(h["acr/num_virtual_k"] == k and h["acr/gate_open"] == 1.0 for h in logs)
    if remedy == "rl_zvp":
        assert len(tr.zvp) == 2
        for before, after, entropy, mask, sign in tr.zvp:  # the loss's own entropies, no extra forward
            extra = rl_zvp_token_advantages(entropy, mask, sign, RLZVPConfig.alpha)
            assert torch.allclose(after, before[:, None] + extra, atol=1e-6) and extra.abs().sum() > 0
        signs = [sorted(s.tolist()) for *_, s in tr.zvp]
        assert signs == [[0] * 4 + [1] * 4, [-1] * 4 + [0] * 4]
        assert all(h["rl_zvp/token_adv_abs_mean"] > 0 for h in tr.state.log_history if "rl_zvp/token_adv_abs_mean" in h)


def test_paper_readme_snippet_trains_and_logs_train_acr(assets):
    with pytest.raises(TypeError):  # what the authors' TRL fork does with their own README's snippet
        trl.GRPOConfig(use_avspo=True, acr_threshold_init=0.5, virtual_sample_alpha=0.5)
    args = acr_trl.GRPOConfig(
        use_avspo=True, acr_threshold_init=0.5, virtual_sample_alpha=0.5, **common(assets, "readme")
    )
    trainer = acr_trl.GRPOTrainer(model=assets["model"], reward_funcs=correct, args=args, train_dataset=assets["data"])
    assert args.remedy == "avspo" and trainer.controller.config.alpha == 0.5 and trainer.controller.threshold.tau == 0.5
    trainer.train()
    logged = [rewrite_logs(h) for h in acr_logs(trainer)]
    assert len(logged) == 2 and all(h["train/acr"] == 0.5 and "train/acr/gate_open" in h for h in logged)


@pytest.mark.parametrize("case", RESUMED)
def test_resume_continues_the_controller_state_exactly(assets, case):
    full = remedy_run(assets, case)
    checkpoint = assets["root"] / case / "checkpoint-1"
    saved = json.loads((checkpoint / acr_trl.STATE_FILE).read_text())
    assert saved["steps"] == 1
    args = acr_trl.GRPOConfig(**{**common(assets, case + "_resumed"), **remedy_kwargs(case)})
    resumed = Recorder(model=assets["model"], reward_funcs=correct, args=args, train_dataset=assets["data"])
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert len(resumed.advantages) == 1 and torch.equal(resumed.advantages[0], full.advantages[1])
    assert resumed.controller.state_dict() == full.controller.state_dict() and full.controller.steps == 2
    if case == "avspo-random_uniform":  # the generator's state matters: a fresh one draws other virtual rewards
        fresh = CollapseController("avspo", remedy_config(case), acr=ACRConfig(tau_init=TAU, window=1), seed=0)
        fresh.load_state_dict({**saved, "generator": fresh.generator.get_state().tolist()})
        other, _ = fresh.step(grouped(full.rewards[1]))
        assert not torch.allclose(other.reshape(-1), full.advantages[1], atol=1e-3)


@pytest.mark.slow
def test_dr_grpo_without_std_scaling_is_trls_own_bit_for_bit(assets):
    dr = dict(scale_rewards="none", loss_type="dr_grpo")  # TRL's Dr. GRPO (its docs' two settings)
    ours, theirs = run(assets, "dr_grpo_none", remedy="dr_grpo", **dr), run(assets, "none_dr_grpo", **dr)
    assert len(ours.advantages) == len(theirs.advantages) == 2
    for rewards, mine, trl_adv in zip(theirs.rewards, ours.advantages, theirs.advantages):
        closed, _ = group_advantages(grouped(rewards), "dr_grpo")  # r - group mean, no std division
        assert torch.equal(trl_adv, closed.reshape(-1)) and torch.equal(mine, trl_adv)
        r = grouped(rewards)  # the mixed groups too: centred only, not divided by their std
        assert torch.equal(trl_adv, (r - r.mean(dim=1, keepdim=True)).reshape(-1))
    magnitudes = sorted(set(torch.cat(theirs.advantages).abs().tolist()))
    assert magnitudes == [0.0, 0.25, 0.5, 0.75]  # TRL's GRPO (std division) would give 0.5, 0.866, 1.5
    assert all(h["acr"] == 0.5 and h["acr/remedy_groups"] == 0.0 for h in acr_logs(ours))


def bonus(completions, pattern, **_):
    """A second reward function: 0.1 on every second completion (no group of it is collapsed)."""
    return [0.1 * (i % 2) for i in range(len(pattern))]


def test_acr_reward_func_measures_correctness_while_the_remedy_shapes_the_weighted_sum(assets):
    """Two reward functions: ``acr_reward_func="correct"`` is the raw view (its ACR drives the gate),
    TRL's weighted sum the shaped one the advantages are computed on; the all-right group of the
    correctness function is not collapsed in the sum, so AVSPO leaves it to GRPO."""
    args = acr_trl.GRPOConfig(
        **{
            **common(assets, "two_funcs"),
            **remedy_kwargs("avspo-stratified"),
            "save_strategy": "no",
            "acr_reward_func": "correct",
        }
    )
    tr = Recorder(model=assets["model"], reward_funcs=[correct, bonus], args=args, train_dataset=assets["data"])
    tr.train()
    ref = CollapseController("avspo", remedy_config("avspo-stratified"), acr=ACRConfig(tau_init=TAU, window=1), seed=0)
    assert len(tr.rewards) == 2 and tr.rewards[0].shape[1] == 2
    for rewards, adv in zip(tr.rewards, tr.advantages):
        raw, shaped = rewards[:, 0].view(-1, G), rewards.sum(dim=1).view(-1, G)
        expected, _ = ref.step(raw, shaped)
        assert torch.allclose(adv, expected.reshape(-1), atol=1e-6)
    logs = acr_logs(tr)
    assert [h["acr"] for h in logs] == [0.5, 0.5] and [h["acr/shaped"] for h in logs] == [0.0, 0.0]
    # the raw view's ACR is the gate's input: the gate is open (0.5 > tau), gate_open says so, and no
    # group of the sum is collapsed, so none is augmented (the advantages above are GRPO's on the sum)
    assert all(h["acr/gate"] == 0.5 > TAU and h["acr/gate_open"] == 1.0 for h in logs)


# every group has one completion without a score (None); step 1 ("a", "c") and step 2 ("b", "d") each
# hold one group whose scored completions are all wrong and one mixed group
UNSCORED = {"a": (None, 0, 0, 0), "c": (1, None, 0, 1), "b": (0, 0, None, 0), "d": (None, 1, 0, 1)}


def sometimes_unscored(completions, pattern, **_):
    """Rewards with a ``None`` in every group (:data:`UNSCORED`)."""
    return [None if (v := UNSCORED[p][i % G]) is None else float(v) for i, p in enumerate(pattern)]


@pytest.mark.slow
def test_a_group_is_collapsed_by_its_scored_completions_and_every_step_logs_acr(assets):
    """docs/algorithm.md#unscored: an all-wrong group with one unscored completion is all-wrong
    (``acr/all_wrong`` 0.5 on every step, each of whose groups has an unscored member);
    ``acr/unscored`` is the share of completions without a score; such groups keep TRL's advantages."""

    def trainer(key, **remedy):
        args = acr_trl.GRPOConfig(**{**common(assets, key), **remedy, "save_strategy": "no"})
        tr = Recorder(model=assets["model"], reward_funcs=sometimes_unscored, args=args, train_dataset=assets["data"])
        tr.train()
        return tr

    ours = trainer("unscored_avspo", **remedy_kwargs("avspo-stratified"))
    theirs = trainer("unscored_none")
    assert torch.isnan(ours.rewards[0][0, 0]) and torch.isnan(ours.rewards[1][2, 0])
    for mine, trl_adv in zip(ours.advantages, theirs.advantages, strict=True):
        assert torch.equal(mine, trl_adv)  # no group is fully scored: TRL's own advantages throughout
    assert ours.advantages[0][0] == 0.0 and ours.advantages[0][G + 1] == 0.0  # TRL's: an unscored completion gets none
    for tr in (ours, theirs):
        logs = acr_logs(tr)
        assert [h["acr/all_wrong"] for h in logs] == [0.5, 0.5] and [h["acr"] for h in logs] == [0.5, 0.5]
        assert [h["acr/unscored"] for h in logs] == [0.25, 0.25] and [h["acr/all_right"] for h in logs] == [0.0, 0.0]
    assert [h["acr/gate"] for h in acr_logs(ours)] == [0.5, 0.5] and all(
        h["acr/remedy_groups"] == 0.0 for h in acr_logs(ours)
    )


def test_stock_trl_measures_acr_through_the_reward_functions_log_metric(assets):
    """docs/trl.md's measure-only snippet: TRL's own GRPOConfig and GRPOTrainer (no subclass), the
    reward function wrapped by measure_acr: every step logs the ACR views, the rewards and TRL's
    advantages unchanged."""
    measured = acr_trl.measure_acr(sometimes_unscored, num_generations=G)
    assert measured.__name__ == "sometimes_unscored"  # TRL names the reward (rewards/<name>) after it
    args = trl.GRPOConfig(**{**common(assets, "stock"), "save_strategy": "no"})
    tr = trl.GRPOTrainer(model=assets["model"], reward_funcs=[measured], args=args, train_dataset=assets["data"])
    tr.train()
    logs = [rewrite_logs(h) for h in tr.state.log_history if "acr" in h]
    assert len(logs) == 2 and [h["train/acr/all_wrong"] for h in logs] == [0.5, 0.5]
    assert all(h["train/acr"] == 0.5 and h["train/acr/unscored"] == 0.25 and h["train/acr/other"] == 0.0 for h in logs)
    # the rewards pass through: TRL's mean of the scored ones (nanmean), under the function's own name
    assert [h["train/rewards/sometimes_unscored/mean"] for h in logs] == [pytest.approx(2 / 6), pytest.approx(2 / 6)]
    for mistake, message in [
        (1, "num_generations must be an integer >= 2"),
        (2.0, "num_generations must be an integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            acr_trl.measure_acr(correct, num_generations=mistake)
    with pytest.raises(ValueError, match=r"acr\['tol'\] must be > 0, got 0"):
        acr_trl.measure_acr(correct, G, acr={"tol": 0})
    log = []  # called directly: whole groups of the correctness pattern, None as unscored
    out = measured(None, pattern=["b"] * G + ["a"] * G, log_metric=lambda k, v: log.append((k, v)))
    assert out[2] is None and dict(log)["acr/all_wrong"] == 1.0 and dict(log)["acr/unscored"] == 0.25


def test_evaluation_logs_eval_acr_and_leaves_the_controller_alone(assets):
    args = acr_trl.GRPOConfig(**{**common(assets, "eval"), **remedy_kwargs("avspo-stratified"), "save_strategy": "no"})
    tr = Recorder(
        model=assets["model"],
        reward_funcs=correct,
        args=args,
        train_dataset=assets["data"],
        eval_dataset=assets["data"],
    )
    before = tr.controller.state_dict()
    tr.evaluate()
    assert tr.controller.state_dict() == before and tr.controller.steps == 0  # no gate, window or threshold step
    assert len(tr.advantages) == 2  # 4 prompts x G, 2 G per batch
    for rewards, adv in zip(tr.rewards, tr.advantages):  # TRL's own GRPO: evaluation applies no remedy
        expected, _ = group_advantages(grouped(rewards), "grpo", TRL_GRPO)
        assert torch.allclose(adv, expected.reshape(-1), atol=1e-6)
    assert (torch.cat(tr.advantages) == 0).sum() == 2 * G  # the all-right and all-wrong groups: zero
    (logged,) = [h for h in tr.state.log_history if "eval_acr" in h]
    assert logged["eval_acr"] == 0.5 and logged["eval_acr/all_right"] == logged["eval_acr/all_wrong"] == 0.25
    assert not any(k.startswith("eval_acr/gate") for k in logged) and "acr" not in logged


def test_each_process_trains_on_its_slice(assets):
    tr = remedy_run(assets, "avspo-stratified")
    shaped = grouped(tr.rewards[0])  # all-right + mixed; two "processes" of one group each
    ours, _ = group_advantages(shaped, "avspo", remedy_config("avspo-stratified"), tau_adapt=TAU)
    theirs, _ = group_advantages(shaped, "grpo", TRL_GRPO)  # what TRL hands each process
    scored, accelerator = torch.ones(2, dtype=torch.bool), tr.accelerator
    try:
        local = []
        for i in range(2):
            tr.accelerator = SimpleNamespace(process_index=i, num_processes=2)
            local.append(tr._remedy_advantages(theirs[i], ours, shaped, scored, {}))
        with pytest.raises(ValueError, match="expected 3 x 2"):
            tr._local_slice(torch.zeros(8), 3)
    finally:
        tr.accelerator = accelerator
    assert torch.equal(torch.cat(local), torch.cat([ours[0], theirs[1]]))  # remedy on the all-right group only


TWO_PROCESSES = """
import json, os, sys
from datasets import Dataset
from avspo_openrlhf.integrations import trl as acr_trl
G, PATTERNS = %d, %r

def correct(completions, pattern, **_):
    return [float(PATTERNS[p][i %% G]) for i, p in enumerate(pattern)]

class Trainer(acr_trl.GRPOTrainer):
    seen = []
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        sign = out.get(acr_trl.SIGN_KEY)
        self.seen.append({"pattern": inputs[0]["pattern"], "adv": out["advantages"].tolist(),
                          "sign": None if sign is None else sign.tolist()})
        return out

data = Dataset.from_list([{"prompt": f"What is {k}?", "pattern": k} for k in PATTERNS])
args = acr_trl.GRPOConfig(**json.loads(sys.argv[2]))
trainer = Trainer(model=sys.argv[1], reward_funcs=correct, args=args, train_dataset=data)
trainer.train()
with open(os.path.join(args.output_dir, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
    json.dump({"seen": trainer.seen, "processes": trainer.accelerator.num_processes,
               "state": trainer.controller.state_dict(), "logs": trainer.state.log_history}, f)
"""


@pytest.mark.slow
@pytest.mark.parametrize("remedy", ["ngrpo", "rl_zvp"])
def test_two_processes_each_train_on_their_slice(assets, tmp_path, remedy):
    (tmp_path / "two.py").write_text(TWO_PROCESSES % (G, PATTERNS))
    config = {
        **common(assets, "two"),
        **remedy_kwargs(remedy),
        "per_device_train_batch_size": G,
        "output_dir": str(tmp_path),
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(tmp_path / "two.py"), assets["model"], json.dumps(config)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert all(r["processes"] == 2 and len(r["seen"]) == 2 for r in ranks)
    assert ranks[0]["state"] == ranks[1]["state"]  # one controller, stepped on the gathered rewards everywhere
    ref = CollapseController(remedy, remedy_config(remedy), acr=ACRConfig(tau_init=TAU, window=1), seed=0)
    for step in range(2):  # TRL gathers in process order: process i holds group i of the batch
        rewards = torch.tensor([PATTERNS[r["seen"][step]["pattern"]] for r in ranks], dtype=torch.float32)
        expected, _ = ref.step(rewards)
        sign = zero_variance_sign(rewards)
        for i, r in enumerate(ranks):
            assert torch.allclose(torch.tensor(r["seen"][step]["adv"]), expected[i], atol=1e-6), (step, i)
            if remedy == "rl_zvp":  # each process gets its own group's sign, for its own completions
                assert r["seen"][step]["sign"] == [int(sign[i])] * G, (step, i)
    if remedy == "rl_zvp":  # the token advantages' metrics are gathered: every process logs the same
        logged = [
            [h["rl_zvp/zero_variance_samples"] for h in r["logs"] if "rl_zvp/zero_variance_samples" in h] for r in ranks
        ]
        assert logged[0] == logged[1] and len(logged[0]) == 2 and all(x > 0 for x in logged[0])


def test_rl_zvp_over_two_iterations_adds_its_token_advantages_once_per_loss(assets):
    """``num_iterations=2``: TRL trains twice on one buffered generation batch; each loss adds the
    token advantages of its own forward's entropies to the batch's sequence-level advantages, which
    stay as generated (not accumulated across the iterations)."""
    tr = run(assets, "rl_zvp_two_iterations", **remedy_kwargs("rl_zvp"), num_iterations=2)
    assert len(tr.advantages) == 1 and len(tr.zvp) == 2  # one generation, two losses
    generated = tr.advantages[0].sort().values
    for before, after, entropy, mask, sign in tr.zvp:  # TRL reshuffles the buffered batch per iteration
        assert before.dim() == 1 and torch.equal(before.sort().values, generated)
        extra = rl_zvp_token_advantages(entropy, mask, sign, RLZVPConfig.alpha)
        assert torch.allclose(after, before[:, None] + extra, atol=1e-6) and extra.abs().sum() > 0
        assert (extra.abs().sum(dim=1) > 0).sum() == (sign != 0).sum() == G  # the all-right group's rows


# every mistake of the table (and more) -> the one line GRPOConfig(...) refuses it with, naming
# the field the TRL user set; all before a model is loaded
CONFIG_MISTAKES = [
    (dict(use_avspo=True, virtual_sample_alpha=-1), "virtual_sample_alpha must be > 0, got -1"),
    (
        dict(remedy="avspo", remedy_options={"strategy": "bogus"}),
        "remedy_options['strategy'] must be one of exp_decay, fixed_partial, opposite, random_uniform, stratified, got 'bogus'",
    ),
    (dict(acr_threshold_init=2), "acr_threshold_init must be in [0, 1], got 2"),
    (
        dict(remedy="sign", remedy_options={"scoop": "all"}),
        "remedy_options has no option 'scoop'; SignConfig takes scope",
    ),
    (dict(acr_options={"windw": 3}), "acr_options has no option 'windw'; ACRConfig takes early_steps, "),
    (dict(monitor_options={"kl_bund": 0.1}), "monitor_options has no option 'kl_bund'"),
    (dict(remedy="ngrpo", remedy_options='{"num_max": 2'), "remedy_options is not valid JSON: Expecting ',' delimiter"),
    (dict(acr_options="window=3"), "acr_options is not valid JSON: "),
    (
        dict(remedy="sign", virtual_sample_alpha=0.5),
        "virtual_sample_alpha is AVSPO's K rule exponent; remedy='sign' does not use it",
    ),  # its default, set
    (
        dict(remedy="sign", avspo_strategy="opposite"),
        "avspo_strategy is an option of remedy='avspo'; remedy='sign' does not use it",
    ),
    (dict(ngrpo_num_max=2), "ngrpo_num_max is an option of remedy='ngrpo'; remedy=None does not use it"),
    (
        dict(remedy="avspo", avspo_strategy="bogus"),
        "avspo_strategy must be one of exp_decay, fixed_partial, opposite, random_uniform, stratified, got 'bogus'",
    ),
    (
        dict(remedy="avspo", avspo_strategy="opposite", remedy_options={"strategy": "opposite"}),
        "set avspo_strategy, not remedy_options['strategy']",
    ),
    (dict(remedy="rl_zvp", rl_zvp_alpha=0), "rl_zvp_alpha must be > 0, got 0"),
    (
        dict(remedy="rl_zvp", remedy_options={"alpha": 0}),
        "remedy_options['alpha'] must be > 0, got 0",
    ),  # not virtual_sample_alpha: AVSPO's
    (dict(acr_window=0), "acr_window must be >= 1, got 0"),
    (dict(acr_tau_bounds=[0.6, 0.9]), "acr_threshold_init must lie within acr_tau_bounds [0.6, 0.9], got 0.5"),
    (dict(monitor_stop_on_alarm=["kl_drift"]), "monitor_stop_on_alarm names kl_drift, which needs monitor_kl_bound"),
    (
        dict(monitor_options={"stop_on_alarm": ["kl_drift"]}),
        "monitor_options['stop_on_alarm'] names kl_drift, which needs monitor_kl_bound",
    ),
    (
        dict(remedy="sign", virtual_sample_alpha=0.7),
        "virtual_sample_alpha is AVSPO's K rule exponent; remedy='sign' does not use it",
    ),
    (dict(virtual_sample_alpha=0.7), "virtual_sample_alpha is AVSPO's K rule exponent; remedy=None does not use it"),
    (dict(acr_options={"window": 0}), "acr_options['window'] must be >= 1, got 0"),
    (dict(monitor_kl_bound=0.1), "monitor_kl_bound watches TRL's logged kl, which TRL computes only with beta > 0"),
    (dict(monitor_kl_bound=0.1, monitor_kl_source="old", beta=0.01), "monitor_kl_source='old'"),
    (dict(acr_threshold_init=0.95), "acr_threshold_init must lie within acr_tau_bounds [0.1, 0.9], got 0.95"),
    (
        dict(acr_options={"tau_bounds": [0.6, 0.9]}),
        "acr_threshold_init must lie within acr_options['tau_bounds'] [0.6, 0.9], got 0.5",
    ),
    (dict(acr_options={"tau_init": 0.3}), "set acr_threshold_init, not acr_options['tau_init']"),
    (dict(remedy="avspo", remedy_options={"alpha": 0.3}), "set virtual_sample_alpha, not remedy_options['alpha']"),
    (
        dict(remedy="avspo", remedy_options={"eps": 1e-3}),
        "remedy_options['eps'] cannot be set: it follows the framework's GRPO (eps=0.0001), got 0.001",
    ),
    (
        dict(remedy="avspo", remedy_options={"num_virtual": 2, "strategy": "opposite"}),
        "remedy_options['num_virtual'] cannot be combined with remedy_options['strategy'] opposite",
    ),
    (
        dict(remedy="avspo", remedy_options={"r_anchor": "0.2"}),
        "remedy_options['r_anchor'] must be a finite number, got '0.2'",
    ),
    (dict(remedy="ngrpo", remedy_options={"num_max": 0}), "remedy_options['num_max'] must be >= 1, got 0"),
    (dict(remedy="ngrpo", remedy_options={"enable": True}), "remedy_options has no option 'enable'"),
    (dict(remedy="grpo", remedy_options={"x": 1}), "remedy_options has no option 'x'; this remedy takes none"),
    (
        dict(remedy_options={"strategy": "opposite"}),
        "remedy_options has option(s) 'strategy'; measuring only (no remedy) takes none",
    ),
    (dict(monitor_options={"kl_bound": -1}), "monitor_options['kl_bound'] must be >= 0, got -1"),
    (dict(acr_options=[1]), "acr_options must be a dict or a JSON object string, got list"),
    (dict(remedy="avpso"), "unknown remedy 'avpso'"),
    (dict(use_avspo=True, remedy="sign"), "use_avspo=True and remedy='sign' choose two remedies"),
    (
        dict(remedy="avspo", scale_rewards="batch"),
        "remedy 'avspo' normalises per group as TRL's scale_rewards='group' does; got scale_rewards='batch'",
    ),
    (
        dict(remedy="avspo", scale_rewards="none"),
        "remedy 'avspo' normalises per group as TRL's scale_rewards='group' does; got scale_rewards='none'",
    ),  # none: dr_grpo only
    (
        dict(remedy="sign", multi_objective_aggregation="normalize_then_sum"),
        "remedy 'sign' needs multi_objective_aggregation='sum_then_normalize', got 'normalize_then_sum'",
    ),
    (
        dict(remedy="rl_zvp", use_liger_kernel=True),
        "remedy 'rl_zvp' needs TRL's own loss (its token entropies); use_liger_kernel bypasses it",
    ),
]


@pytest.mark.parametrize("config, message", CONFIG_MISTAKES, ids=[str(i) for i in range(len(CONFIG_MISTAKES))])
def test_every_mistake_is_refused_when_the_grpo_config_is_built(assets, config, message):
    with pytest.raises(ValueError) as e:
        acr_trl.GRPOConfig(**config, **common(assets, "bad"))
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_typed_options_are_generated_from_the_configs_and_mean_what_the_dicts_mean(assets):
    """Every option of ACRConfig, MonitorConfig and each registered remedy's config is a typed field
    of GRPOConfig (unset by default, the config's help), except those TRL's GRPO fixes and the
    paper's aliases; TRL's parser reads them, and they build the same configs as the option dicts."""
    fields = {f.name: f for f in dataclasses.fields(acr_trl.GRPOConfig)}
    owners = [("acr", ACRConfig), ("monitor", acr_trl.MonitorConfig)]
    owners += [(name, e.config) for name, e in ESTIMATORS.items() if e.config is not None]
    for owner, cls in owners:
        for f in dataclasses.fields(cls):
            name = f"{owner}_{f.name}"
            skipped = (owner not in ("acr", "monitor") and f.name in acr_trl.FIXED_BY_TRL) or (
                owner,
                f.name,
            ) in acr_trl.ALIASES
            assert (
                (name not in fields)
                if skipped
                else (fields[name].default is None and f.metadata["help"] in fields[name].metadata["help"])
            ), name
    kw = common(assets, "typed")
    argv = ["--remedy", "avspo", "--avspo_strategy", "opposite", "--acr_tau_bounds", "0.2", "0.8", "--acr_window", "3",
            "--monitor_kl_bound", "0.1", "--monitor_stop_on_alarm", "kl_drift", "--beta", "0.01", "--output_dir", kw["output_dir"],
            "--use_cpu", "--bf16", "false", "--num_generations", str(G), "--per_device_train_batch_size", str(2 * G)]  # fmt: skip
    (parsed,) = transformers.HfArgumentParser(acr_trl.GRPOConfig).parse_args_into_dataclasses(argv)
    dicts = acr_trl.GRPOConfig(
        remedy="avspo",
        remedy_options={"strategy": "opposite"},
        monitor_options={"kl_bound": 0.1, "stop_on_alarm": ["kl_drift"]},
        acr_options={"tau_bounds": [0.2, 0.8], "window": 3},
        beta=0.01,
        **kw,
    )
    assert acr_trl._configs(parsed) == acr_trl._configs(dicts)
    assert acr_trl._configs(parsed)[1].strategy == "opposite" and acr_trl._configs(parsed)[2].tau_bounds == (0.2, 0.8)


def test_bad_setups_fail_in_one_line(assets):
    kw = common(assets, "bad")
    assert acr_trl.GRPOConfig(remedy="ngrpo", remedy_options='{"num_max": 2}', **kw).remedy_options == {"num_max": 2}
    ok = acr_trl.GRPOConfig(
        remedy="avspo", acr_threshold_init=1, virtual_sample_alpha=2, acr_options={"tau_bounds": [0, 1]}, **kw
    )
    assert (
        ok.acr_threshold_init == 1 and acr_trl._configs(ok)[2].tau_init == 1.0 and acr_trl._configs(ok)[1].alpha == 2.0
    )
    with pytest.raises(ValueError, match="is not a reward function"):  # what only the trainer knows
        Recorder(
            model=assets["model"],
            reward_funcs=correct,
            args=acr_trl.GRPOConfig(acr_reward_func="accuracy", **kw),
            train_dataset=assets["data"],
        )


# private TRL/transformers names the integration overrides or reads -> why
PRIVATE = {
    "_calculate_rewards": "overridden: keeps the rewards TRL gathered from every process",
    "_generate_and_score_completions": "overridden: steps the controller, replaces the advantages, logs ACR",
    "_compute_loss": "overridden (RL-ZVP): its forward's entropies feed the token advantages",
    "_get_per_token_logps_and_entropies": "overridden (RL-ZVP): returns the entropies of the loss's forward",
    "_save_checkpoint": "overridden: writes controller_state.json into the checkpoint",
    "_load_optimizer_and_scheduler": "overridden: reads controller_state.json on resume",
    "_get_output_dir": "the checkpoint folder, as TRL's own _save_checkpoint finds it",
    "_metrics": "ACR metrics go where TRL's own go (averaged per logging step, eval_ prefixed)",
    "_logs": "the completions table shows the trained advantages",
    "_step": "an optimizer step ended (TRL's training_step counts micro-batches)",
}


def test_the_trl_surface_we_rely_on():
    pin = re.search(r"^trl==(\S+)", (ROOT / "requirements-trl.txt").read_text(), re.M).group(1)
    assert md.version("trl") == pin == acr_trl.TESTED_TRL, "TRL changed: re-check every name below and docs/trl.md"
    theirs = set()
    for module in (grpo_trainer, transformers.trainer):
        theirs |= set(re.findall(r"(?:def |self\.)(_[a-z][a-z0-9_]*)", Path(module.__file__).read_text()))
    ours = set(re.findall(r"\b_[a-z][a-z0-9_]*\b", Path(acr_trl.__file__).read_text()))
    used = ours & theirs
    assert used == set(PRIVATE), (
        f"unlisted: {sorted(used - set(PRIVATE))}; gone or unused: {sorted(set(PRIVATE) - used)}"
    )
    gen = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    for text in (
        "rewards_per_func = self._calculate_rewards(",  # gathered over processes, before the advantages
        "advantages = advantages / (std_rewards + 1e-4)",  # TRL_EPS
        "self.accelerator.process_index * len(prompts)",  # the process slice _local_slice repeats
        '"advantages": advantages,',
        'self._logs["advantages"].extend(all_process_advantages.tolist())',
        'self._metrics[mode]["frac_reward_zero_std"]',
    ):
        assert text in gen, text
    assert nanstd(torch.tensor([0.0, 1.0])).item() == pytest.approx(0.5**0.5)  # Bessel: TRL_STD_CONVENTION
    loss = inspect.getsource(trl.GRPOTrainer._compute_loss)
    forward, read = (
        loss.index("self._get_per_token_logps_and_entropies("),
        loss.index('advantages = inputs["advantages"]'),
    )
    assert forward < read and "compute_entropy=True" in loss[forward:read] and "if advantages.dim() == 1:" in loss
    assert loss.count("self._get_per_token_logps_and_entropies(") == 1  # the loss's one forward
    step = inspect.getsource(trl.GRPOTrainer.training_step)
    assert "self._step += 1" in step and "self.current_gradient_accumulation_steps" in step
    assert 'self._metrics[mode]["entropy"].append(' in inspect.getsource(trl.GRPOTrainer._compute_loss)


def ten_times(completions, pattern, **_):
    """The fixed reward batch on a 0..10 scale."""
    return [10.0 * r for r in correct(completions, pattern)]


@pytest.mark.slow
def test_a_reward_outside_the_declared_range_is_refused(assets):
    """On 0..10 with acr_reward_range left at (0, 1), an all-10 group got advantage -0.789 (an
    all-wrong group's push): now the first batch fails naming the field and the value."""
    args = acr_trl.GRPOConfig(remedy="avspo", **common(assets, "range", steps=1))
    trainer = acr_trl.GRPOTrainer(
        model=assets["model"], reward_funcs=ten_times, args=args, train_dataset=assets["data"]
    )
    with pytest.raises(ValueError, match=r"acr\.reward_range is \(0, 1\) but a raw reward is 10.*acr_reward_range"):
        trainer.train()
    args = acr_trl.GRPOConfig(remedy="avspo", acr_reward_range=[0, 10], **common(assets, "range10", steps=1))
    trainer = acr_trl.GRPOTrainer(
        model=assets["model"], reward_funcs=ten_times, args=args, train_dataset=assets["data"]
    )
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_monitor_stop_on_alarm_stops_training_as_avspo_train_does(assets):
    """The entropy alarm (threshold above any entropy, patience 0) fires at the first optimizer step:
    training stops there, through the Trainer's own control flow, instead of running all 3 steps."""
    args = acr_trl.GRPOConfig(
        monitor_entropy_threshold=100.0,
        monitor_entropy_patience=0,
        monitor_stop_on_alarm=["entropy_collapse"],
        **common(assets, "stop", steps=3),
    )
    trainer = acr_trl.GRPOTrainer(model=assets["model"], reward_funcs=correct, args=args, train_dataset=assets["data"])
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.stop_reason == "alarm entropy_collapse"
    args = acr_trl.GRPOConfig(
        monitor_entropy_threshold=100.0, monitor_entropy_patience=0, **common(assets, "nostop", steps=3)
    )
    trainer = acr_trl.GRPOTrainer(model=assets["model"], reward_funcs=correct, args=args, train_dataset=assets["data"])
    trainer.train()
    assert trainer.state.global_step == 3 and trainer.stop_reason == ""  # the alarm alone does not stop


@pytest.mark.parametrize(
    "kwargs, meant",
    [
        ({"avspo_alpha": 0.5}, "virtual_sample_alpha"),
        ({"acr_tau_init": 0.3}, "acr_threshold_init"),
        ({"acr_windw": 3}, "acr_window"),
    ],
)
def test_an_unknown_keyword_names_the_field_it_likely_meant(assets, kwargs, meant):
    """What --avspo.alpha and --acr.tau_init suggest in TRL's spelling: a TypeError that points to the
    one spelling of those options (or, for a typo, the closest field)."""
    with pytest.raises(TypeError, match=f"unexpected keyword argument {next(iter(kwargs))!r}; did you mean {meant!r}"):
        acr_trl.GRPOConfig(**kwargs, **common(assets, "typo"))
