"""RL-ZVP's token entropies come from the policy's log-prob forward that ``make_experience`` already
runs (trainer/token_level.py), for the zero-variance responses only: no second forward pass. Checked
with a scripted policy group (fast), then with the tiny model's real policy actor on CPU DeepSpeed
(forward calls per step counted against GRPO's). The OpenRLHF names the hook relies on are guarded
at the end."""

import inspect
import math
import re

import pytest
import torch
from local_actors import LocalGroup, ScriptedPolicyGroup, free_port, in_process_ray, maker_for
from orl import parse, rollout_samples, sample_advantage

pytest.importorskip("openrlhf")

from avspo_openrlhf.algo import CollapseController, RLZVPConfig, zero_variance_sign  # noqa: E402
from avspo_openrlhf.trainer.token_level import KEPT_ENTROPY, TOKEN_REQUEST, zero_variance_rows  # noqa: E402

G = 4
REWARDS = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]])  # all-right, mixed, all-wrong
LENGTHS = torch.tensor([[3, 5, 4, 6], [5, 5, 2, 3], [6, 4, 3, 5]])


@pytest.fixture(autouse=True)
def _in_process(monkeypatch):
    in_process_ray(monkeypatch)


def _args(*flags):
    return parse(
        "--rollout.n_samples_per_prompt",
        str(G),
        "--rollout.batch_size",
        "3",
        "--rollout.micro_batch_size",
        "4",
        "--remedy",
        "rl_zvp",
        *flags,
    )


def test_the_log_prob_forward_brings_the_entropies_of_exactly_the_zero_variance_responses():
    args = _args()
    group = ScriptedPolicyGroup()
    maker = maker_for(args, group)
    exps = maker.make_experience_batch(rollout_samples(REWARDS, LENGTHS))
    assert group.calls == ["forward"] * len(exps)  # one pass per micro-batch, nothing else
    sign = zero_variance_sign(REWARDS)
    got = sample_advantage(exps).reshape(REWARDS.shape)
    want, _ = CollapseController("rl_zvp").step(REWARDS, REWARDS)
    assert torch.allclose(got[1], want[1].float())  # the mixed group: GRPO
    for e in exps:
        assert not hasattr(e, KEPT_ENTROPY)  # used once, not carried into training
        rows = sign[torch.tensor(e.index) // G] != 0
        mask = e.action_mask[rows]
        tokens = e.sequences[rows][:, -mask.shape[1] :].float()
        h = (0.1 + 0.07 * (tokens % 13)) * mask  # what the scripted policy computed for these rows
        want_tokens = maker.controller.token_advantages(h, mask, sign[torch.tensor(e.index) // G][rows])
        assert torch.allclose(e.advantages[rows] * mask, want_tokens, atol=1e-6)
    m = maker.last_metrics
    assert m["rl_zvp/zero_variance_samples"] == 8 and m["rl_zvp/entropy_mean"] > 0


def test_rows_follow_the_shaped_reward_and_missing_entropies_fail_in_one_line():
    # a stop-properly penalty turns the truncated response of the all-right group into a 0: that group
    # becomes mixed (no entropies needed), the all-wrong group stays zero-variance
    args = _args("--reward.stop_properly_penalty_coef", "0")
    samples = rollout_samples(REWARDS, LENGTHS)
    samples[1].truncated = torch.tensor([True])
    group = ScriptedPolicyGroup()
    maker = maker_for(args, group)
    c = maker.controller
    rows = zero_variance_rows(maker.split_rollout_samples(samples), args, c.tol, c.reward_range)
    assert torch.cat(rows).tolist() == [False] * 8 + [True] * 4
    exps = maker.make_experience_batch(samples)
    assert maker.last_metrics["rl_zvp/zero_variance_samples"] == 4
    assert sample_advantage(exps)[:4].abs().sum() > 0  # the no longer collapsed group: GRPO's signal

    plain = maker_for(args, group)
    exps = plain.split_rollout_samples(rollout_samples(REWARDS, LENGTHS))
    for e in exps:  # OpenRLHF's make_experience output without our entropies
        e.action_log_probs, e.kl = torch.zeros(e.action_mask.shape), torch.zeros(e.action_mask.shape)
    with pytest.raises(RuntimeError, match="no token entropies for 4 zero-variance responses"):
        plain.compute_advantages_and_returns(exps)


def _sample_key(seq, attn):
    return tuple(seq[attn.bool()].tolist())


@pytest.mark.slow
@pytest.mark.parametrize("old_pass", ["runs", "skipped"])
def test_rl_zvp_makes_no_forward_pass_beyond_grpos_on_the_tiny_model(tmp_path, monkeypatch, old_pass):
    """The CPU backend's policy actor (OpenRLHF's + our mixins) on DeepSpeed, fp32, as the quickstart
    runs it (one optimizer step per rollout batch, no KL: the old-log-prob pass is skipped) and with
    that pass running (the GPU path's shape, a second optimizer step per batch): per step (experience +
    ppo_train) RL-ZVP calls the model exactly as often as GRPO, and the advantages the loss trains on
    carry the token advantages of a separate entropy pass (``token_entropy``, what RL-ZVP used to run
    in addition) on exactly the zero-variance responses."""
    pytest.importorskip("deepspeed")
    from avspo_openrlhf.cpu.backend import CPUPolicyModelActor
    from avspo_openrlhf.cpu.strategy import cpu_strategy
    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.install import installed

    monkeypatch.setenv("LOCAL_RANK", "0")
    # the actor sets these in os.environ (the loopback store among them): restored after the test, or
    # the processes later tests start (Ray workers of a Slurm job) would wait for this test's store
    for name in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_USE_AGENT_STORE",
    ):
        monkeypatch.setenv(name, "")  # records the value to restore (or that there was none)
        monkeypatch.delenv(name)
    model = build_tiny_model(str(tmp_path / "tiny"))
    batch = "12" if old_pass == "skipped" else "4"  # 4 of 12 samples a step: later steps need the old pass
    args = _args(
        "--actor.model_name_or_path",
        model,
        "--ds.zero_stage",
        "2",
        "--ds.attn_implementation",
        "eager",
        "--train.batch_size",
        batch,
        "--train.micro_batch_size",
        "4",
        "--data.max_len",
        "64",
        "--backend",
        "cpu",
        "--cpu.dtype",
        "fp32",
        "--vllm.sync_backend",
        "gloo",
        "--algo.kl.init_coef",
        "0",
        "--actor.adam.lr",
        "1e-3",
        "--actor.lr_warmup_ratio",
        "0",
    )
    sign = zero_variance_sign(REWARDS)
    with installed(cpu=True), torch.compiler.set_stance("force_eager"):  # CPU workers run without dynamo
        actor = CPUPolicyModelActor(1, 0, "127.0.0.1", free_port())
        actor.init_model_from_pretrained(cpu_strategy(args), model, max_steps=4)
        assert actor.reuse_old is (old_pass == "skipped")
        calls: list[int] = []
        real = actor.actor.forward
        actor.actor.forward = lambda *a, **k: calls.append(1) or real(*a, **k)
        trained = []  # (sample key, advantages) of every row the loss sees
        loss = actor.trainer.actor_loss_fn
        inner = loss.loss if actor.reuse_old else loss
        step = actor.trainer.training_step

        def spy_step(experience, *a, **k):
            keys = [_sample_key(q, m) for q, m in zip(experience.sequences, experience.attention_mask)]
            n_before = len(trained)
            out = step(experience, *a, **k)
            trained[n_before:] = list(zip(keys, trained[n_before:]))
            return out

        def spy_loss(log_probs, old, advantages, *a, **k):
            trained.extend(row[m.bool()].clone() for row, m in zip(advantages, k["action_mask"]))
            return inner(log_probs, old, advantages, *a, **k)

        actor.trainer.training_step = spy_step
        if actor.reuse_old:
            loss.loss = spy_loss
        else:
            actor.trainer.actor_loss_fn = spy_loss
        seen = {}
        for name in ("grpo", "rl_zvp"):
            controller = CollapseController(name, None)
            maker = maker_for(args, LocalGroup(actor), controller=controller)
            assert maker.entropy_in_training is (name == "rl_zvp" and actor.reuse_old)
            calls.clear()
            exps = maker.make_experience_batch(rollout_samples(REWARDS, LENGTHS, prompt_len=5))
            experience_calls = len(calls)
            want, ref_entropy = {}, []
            for e in exps:  # the reference: a separate entropy pass, before the update
                rows = sign[torch.tensor(e.index) // G] != 0
                adv = e.advantages.clone()
                if name == "rl_zvp" and actor.reuse_old and rows.any():
                    mask = e.action_mask[rows]
                    h = actor.token_entropy(e.sequences[rows], mask, e.attention_mask[rows])
                    adv[rows] += controller.token_advantages(h, mask, sign[torch.tensor(e.index) // G][rows])
                    ref_entropy.append(h[mask.bool()])
                elif name == "rl_zvp" and rows.any():  # the pass ran: the maker added them already
                    mask = e.action_mask[rows]
                    h = actor.token_entropy(e.sequences[rows], mask, e.attention_mask[rows])
                    got = e.advantages[rows] * mask  # the group part is 0 there (KL 0)
                    want_tokens = controller.token_advantages(h, mask, sign[torch.tensor(e.index) // G][rows])
                    assert torch.allclose(got, want_tokens, atol=1e-5)
                for q, m, am, a in zip(e.sequences, e.attention_mask, e.action_mask, adv):
                    want[_sample_key(q, m)] = a[am.bool()]
            del calls[experience_calls:]
            trained.clear()
            for e in exps:
                actor.append(e)
            status = actor.fit(kl_ctl=0.0)
            assert math.isfinite(float(status["policy_loss"]))
            assert TOKEN_REQUEST not in status  # taken out of info before OpenRLHF logs it
            if ref_entropy:  # the training forward's entropies are logged as the maker's would be
                assert status["rl_zvp/entropy_mean"] == pytest.approx(float(torch.cat(ref_entropy).mean()), rel=1e-4)
                assert status["rl_zvp/token_adv_abs_mean"] > 0
            assert len(trained) == len(want)
            assert sorted(k for k, _ in trained) == sorted(want)
            for key, a in trained:
                assert torch.allclose(a, want[key], atol=1e-5), key
            seen[name] = (experience_calls, len(calls))
    assert seen["rl_zvp"] == seen["grpo"], seen
    assert seen["grpo"][0] == (0 if actor.reuse_old else len(exps))  # one forward per micro-batch, or none


# ── the OpenRLHF names the entropy hook relies on ──


def test_make_experience_still_sends_the_policys_forward_through_the_two_hooks():
    """``RemedyExperienceMaker`` overrides ``_dispatch_forward`` (adds ``entropy_rows`` to the
    policy's forward) and ``_flatten_results`` (splits ``ForwardWithEntropy``): OpenRLHF's
    ``make_experience`` must still call both, in that order, for the policy's log-probs."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    src = inspect.getsource(RemoteExperienceMaker.make_experience)
    dispatch = re.search(r"(\w+) = self\._dispatch_forward\(\s*self\.actor_model_group,", src)
    assert dispatch, "make_experience no longer dispatches the policy's forward through _dispatch_forward"
    assert re.search(rf"self\._flatten_results\({dispatch.group(1)}, ", src)
    for name, params in (
        ("_dispatch_forward", ["self", "group", "sync_condition", "kwargs"]),
        ("_flatten_results", ["self", "refs", "duplicate_factor"]),
    ):
        assert list(inspect.signature(getattr(RemoteExperienceMaker, name)).parameters) == params, name
    body = inspect.getsource(RemoteExperienceMaker._dispatch_forward)
    assert 'async_run_method_batch(method_name="forward", **kwargs)' in body  # our kwarg reaches the actors


def test_the_policy_actor_forward_and_actor_still_take_what_the_mixin_passes():
    from openrlhf.models import Actor
    from openrlhf.trainer.ray.launcher import BaseModelActor
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

    from avspo_openrlhf.trainer.token_level import TokenEntropyMixin

    def params(fn):  # Ray's tracing adds _ray_trace_ctx to an actor class's methods
        return [p for p in inspect.signature(fn).parameters if p != "_ray_trace_ctx"]

    theirs = params(PolicyModelActor.__ray_actor_class__.forward)
    ours = params(TokenEntropyMixin.forward)
    assert ours == [*theirs, "entropy_rows"]  # the mixin passes OpenRLHF's arguments on positionally
    actor_params = inspect.signature(Actor.forward).parameters
    assert {"return_output", "return_entropy", "ring_attn_group"} <= set(actor_params)
    assert "sample_kwargs = {param_name: param_value[i]" in inspect.getsource(BaseModelActor.execute_batch)


def test_rl_zvp_config_alpha_reaches_the_token_advantages():
    c = CollapseController("rl_zvp", RLZVPConfig(alpha=0.2))
    h, mask = torch.tensor([[0.5, 1.0]]), torch.ones(1, 2, dtype=torch.bool)
    assert torch.allclose(c.token_advantages(h, mask, torch.tensor([1], dtype=torch.int8)), 0.2 * h)


@pytest.mark.parametrize("packing", [False, True])
def test_the_rows_entropies_equal_openrlhfs_return_entropy(tmp_path, packing):
    """``log_probs_and_entropy`` on OpenRLHF's ``Actor`` (tiny model, fp32): the same log-probs as its
    plain forward, and for the requested rows the entropies of its own ``return_entropy``, padded or
    packed."""
    from openrlhf.models import Actor

    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.trainer.token_level import log_probs_and_entropy

    actor = (
        Actor(
            build_tiny_model(str(tmp_path / "tiny")),
            attn_implementation="eager",
            param_dtype="bf16",
            packing_samples=packing,
        )
        .float()
        .eval()
    )
    gen = torch.Generator(device="cpu").manual_seed(0)
    seq = torch.randint(5, 300, (4, 12), generator=gen, device="cpu")
    action_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 3 + [0] * 4], dtype=torch.bool)
    attention_mask = torch.cat([torch.ones(4, 5, dtype=torch.long), action_mask.long()], dim=1)
    seq = seq * attention_mask  # right padding with token 0
    rows = torch.tensor([True, False, True, True])
    # OpenRLHF's compute_entropy is torch.compile'd: eager here, the same function without the build
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        log_probs, entropy = log_probs_and_entropy(actor, seq, action_mask, attention_mask, rows)
        want_log_probs, out = actor(seq, action_mask, attention_mask, return_output=True, return_entropy=True)
    want = out.entropy[:, -action_mask.shape[1] :][rows] * action_mask[rows]
    assert torch.allclose(log_probs, want_log_probs)
    assert entropy.shape == (3, 7) and torch.allclose(entropy, want, atol=1e-5)
    assert (entropy[action_mask[rows]] > 0).all() and (entropy[~action_mask[rows]] == 0).all()


def test_training_step_still_calls_forward_then_loss_then_logs_info():
    """``TokenLevelTraining`` replaces ``training_step`` on the trainer instance (``ppo_train``
    calls ``self.training_step``), takes its key out of ``experience.info`` before OpenRLHF logs
    ``info``, and relies on the policy's forward running before the loss, which gets the
    advantages third."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    assert "status = self.training_step(experience, kl_ctl, step, loss_batch_info)" in inspect.getsource(
        ActorPPOTrainer.ppo_train
    )
    src = inspect.getsource(ActorPPOTrainer.training_step)
    forward = src.index("action_log_probs, output = self.actor(")
    loss = src.index(
        "self.actor_loss_fn(\n            action_log_probs,\n            old_action_log_probs,\n            advantages,"
    )
    info = src.index("for k, v in experience.info.items():")
    assert forward < loss < info
