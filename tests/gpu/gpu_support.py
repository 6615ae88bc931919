"""What the GPU tests share: complete args from the real parser for a one-GPU bf16 run of the tiny
model, the installed policy actor built in this process, its parameters gathered."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from local_actors import free_port

BASE = ["--reward.remote_url", "r.py", "--actor.num_gpus_per_node", "1", "--algo.advantage.estimator", "group_norm"]
REMEDY_FLAGS = {
    "grpo": [],
    "avspo": ["--remedy", "avspo"],
    "ngrpo": ["--remedy", "ngrpo"],
    "rl_zvp": ["--remedy", "rl_zvp"],
}


def actor_args(model: str, ckpt: str, zero_stage: int, *flags: str, g: int = 4, n: int = 2):
    """Flags of a one-GPU bf16 run of the tiny model: ``n`` prompts x ``g`` samples, one optimizer
    step per batch (two micro-batches), a learning rate that moves every weight."""
    from orl import parse

    return parse(
        "--actor.model_name_or_path",
        model,
        "--ds.zero_stage",
        str(zero_stage),
        "--ds.param_dtype",
        "bf16",
        "--ds.attn_implementation",
        "sdpa",
        "--rollout.n_samples_per_prompt",
        str(g),
        "--rollout.batch_size",
        str(n),
        "--rollout.micro_batch_size",
        "4",
        "--train.batch_size",
        str(g * n),
        "--train.micro_batch_size",
        "4",
        "--data.max_len",
        "64",
        "--actor.adam.lr",
        "1e-2",
        "--actor.lr_warmup_ratio",
        "0",
        "--ckpt.path",
        ckpt,
        "--vllm.sync_backend",
        "nccl",
        *flags,
        base=BASE,
    )


def build_actor(args, model: str, max_steps: int = 8):
    """Our installed policy actor class (what ``train(args)`` starts as a Ray actor), built in this
    process with the crash-safe strategy ``train(args)`` gets (NCCL, world size 1)."""
    from avspo_openrlhf.trainer.actors import RemedyPolicyModelActor
    from avspo_openrlhf.trainer.checkpoint import crash_safe_strategy

    actor = RemedyPolicyModelActor.__ray_actor_class__(1, 0, "127.0.0.1", free_port())
    actor.init_model_from_pretrained(crash_safe_strategy(args), model, max_steps=max_steps)
    return actor


def parameters(actor) -> dict[str, torch.Tensor]:
    """Full fp32 copies of the actor's parameters (ZeRO-3 gathers its shards first)."""
    import deepspeed

    model = actor.actor.model
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), enabled=actor.strategy.args.ds.zero_stage == 3):
        return {k: v.detach().float().cpu().clone() for k, v in params.items()}


def needs(*modules: str) -> None:
    """Skip (with the missing module's name) unless every module is importable."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed)")


def needs_cuda_deepspeed() -> None:
    needs("deepspeed", "openrlhf")
    from deepspeed.accelerator import get_accelerator

    name = get_accelerator().device_name()
    if name != "cuda":
        pytest.skip(
            f"DeepSpeed's accelerator is {name!r}: run the GPU suite alone (pytest -m gpu) or set DS_ACCELERATOR=cuda"
        )
