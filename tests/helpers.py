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
    """The tiny random model and ``n_prompts`` arithmetic prompts under ``root`` (``cpu.tiny.tiny_assets``)."""
    from avspo_openrlhf.cpu import tiny

    return tiny.tiny_assets(str(root), n_prompts)
