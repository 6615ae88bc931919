"""``CrashSafeStrategy`` on one GPU (bf16, ZeRO-2, ``--ckpt.max_num 1``): a checkpoint written after a
trained step, then a half-written one planted after it (``latest`` naming it, as a kill during a
save leaves it). A new actor with ``--ckpt.load_enable`` resumes from the complete one: controller
state, parameters, Adam moments and scheduler identical."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from gpu_support import actor_args, build_actor, needs_cuda_deepspeed, parameters
from local_actors import LocalGroup, in_process_ray, maker_for

pytestmark = pytest.mark.gpu


def _optimizer_state(actor) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (DeepSpeed's ZeRO wrapper holds the fp32 Adam moments)."""
    inner = getattr(actor.actor_optim, "optimizer", actor.actor_optim)
    out = []
    for state in inner.state_dict()["state"].values():
        out += [v.detach().float().cpu().clone() for _, v in sorted(state.items()) if torch.is_tensor(v)]
    return out


def test_resume_skips_a_half_written_checkpoint(tmp_path, monkeypatch):
    needs_cuda_deepspeed()
    from orl import rollout_samples

    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.trainer.checkpoint import COMPLETE
    from avspo_openrlhf.trainer.trainers import STATE_KEY

    in_process_ray(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "0")
    model = build_tiny_model(str(tmp_path / "tiny"))
    ckpt = str(tmp_path / "ckpt")
    args = actor_args(
        model, ckpt, 2, "--remedy", "avspo", "--acr.window", "1", "--acr.tau_init", "0.1", "--ckpt.max_num", "1"
    )
    actor = build_actor(args, model)
    maker = maker_for(args, LocalGroup(actor))
    rewards = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 1]])
    for e in maker.make_experience_batch(rollout_samples(rewards, prompt_len=5)):
        actor.append(e)
    actor.fit(kl_ctl=0.0)
    state = {"controller": maker.controller.state_dict(), "counters": {"trained_batches": 1}}
    actor.save_checkpoint("global_step1", client_states={"global_step": 1, "episode": 0, STATE_KEY: state})
    saved = os.path.join(ckpt, "_actor")
    assert os.path.exists(os.path.join(saved, "global_step1", COMPLETE))

    torn = os.path.join(saved, "global_step2")  # a kill during the next save: files, no marker
    os.makedirs(torn)
    with open(os.path.join(torn, "mp_rank_00_model_states.pt"), "wb") as f:
        f.write(b"\0" * 100)
    with open(os.path.join(saved, "latest"), "w") as f:
        f.write("global_step2")

    args2 = copy.deepcopy(args)
    args2.ckpt.load_enable = True
    resumed = build_actor(args2, model)
    loaded = resumed.get_checkpoint_states()
    assert loaded["global_step"] == 1
    assert json.dumps(loaded[STATE_KEY], sort_keys=True) == json.dumps(state, sort_keys=True)
    want, got = parameters(actor), parameters(resumed)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    moments, resumed_moments = _optimizer_state(actor), _optimizer_state(resumed)
    assert moments and len(moments) == len(resumed_moments)
    assert all(torch.equal(a, b) for a, b in zip(moments, resumed_moments))
    assert any(a.abs().sum() > 0 for a in moments)  # the moments of a trained step, not zeros
    assert resumed.actor_scheduler.state_dict() == actor.actor_scheduler.state_dict()
