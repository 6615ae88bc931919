"""Shared test helpers: where the shared data lives."""

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_file(name: str) -> str:
    """Path of a file in ../shared/data; skipped off CI when absent, a failure on CI."""
    path = SHARED_DATA / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing on CI")
        pytest.skip(f"{path} not available")
    return str(path)


def tiny_assets(root: Path, n_prompts: int = 32) -> dict:
    """The tiny random model and ``n_prompts`` arithmetic prompts (add1, add2) under ``root``: what the
    CPU end-to-end runs train on."""
    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    rows = synthetic_arithmetic(n_prompts, ["add1", "add2"], seed=0)
    for r in rows:
        r["prompt"] = make_prompt(r["problem"])
    write_jsonl(rows, str(root / "arith.jsonl"))
    return {"model": build_tiny_model(str(root / "tiny")), "data": str(root / "arith.jsonl")}
