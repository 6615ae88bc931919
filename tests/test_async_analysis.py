"""The async throughput study's analysis (``avspo_openrlhf.study.throughput``) on synthetic runs (no
training): the probe calibration, both baselines, start-up and break-even, per-seed values, the
summary over workloads, the host's load."""

import json
import math
from pathlib import Path

import pytest

from avspo_openrlhf.study import throughput


@pytest.fixture(scope="module")
def exp():
    return throughput


def _write_run(folder: Path, rows: list[dict], launch: float, wall: float, busy: float = 0.02):
    (folder / "report").mkdir(parents=True)
    (folder / "report" / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", **r}) + "\n" for r in rows))
    (folder / "DONE").write_text(json.dumps({"launch": launch, "wall_s": wall, "host_busy_before": busy}))


def _sync_rows(n, gen, train, sync, start):
    rows, t = [], start
    for i in range(n):
        rows.append(
            {
                "step": i + 1,
                "timing/generation": gen,
                "timing/make_experience": 0.4 * train,
                "timing/ppo_train": 0.6 * train,
                "timing/broadcast": sync,
                "rollout/num_samples": 16.0,
                "rollout/response_length_mean": 20.0,
                "timeline/gen_start": t,
                "timeline/gen_end": t + gen,
                "timeline/step_start": t + gen,
                "timeline/step_end": t + gen + train + sync,
            }
        )
        t += gen + train + sync
    return rows


def _async_rows(n, start, gen=2.3, interval=2.25):
    """Generation 15 % slower than sync's 2.0 s while training overlaps it, 0.05 s per step that no
    timer covers (the trainer: 1.0 s train + 0.2 s sync + 1.0 s waiting for the queue)."""
    rows, end = [], start
    for i in range(n):
        rows.append(
            {
                "step": i + 1,
                "timing/generation": gen,
                "timing/make_experience": 0.4,
                "timing/ppo_train": 0.6,
                "timing/broadcast": 0.2,
                "async/sync_lock_wait_s": 0.0,
                "async/staleness": float(i > 0),
                "async/trainer_idle_s": 1.0,
                "rollout/num_samples": 16.0,
                "rollout/response_length_mean": 20.0,
                "timeline/gen_start": end + 1.0 - gen,
                "timeline/gen_end": end + 1.0,
                "timeline/step_start": end + 1.05,
                "timeline/step_end": end + interval,
            }
        )
        end += interval
    return rows


def test_analysis_calibrates_on_the_probe_and_reports_start_up_and_break_even(exp, tmp_path):
    n, t0 = 12, 1_700_000_000.0
    measured = {}
    for seed in (0, 1):
        sync = _sync_rows(n, 2.0, 1.0, 0.2, t0)  # 3.2 s a step
        _write_run(tmp_path / "sync" / f"seed{seed}", sync, launch=t0 - 30, wall=30 + n * 3.2 + 5)
        everything = _sync_rows(n, 1.9, 0.9, 0.2, t0)  # 3.0 s a step on all cores
        _write_run(tmp_path / "sync-all" / f"seed{seed}", everything, launch=t0 - 30, wall=30 + n * 3.0 + 5)
        # async: 20 s more start-up (separate generator and training actors)
        rows = _async_rows(n, t0 + 1)
        first_gen = rows[0]["timeline/gen_start"]
        _write_run(tmp_path / "async-q1" / f"seed{seed}", rows, launch=first_gen - 50, wall=50 + n * 2.25 + 5)
        for mode in ("sync", "sync-all", "async-q1"):
            measured.setdefault(mode, {})[seed] = exp.measure(tmp_path / mode / f"seed{seed}")
    rows = {r["mode"]: r for r in exp.analyse(measured)}
    q1 = rows["async-q1"]
    assert q1["step_s"] == pytest.approx(2.25)
    assert q1["speedup"] == pytest.approx(3.2 / 2.25) and q1["speedup_vs_all"] == pytest.approx(3.0 / 2.25)
    assert q1["speedup_seeds"] == pytest.approx([3.2 / 2.25] * 2) and q1["speedup_sd"] == pytest.approx(0, abs=1e-9)
    # the probe (first PROBE_STEPS steps of async-q1) gives the two terms the sync run cannot show
    assert q1["probe_overlap_slowdown"] == pytest.approx(0.15) and q1["probe_overhead_s"] == pytest.approx(0.05)
    assert q1["probe_train_slowdown"] == pytest.approx(0.0) and q1["sync_overhead_s"] == pytest.approx(0.0, abs=1e-9)
    assert q1["probe_predicted_step_s"] > q1["predicted_step_s"]  # the sync-only model is optimistic
    assert q1["throughput_error"] > 0 and len(q1["probe_throughput_error_seeds"]) == 2
    # sync-all runs on other cores than the sync run it would be calibrated on: only its own phases
    assert "throughput_error" not in rows["sync-all"] and "own_throughput_error" in rows["sync-all"]
    # start-up: launch to the first generation; break-even: the fixed-cost difference over the per-step gain
    assert q1["startup_s"] == pytest.approx(50) and rows["sync"]["startup_s"] == pytest.approx(30)
    assert q1["extra_startup_s"] == pytest.approx(20)
    fixed_async, fixed_sync = 50 + 5 + n * 2.25 - n * q1["step_s"], 30 + 5
    assert q1["break_even_steps"] == pytest.approx((fixed_async - fixed_sync) / (3.2 - 2.25))
    assert "break_even_steps" not in rows["sync"]  # the baseline breaks even with nothing
    assert rows["sync"]["host_busy_before"] == pytest.approx(0.02)
    # a mode slower than sync never breaks even, and the table says so
    assert exp._f(float("inf")) == "never" and exp._f(float("nan")) == "-"
    assert exp._f(0.031, "share") == "3 %" and exp._f(0.031, True) == "+3.1 %"


def test_summary_lists_every_workload_with_its_seeds_and_machine(exp, tmp_path):
    mode = {
        "mode": "async-q1",
        "speedup": 1.5,
        "speedup_seeds": [1.4, 1.5, 1.6],
        "speedup_vs_all": 1.45,
        "ideal": 1.8,
        "throughput_error": 0.2,
        "throughput_error_seeds": [0.2, 0.2, 0.2],
        "probe_throughput_error": 0.04,
        "probe_throughput_error_seeds": [0.03, 0.04, 0.05],
        "own_throughput_error": 0.01,
        "extra_startup_s": 20.0,
        "break_even_steps": float("inf"),
    }
    for name, precision in (("untuned", "fp32"), ("documented", "bf16")):
        d = tmp_path / f"{name}-{precision}"
        d.mkdir()
        runs = {"sync": {"0": {"host_busy_before": 0.07}}}
        d.joinpath("results.json").write_text(
            json.dumps(
                {
                    "workload": name,
                    "precision": precision,
                    "cpu": "Some CPU, 2 cores, native bf16",
                    "modes": [{"mode": "sync", "step_s": 3.0, "speedup": 1.0}, mode],
                    "runs": runs,
                }
            )
        )
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps({"modes": []}))  # before workloads: left out
    text = exp.summary(tmp_path)
    lines = [ln for ln in text.splitlines() if ln.startswith("| untuned") or ln.startswith("| documented")]
    assert len(lines) == 2  # the sync baseline is no row of its own
    assert "| untuned | fp32 | Some CPU, 2 cores, native bf16 | async-q1 | 3.00 | 1.50 (1.40, 1.50, 1.60) |" in text
    assert "+4.0 % (+3.0 %, +4.0 %, +5.0 %)" in text and "| never | 7 % |" in text


def test_workload_presets_fill_what_was_not_given(exp):
    a = exp.build_parser().parse_args(["--workload", "untuned"])
    assert exp._fill_workload(a) == "untuned" and (a.prompts_per_step, a.max_new_tokens, a.ppo_epochs, a.steps) == (
        8,
        96,
        1,
        24,
    )
    a = exp.build_parser().parse_args(["--workload", "long", "--steps", "3"])
    assert exp._fill_workload(a) == "long-custom" and a.steps == 3 and a.max_new_tokens == 256
    assert exp.build_parser().parse_args([]).seeds == [0, 1, 2]


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat on this system")
def test_host_busy_is_a_share(exp):
    busy = exp.host_busy(0.2)
    assert math.isfinite(busy) and 0.0 <= busy <= 1.0


def test_host_busy_closed_form(exp, tmp_path, monkeypatch):
    """Busy share = 1 - (idle + iowait) / total jiffies, over this process's cores only, between two
    reads of /proc/stat; no jiffies counted (or no /proc/stat) is nan, not a share."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    stat = tmp_path / "stat"

    def write(total_per_core: int, idle: int, iowait: int) -> None:
        # user nice system idle iowait irq softirq: user takes what idle and iowait leave
        user = total_per_core - idle - iowait
        lines = ["cpu  0 0 0 0 0 0 0"] + [f"cpu{c} {user} 0 0 {idle} {iowait} 0 0" for c in cores]
        lines.append(f"cpu{max(cores) + 1} 999 0 0 0 0 0 0")  # a core this process may not use: left out
        stat.write_text("\n".join(lines) + "\n")

    write(1000, 500, 100)
    monkeypatch.setattr(exp.time, "sleep", lambda s: write(1200, 540, 110))  # +200 jiffies, 40 idle, 10 iowait
    assert exp.host_busy(1.0, str(stat)) == pytest.approx(1 - 50 / 200)
    monkeypatch.setattr(exp.time, "sleep", lambda s: None)  # nothing elapsed: no share to give
    assert math.isnan(exp.host_busy(1.0, str(stat)))
    assert math.isnan(exp.host_busy(1.0, str(tmp_path / "missing")))
