"""The algorithm layer under another default device: ``meta`` stands in for CUDA on a CPU machine (a
tensor the library makes without naming its device lands there and cannot be computed with, nor
become a generator's state). tests/gpu/test_gpu_parity.py runs the same checks under CUDA."""

import torch
from device_checks import default_device, every_estimator, greso_round_trip


def test_greso_state_round_trip_under_a_meta_default_device():
    want_a, want_b, want_draw_a, want_draw_b = greso_round_trip()
    with default_device("meta"):
        a, b, draw_a, draw_b = greso_round_trip()
    assert torch.get_default_device().type == "cpu"  # restored
    assert (
        a == b == want_a == want_b
    )  # generator state included (it used to raise "RNG state must be a torch.ByteTensor")
    assert torch.equal(draw_a, draw_b) and torch.equal(draw_a, want_draw_a) and draw_a.device.type == "cpu"


def test_every_estimator_on_explicit_cpu_rewards_under_a_meta_default_device():
    want = every_estimator("cpu")
    with default_device("meta"):
        got = every_estimator("cpu")
    assert set(got) == set(want) and len(got) >= 6 and "rl_zvp/tokens" in got
    for key, (adv, info) in got.items():
        assert torch.equal(adv, want[key][0]), key
        assert info["acr"] == want[key][1]["acr"], key
