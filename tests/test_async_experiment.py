"""experiments/async_throughput/run.py end to end on the tiny model (2 modes x 2 steps), with the
engine and the training actors on disjoint cores read back from inside the actors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avspo_openrlhf.report import read_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")
pytest.importorskip("deepspeed")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the 1/1 core split needs 2 cores")
def test_experiment_runs_two_modes_on_split_cores(tmp_path):
    res = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "experiments" / "async_throughput" / "run.py"), "--out", str(tmp_path / "runs"),
           "--results", str(res), "--model", "tiny", "--modes", "sync", "async-q1", "--seeds", "0", "--steps", "2",
           "--group-size", "4", "--max-new-tokens", "8"]  # fmt: skip
    env = {**os.environ, "AVSPO_REWARD_WORKERS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = json.loads((res / "results.json").read_text())
    modes = {m["mode"]: m for m in out["modes"]}
    assert set(modes) == {"sync", "async-q1"}
    for m in modes.values():
        assert m["step_s"] > 0 and math.isfinite(m["predicted_step_s"]) and math.isfinite(m["throughput_error"])
        assert 0 <= m["trainer/idle_ratio"] <= 1 and 0 <= m["rollouter/idle_ratio"] <= 1
    assert modes["sync"]["speedup"] == 1.0 and modes["sync"]["staleness_mean"] == 0
    assert modes["async-q1"]["staleness_mean"] == 0.5  # step 1 trains version 0 (0), step 2 version 0 (1)
    # the probe calibration, start-up, break-even and the host's load come with every run
    q1 = modes["async-q1"]
    assert math.isfinite(q1["probe_throughput_error"]) and q1["probe_overlap_slowdown"] >= 0
    assert 0 < q1["startup_s"] < q1["run_wall_s"] and "break_even_steps" in q1 and "extra_startup_s" in q1
    assert 0 <= out["runs"]["sync"]["0"]["host_busy_before"] <= 1
    assert out["workload"] == "documented-custom" and out["precision"] in ("bf16", "fp32") and "cores" in out["cpu"]
    for f in ("results.md", "timeline.png", "throughput.png", "staleness.png", "reward_curves.png"):
        assert (res / f).stat().st_size > 0, f
    # the split really applied: each side reads its own affinity and thread count back
    allowed = sorted(os.sched_getaffinity(0))
    for mode in ("sync", "async-q1"):
        b = json.loads((tmp_path / "runs" / mode / "seed0" / "report" / "cpu_binding.json").read_text())
        assert [e["affinity"] for e in b["engine"]] == [allowed[:1]]
        assert [t["affinity"] for t in b["train"]] == [allowed[1:2]] and b["train"][0]["torch_threads"] == 1
        assert b["engine"][0]["torch_threads"] == 1 and b["engine"][0]["pid"] != b["train"][0]["pid"]
    rows, _ = read_metrics(str(tmp_path / "runs" / "async-q1" / "seed0" / "report" / "metrics.jsonl"))
    for row in rows:
        assert row["timeline/gen_start"] <= row["timeline/gen_end"] <= row["timeline/step_end"]
        assert row["timeline/step_start"] <= row["timeline/step_end"] and row["async/sync_lock_wait_s"] >= 0
        assert row["timeline/step_start"] > 1.7e9  # wall-clock seconds kept in float64 through the tags
