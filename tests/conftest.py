"""Test-wide setup: OpenRLHF imports flash_attn/vllm at module top; on CPU the missing ones are
replaced by stand-ins (the single place this happens for tests)."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")

from avspo_openrlhf.cpu.compat import install_gpu_module_stubs  # noqa: E402

install_gpu_module_stubs()


import sys  # noqa: E402

import pytest  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module", autouse=True)
def _no_ray_cluster_outlives_its_module(request):
    """A Ray cluster that a test module starts in this process is its own to end: one left running
    (``ray.get`` auto-starts one) outlived the whole session, and its threads were torn down by the
    interpreter's exit while still running."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} left a Ray cluster running; ended here", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _process_group_ends_before_exit():
    """The gloo group of the in-process DeepSpeed actors (test_deepspeed_ppo, test_reliability,
    test_rl_zvp_entropy) is one for the session: DeepSpeed keeps the groups it derives from it, so a
    module that ended it broke the next module's actors. It ends here, after the last test, not in the
    interpreter's exit, where its threads were torn down while running (CI's exit 139, every test passed)."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def study_assets(tmp_path_factory):
    """What the study loop's and engines' tests train on: the tiny random model, 8 training problems
    (add1, mul1) and 6 held-out ones."""
    from avspo_openrlhf.cpu.models import prepare
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import synthetic_arithmetic

    root = tmp_path_factory.mktemp("study")
    model = prepare("tiny", str(root / "tiny"))
    train, heldout = str(root / "train.jsonl"), str(root / "heldout.jsonl")
    write_jsonl(synthetic_arithmetic(8, ["add1", "mul1"], seed=0), train)
    write_jsonl(synthetic_arithmetic(6, ["add1", "mul1"], seed=1000), heldout)
    return {"model": model, "train": train, "heldout": heldout}


@pytest.fixture
def study_rewards(monkeypatch):
    """The test rewards (tests/study_reward.py) importable in this process; the runs a test starts in
    another process get them through PYTHONPATH."""
    monkeypatch.syspath_prepend(TESTS)
