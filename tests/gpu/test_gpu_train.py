"""A real ``avspo-train --backend gpu`` run of the tiny model on this machine's GPU(s): the README's GPU
command with one actor, one vLLM engine, a reference model, a few steps. It needs vLLM and Ray
(a bare machine with the wheel bundle of docs/gpu.md has neither: skipped, with that reason).

Weight sync is checked through the engine's own log-probs: the engine returns them for every
sampled token (``--algo.advantage.is_correction_level token``) and OpenRLHF logs their gap to the
policy's (``vllm_kl``). The policy moves away from the reference every step (``logprobs_diff``),
so an engine that missed a sync would fall behind by that much; at every step it stays within bf16
noise of the trained policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray_stand_in
import torch
from gpu_support import needs

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _real_vllm_and_ray():
    needs("vllm", "ray", "deepspeed", "openrlhf")
    import vllm

    if ray_stand_in.is_stand_in() or getattr(vllm, "__avspo_cpu_stub__", False):
        pytest.skip("needs vLLM and Ray installed (this process runs stand-ins for them)")


def _argv(tmp_path: Path, *extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    import test_gpu_path

    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    rows = synthetic_arithmetic(4 * STEPS, ["add1"], seed=0)
    for r in rows:
        r["prompt"] = make_prompt(r["problem"])
    write_jsonl(rows, str(tmp_path / "data.jsonl"))
    set_to = {
        "--actor.model_name_or_path": build_tiny_model(str(tmp_path / "tiny")),
        "--data.prompt_dataset": str(tmp_path / "data.jsonl"),
        "--reward.remote_url": str(ROOT / "tests" / "fixtures" / "hash_reward.py"),
        "--actor.num_gpus_per_node": "1",
        "--vllm.num_engines": "1",
        "--vllm.gpu_memory_utilization": "0.2",
        "--rollout.n_samples_per_prompt": "4",
        "--rollout.batch_size": "4",
        "--rollout.micro_batch_size": "4",
        "--train.batch_size": "16",
        "--train.micro_batch_size": "4",
        "--data.max_samples": str(4 * STEPS),
        "--rollout.max_new_tokens": "16",
        "--data.max_len": "96",
        "--actor.adam.lr": "1e-2",
        "--algo.kl.init_coef": "0.001",
        "--acr.window": "1",
        "--logger.tensorboard_dir": str(tmp_path / "tb"),
        "--ckpt.path": str(tmp_path / "ckpt"),
        "--ckpt.output_dir": str(tmp_path / "final"),
    }
    argv = test_gpu_path.readme_gpu_command()
    for flag, value in set_to.items():
        argv = test_gpu_path._replace(argv, flag, value) if flag in argv else [*argv, flag, value]
    argv = [a for a in argv if a not in ("--ckpt.load_enable", "--actor.gradient_checkpointing_enable", *drop)]
    return [*argv, "--ds.attn_implementation", "sdpa", "--algo.advantage.is_correction_level", "token",
            "--report.dir", str(tmp_path / "report"), *extra]  # fmt: skip


def _train_and_read(tmp_path: Path, *extra: str, drop: tuple[str, ...] = ()) -> list[dict]:
    from avspo_openrlhf.report import read_metrics

    env = {**os.environ, "DS_ACCELERATOR": "cuda", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [
        sys.executable,
        "-c",
        "from avspo_openrlhf.cli.train import main; main()",
        *_argv(tmp_path, *extra, drop=drop),
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows, _ = read_metrics(str(tmp_path / "report" / "metrics.jsonl"))
    return rows


def _check_engine_follows_the_policy(rows: list[dict]) -> None:
    assert len(rows) >= STEPS - 1, rows

    def metric(row, name):
        keys = [k for k in row if k.split("/")[-1] == name]
        assert keys, f"{name} not logged: {sorted(row)}"
        return row[keys[0]]

    moved = [abs(metric(r, "logprobs_diff")) for r in rows]
    gap = [abs(metric(r, "vllm_kl")) for r in rows]
    # from the second step on (after a sync) the policy sits away from the reference, and the engine's
    # log-probs sit with the policy: an engine that missed a sync would be off by about that much
    assert min(moved[1:]) > 1e-3, moved
    assert all(g < m / 4 for g, m in zip(gap[1:], moved[1:])), (gap, moved)


def test_colocated_sync_run_syncs_the_engine_every_step(tmp_path):
    _real_vllm_and_ray()
    _check_engine_follows_the_policy(_train_and_read(tmp_path))


def test_async_run_syncs_the_engine_every_step(tmp_path):
    _real_vllm_and_ray()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: OpenRLHF's async mode does not colocate the vLLM engine with the actor")
    colocation = ("--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep")
    rows = _train_and_read(tmp_path, "--train.async_enable", "--train.colocate_actor_ref", drop=colocation)
    _check_engine_follows_the_policy(rows)
