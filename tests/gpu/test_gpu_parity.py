"""The experience maker's advantages with CUDA-resident experiences equal those on CPU, for every
registered estimator and for OpenRLHF's own (measure-only) path; RL-ZVP's token entropies travel
with the experiences (``Experience.to_device``). The algorithm layer under ``cuda`` as torch's
default device: every estimator on explicit-device rewards, GRESO's state round trip."""

from __future__ import annotations

import copy

import pytest
import torch
from device_checks import default_device, every_estimator, greso_round_trip
from local_actors import ScriptedPolicyGroup, in_process_ray, maker_for

pytestmark = pytest.mark.gpu

G = 4
REWARDS = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [0.5, 0, 1, 1], [0, 0, 0, 0]])
LENGTHS = torch.tensor([[3, 5, 4, 6], [5, 5, 2, 3], [6, 4, 3, 5], [2, 2, 6, 4], [4, 3, 5, 6]])


def _estimators():
    from avspo_openrlhf.algo import ESTIMATORS

    return [None, *sorted(ESTIMATORS)]


@pytest.mark.parametrize("estimator", _estimators(), ids=lambda e: e or "openrlhf")
def test_experience_maker_cpu_cuda_parity(estimator, monkeypatch):
    from orl import parse, rollout_samples

    from avspo_openrlhf.algo import CollapseController

    in_process_ray(monkeypatch)
    args = parse(
        "--rollout.n_samples_per_prompt", str(G), "--rollout.batch_size", "5", "--rollout.micro_batch_size", "4"
    )
    made = {}
    for device in ("cpu", "cuda"):
        maker = maker_for(args, ScriptedPolicyGroup(), controller=CollapseController(estimator, seed=2))
        maker.kl_ctl.value = 0.01
        exps = maker.make_experience(maker.split_rollout_samples(rollout_samples(REWARDS, LENGTHS, seed=1)))
        gen = torch.Generator(device="cpu").manual_seed(5)
        for e in exps:  # what a reference model would add: a per-token KL (CPU, as OpenRLHF keeps it)
            e.kl = torch.rand(e.action_mask.shape, generator=gen) * 0.1 * e.action_mask
        exps = [e.to_device(device) for e in copy.deepcopy(exps)]
        exps = maker.compute_advantages_and_returns(exps)
        assert {e.advantages.device.type for e in exps} == {device}
        made[device] = ([e.advantages.float().cpu() for e in exps], maker.last_metrics)
    (cpu, cpu_metrics), (gpu, gpu_metrics) = made["cpu"], made["cuda"]
    for a, b in zip(gpu, cpu, strict=True):  # micro-batches differ in length: one by one
        assert torch.allclose(a, b, atol=2e-6), (a - b).abs().max()
    assert sum(float(a.abs().sum()) for a in cpu) > 0
    assert gpu_metrics.keys() == cpu_metrics.keys()
    for k, v in cpu_metrics.items():
        assert gpu_metrics[k] == pytest.approx(v, abs=1e-6, nan_ok=True), k
    if estimator == "rl_zvp":
        assert cpu_metrics["rl_zvp/zero_variance_samples"] == 12


def test_every_estimator_under_a_cuda_default_device():
    want = every_estimator("cpu")
    with default_device("cuda"):
        on_cpu = every_estimator("cpu")
        on_cuda = every_estimator("cuda")
    for key, (adv, info) in want.items():
        assert torch.equal(on_cpu[key][0], adv), key
        assert torch.allclose(on_cuda[key][0], adv, atol=2e-6), key
        assert on_cuda[key][1]["acr"] == pytest.approx(info["acr"]), key


def test_greso_state_round_trip_under_a_cuda_default_device():
    want = greso_round_trip()
    with default_device("cuda"):
        a, b, draw_a, draw_b = greso_round_trip()
    assert a == b == want[0]
    assert torch.equal(draw_a, draw_b) and torch.equal(draw_a, want[2]) and draw_a.device.type == "cpu"
