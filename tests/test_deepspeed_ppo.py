"""OpenRLHF's real PolicyModelActor / ActorPPOTrainer.ppo_train on CPU DeepSpeed ZeRO-2 (gloo)
consuming AVSPO advantages, with KL as a k3 loss, clip-higher and the token-level loss; then our
state through OpenRLHF's checkpoint (save, load with --ckpt.load_enable, identical continuation)."""

import copy
import json
import socket

import pytest
import torch
from orl import make_maker, parse, rollout_samples

pytest.importorskip("deepspeed")
pytest.importorskip("openrlhf")

from deepspeed import DeepSpeedEngine  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor  # noqa: E402

from avspo_openrlhf.cpu.strategy import cpu_strategy  # noqa: E402
from avspo_openrlhf.cpu.tiny import build_tiny_model  # noqa: E402
from avspo_openrlhf.install import installed  # noqa: E402
from avspo_openrlhf.trainer.experience_maker import RemedyExperienceMaker  # noqa: E402
from avspo_openrlhf.trainer.trainers import STATE_KEY  # noqa: E402

pytestmark = pytest.mark.slow


def _port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _actor(args, model, port):
    actor = PolicyModelActor.__ray_actor_class__(1, 0, "127.0.0.1", port)
    actor.init_model_from_pretrained(cpu_strategy(args), model, max_steps=4)  # as the CPU backend
    return actor


# ZeRO-2 as OpenRLHF's default; ZeRO-0 as the quickstart's (one DeepSpeed process: nothing to partition)
@pytest.mark.parametrize(("cpu_dtype", "zero_stage"), [("bf16", 2), ("fp32", 2), ("fp32", 0)])
def test_ppo_train_on_cpu_deepspeed_with_avspo_and_checkpointed_state(tmp_path, monkeypatch, cpu_dtype, zero_stage):
    monkeypatch.setenv("LOCAL_RANK", "0")
    model = build_tiny_model(str(tmp_path / "tiny"))
    g, n = 4, 2
    flags = [
        "--actor.model_name_or_path", model, "--ds.zero_stage", str(zero_stage), "--ds.attn_implementation", "eager",
        "--rollout.n_samples_per_prompt", str(g), "--rollout.batch_size", str(n), "--rollout.micro_batch_size", "4",
        "--train.batch_size", "8", "--train.micro_batch_size", "4", "--data.max_len", "64",
        "--remedy", "avspo", "--acr.window", "1", "--acr.tau_init", "0.1",
        "--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--algo.kl.init_coef", "0.01",
        "--actor.eps_clip_low_high", "0.2", "0.28", "--actor.loss_agg_mode", "token-mean",
        "--backend", "cpu", "--cpu.dtype", cpu_dtype,
        "--vllm.sync_backend", "gloo", "--ckpt.path", str(tmp_path / "ckpt"), "--actor.adam.lr", "1e-2", "--actor.lr_warmup_ratio", "0",
    ]  # fmt: skip
    args = parse(*flags, base=["--reward.remote_url", "r.py", "--actor.num_gpus_per_node", "1",
                               "--algo.advantage.estimator", "group_norm"])  # fmt: skip
    assert args.ds.param_dtype == cpu_dtype  # --cpu.dtype replaces OpenRLHF's GPU-only bf16/fp16 choice
    rewards = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 1]])  # one all-right group: AVSPO gives it a signal
    with installed(cpu=True):
        actor = _actor(args, model, _port())
        want = {"bf16": torch.bfloat16, "fp32": torch.float32}[cpu_dtype]
        assert {p.dtype for p in actor.actor.model.parameters()} == {want}
        assert actor.actor.model.bfloat16_enabled() == (cpu_dtype == "bf16")  # DeepSpeed's engine
        # under ZeRO's wrapper, torch's fused AdamW (cpu/strategy.py), not DeepSpeed's compiled FusedAdam
        inner = getattr(actor.actor_optim, "optimizer", actor.actor_optim)  # ZeRO-0: AdamW unwrapped
        assert type(inner) is torch.optim.AdamW and inner.defaults["fused"] is True, inner
        maker = make_maker(args, RemedyExperienceMaker, kl_coef=0.0)
        exps = maker.split_rollout_samples(rollout_samples(rewards))
        for e in exps:  # what make_experience attaches: current and reference log-probs
            logp = actor.forward(e.sequences, e.action_mask, e.attention_mask)
            e.action_log_probs, e.base_action_log_probs = logp, logp.clone()
            e.kl = torch.zeros_like(logp)
        exps = maker.compute_advantages_and_returns(exps)
        assert maker.last_metrics["gate_open"] == 1.0 and maker.last_metrics["acr_effective"] == 0.0
        assert (exps[0].advantages[:4][exps[0].action_mask[:4]] > 0).all()  # all-right group pushed up

        before = {k: v.detach().float().clone() for k, v in actor.actor.model.named_parameters()}
        calls, reduce = [], DeepSpeedEngine.allreduce_gradients
        if zero_stage == 0:  # a world of one skips DeepSpeed's gradient all-reduce (cpu/strategy.py)
            assert actor.actor.model.enable_backward_allreduce is False
            twin = _actor(args, model, _port())
            twin.actor.model.enable_backward_allreduce = True  # forced back on: the update ours must equal
            for e in copy.deepcopy(exps):
                twin.append(e)

            def counted(engine, *a, **k):
                calls.append(engine)
                return reduce(engine, *a, **k)

            monkeypatch.setattr(DeepSpeedEngine, "allreduce_gradients", counted)
            torch.manual_seed(0)  # ppo_train shuffles the micro-batches: the same order for both
            twin.fit(kl_ctl=0.01)
            assert calls and set(calls) == {twin.actor.model}  # the attribute decides whether DeepSpeed all-reduces
            calls.clear()
        for e in exps:
            actor.append(e)
        torch.manual_seed(0)
        status = actor.fit(kl_ctl=0.01)
        if zero_stage == 0:
            assert calls == []
            for (name, p), q in zip(actor.actor.model.named_parameters(), twin.actor.model.parameters()):
                assert torch.equal(p, q), name  # bit for bit the update of the all-reduced gradient
        for key in ("policy_loss", "kl", "ppo_clip_ratio", "entropy_loss", "actor_grad_norm"):
            assert key in status and torch.isfinite(torch.tensor(float(status[key]))), key
        changed = sum(not torch.equal(before[k], v.detach().float()) for k, v in actor.actor.model.named_parameters())
        assert changed > 0

        # our state rides in OpenRLHF's checkpoint client_states and comes back on --ckpt.load_enable
        state = {"controller": maker.controller.state_dict(), "counters": {"trained_batches": 1}}
        actor.save_checkpoint("global_step1", client_states={"global_step": 1, "episode": 0, STATE_KEY: state})
        args2 = copy.deepcopy(args)
        args2.ckpt.load_enable = True
        again = _actor(args2, model, _port())
        loaded = again.get_checkpoint_states()
        # the weights and Adam's moments come back exactly
        for (name, p), q in zip(actor.actor.model.named_parameters(), again.actor.model.parameters()):
            assert torch.equal(p, q), name
        moments = [getattr(a.actor_optim, "optimizer", a.actor_optim).state.values() for a in (actor, again)]
        saved, back = ([t for st in m for t in st.values() if torch.is_tensor(t)] for m in moments)
        assert saved and len(saved) == len(back) and all(torch.equal(a, b) for a, b in zip(saved, back))
    assert loaded["global_step"] == 1
    assert json.dumps(loaded[STATE_KEY], sort_keys=True) == json.dumps(state, sort_keys=True)

    resumed = make_maker(copy.deepcopy(args), RemedyExperienceMaker)
    resumed.controller.load_state_dict(loaded[STATE_KEY]["controller"])
    nxt = torch.tensor([[0.0, 0, 0, 0], [1, 1, 1, 1]])
    a1, m1 = maker.controller.step(nxt)
    a2, m2 = resumed.controller.step(nxt)
    assert torch.equal(a1, a2) and m1 == m2
