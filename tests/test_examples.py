"""examples/avspo_loop.py: the one-file AVSPO loop runs and learns from all-wrong groups."""

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")
LOOP = Path(__file__).resolve().parents[1] / "examples" / "avspo_loop.py"


def test_one_file_loop_runs_avspo_end_to_end():
    spec = importlib.util.spec_from_file_location("avspo_loop", LOOP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--steps", "3", "--prompts", "2", "--G", "4", "--max-new-tokens", "8", "--lr", "1e-3"])
    hist = out["history"]
    assert [h["step"] for h in hist] == [1, 2, 3] and all(math.isfinite(h["loss"]) for h in hist)
    # the random tiny model never answers: every group is all-wrong (ACR 1), GRPO would learn nothing;
    # the gate opens, virtual samples give those groups advantages, and the weights move
    assert all(h["acr"] == 1.0 and h["reward"] == 0.0 for h in hist)
    assert all(h["gate_open"] == 1.0 and h["acr_effective"] == 0.0 for h in hist)
    assert out["weight_change"] > 0 and out["controller"]["steps"] == 3
