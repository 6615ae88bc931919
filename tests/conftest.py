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
def _no_cluster_outlives_its_module(request):
    """A Ray cluster or a torch.distributed group that a test module starts in this process is its own
    to end. Left to the interpreter's exit, their threads (gloo's loops, Ray's core worker) were torn
    down while still running, and the suite, every test passed, died with a segfault (exit 139)."""
    yield
    left = []
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        left.append("a Ray cluster")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        left.append("a torch.distributed process group")
    if left:
        pytest.fail(f"{request.node.nodeid} left {' and '.join(left)} running; ended here", pytrace=False)


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
