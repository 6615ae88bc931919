"""The installed policy actor on one GPU in bf16 (NCCL, world size 1, built in this process): the
experience maker runs OpenRLHF's ``make_experience`` against it (log-probs, and for RL-ZVP the
token entropies from that same forward), its advantages are the controller's, and ``ppo_train``
moves every weight, under ZeRO-2 and ZeRO-3, for AVSPO, NGRPO and RL-ZVP."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_support import REMEDY_FLAGS, actor_args, build_actor, needs_cuda_deepspeed, parameters
from local_actors import LocalGroup, in_process_ray, maker_for

G = 4
BATCHES = (
    torch.tensor([[1.0, 0, 1, 0], [1, 1, 1, 1]]),  # a mixed group and an all-right one
    torch.tensor([[0.0, 0, 0, 0], [1, 0, 0, 0]]),  # an all-wrong group and a mixed one
)
LENGTHS = torch.tensor([[4, 6, 5, 3], [6, 2, 4, 5]])


@pytest.fixture(autouse=True)
def _in_process_ray(monkeypatch):
    in_process_ray(monkeypatch)  # the actor lives in this process
    monkeypatch.setenv("LOCAL_RANK", "0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


def _samples(rewards, seed):
    from orl import rollout_samples

    return rollout_samples(rewards, LENGTHS, prompt_len=5, seed=seed)


def _check_rl_zvp(actor, maker, exps, rewards):
    """Token advantages on exactly the zero-variance responses, equal to the controller's on the
    entropies of a separate pass over those responses (bf16: within 5e-3, i.e. 0.05 nats x alpha)."""
    from avspo_openrlhf.algo import zero_variance_sign

    c = maker.controller
    sign = zero_variance_sign(rewards, c.tol, c.reward_range)
    for e in exps:
        group = torch.tensor(e.index) // G
        rows = sign[group] != 0
        if not rows.any():
            continue
        mask, s = e.action_mask[rows], sign[group[rows]]
        h = actor.token_entropy(e.sequences[rows], mask, e.attention_mask[rows])
        want = maker.controller.token_advantages(h, mask, s)
        got = e.advantages[rows] * mask  # the group part is 0 on zero-variance groups (KL is 0 here)
        assert torch.allclose(got.float(), want.float(), atol=5e-3), (got - want).abs().max()
        assert ((got > 0) == ((s > 0)[:, None] & mask)).all()  # all-right: every token pushed up
        assert (got[(s < 0)] <= 0).all()  # all-wrong: pushed down, except each response's max-entropy token


@pytest.mark.parametrize("zero_stage", [2, 3])
@pytest.mark.parametrize("remedy", ["avspo", "ngrpo", "rl_zvp"])
def test_ppo_train_on_the_makers_advantages(tiny, tmp_path, zero_stage, remedy):
    needs_cuda_deepspeed()
    from orl import sample_advantage

    from avspo_openrlhf.trainer.run_settings import controller_from_flags

    flags = [*REMEDY_FLAGS[remedy], "--acr.window", "1", "--acr.tau_init", "0.1"]
    args = actor_args(tiny, str(tmp_path / "ckpt"), zero_stage, *flags, g=G, n=2)
    actor = build_actor(args, tiny)
    assert {p.dtype for p in actor.actor.model.parameters()} == {torch.bfloat16}
    maker = maker_for(args, LocalGroup(actor))
    expected = controller_from_flags(args)  # the same controller, fed the same rewards

    forwards = []
    real_forward = actor.actor.forward
    actor.actor.forward = lambda *a, **k: forwards.append(1) or real_forward(*a, **k)
    before = parameters(actor)
    signal_on_collapsed, first = False, None
    for seed, rewards in enumerate(BATCHES):
        forwards.clear()
        exps = maker.make_experience_batch(_samples(rewards, seed))
        assert len(forwards) == len(exps)  # one forward per micro-batch, RL-ZVP's entropies included
        first = first or [(e.sequences, e.action_mask, e.attention_mask, e.action_log_probs) for e in exps]
        want, _ = expected.step(rewards, rewards)
        got = sample_advantage(exps).reshape(rewards.shape)
        zero_variance = (rewards == rewards[:, :1]).all(dim=1)
        if remedy == "rl_zvp":  # GRPO on the mixed groups, token advantages on the others
            assert torch.allclose(got[~zero_variance], want[~zero_variance].float(), atol=1e-5)
            _check_rl_zvp(actor, maker, exps, rewards)
            assert 0 < maker.last_metrics["rl_zvp/entropy_mean"] < math.log(len(actor.tokenizer))
        else:
            assert torch.allclose(got, want.float(), atol=1e-5), (got, want)
            signal_on_collapsed |= bool((got[zero_variance] != 0).any())
        for e in exps:
            actor.append(e)
        status = actor.fit(kl_ctl=0.0)
        for key in ("policy_loss", "actor_grad_norm"):
            assert math.isfinite(float(status[key])), (key, status)
    assert remedy == "rl_zvp" or signal_on_collapsed  # the remedy gave a collapsed group a signal
    after = parameters(actor)
    still = [k for k in before if torch.equal(before[k], after[k])]
    assert not still, f"parameters that did not move: {still}"
    for seq, amask, attn, old in first:  # the policy's log-probs of the first batch moved with them
        assert not torch.allclose(actor.forward(seq, amask, attn), old)
