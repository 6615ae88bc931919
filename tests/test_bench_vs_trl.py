"""benchmarks/bench_vs_trl.py's timings and table, from step clocks (the runs themselves are the
benchmark's, not the suite's: minutes each)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_vs_trl", ROOT / "benchmarks" / "bench_vs_trl.py")
vs_trl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vs_trl)


def test_step_times_from_each_steps_clock():
    t = vs_trl.step_times(100.0, begins=[130.0, 145.0, 160.0], ends=[144.0, 158.0, 175.0])  # gaps 14, 17
    assert t == {
        "startup_s": 30.0,
        "first_step_logged_s": 44.0,
        "steady_step_s": 15.5,
        "training_stage_s": 75.0,
        "steps": 3,
    }


def test_the_table_has_a_column_and_a_ratio_to_trl_per_mode():
    def side(stage):
        return {
            "startup_s": 30.0,
            "first_step_logged_s": 45.0,
            "steady_step_s": 15.0,
            "training_stage_s": stage,
            "steps": 8,
            "phases_median_s": {"ppo_train": 9.0},
            "load_before": 0.1,
            "load_after": 2.0,
        }

    res = {
        "cpu": "AMD EPYC, 2 cores, native bf16",
        "precision": "fp32",
        "seed": 0,
        "default_mode": "sync",
        "label": "ours GRPO + AVSPO, TRL GRPO",
        "ours": {"sync": side(150.0), "async": side(225.0)},
        "trl": side(150.0),
        "gains": {
            "sync": (0.1, 0.02, 0.2),
            "async": (0.1, 0.0, 0.2),
            "trl": (0.1, 0.02, 0.2),
            "sync_minus_trl": (0.0, -0.1, 0.1),
            "async_minus_trl": (0.0, -0.1, 0.1),
        },
    }
    text = vs_trl.report(res)
    assert "| | ours, sync | ours, async | TRL `GRPOTrainer` | ours sync / TRL | ours async / TRL |" in text
    row = next(line for line in text.splitlines() if line.startswith("| training stage"))
    assert row.endswith("| 150.0 s | 225.0 s | 150.0 s | **1.00×** | **1.50×** |")
    assert "| held-out gain, points [95 %] | +10.0 [+2.0, +20.0] |" in text
    del res["trl"], res["gains"]
    assert "not run" in vs_trl.report(res) and "/ TRL" not in vs_trl.report(res)


def test_repeated_runs_report_each_timings_median_and_every_runs_load():
    def run(stage, load):
        return {
            "startup_s": stage / 5,
            "first_step_logged_s": stage / 3,
            "steady_step_s": stage / 10,
            "training_stage_s": stage,
            "steps": 8,
            "phases_median_s": {"ppo_train": stage / 20},
            "load_before": load,
            "load_after": load + 1,
            "final": f"final{stage}",
        }

    ours = vs_trl.median_runs([run(150.0, 0.5), run(120.0, 1.0), run(130.0, 2.0)])
    assert (
        ours["training_stage_s"] == 130.0
        and ours["startup_s"] == 26.0
        and ours["phases_median_s"] == {"ppo_train": 6.5}
    )
    assert ours["final"] == "final130.0"  # the evaluation scores the last run's model
    assert [r["training_stage_s"] for r in ours["runs"]] == [150.0, 120.0, 130.0]
    assert vs_trl.median_runs([run(100.0, 0.1)]) == run(100.0, 0.1)  # one run: as it is
    trl = vs_trl.median_runs([run(100.0, 0.3), run(110.0, 0.4), run(90.0, 0.2)])
    res = {"cpu": "Intel Xeon, 2 cores, native bf16", "precision": "fp32", "seed": 0, "default_mode": "sync",
           "label": "ours GRPO + AVSPO, TRL GRPO", "repeats": 3, "ours": {"sync": ours}, "trl": trl}  # fmt: skip
    text = vs_trl.report(res)
    assert "| training stage (process start → last step logged) | 130.0 s | 100.0 s | **1.30×** |" in text
    assert "Each side ran 3 times, alternating (ours sync, TRL; then again)" in text
    assert "ours sync 0.5 → 1.5, 1.0 → 2.0, 2.0 → 3.0; TRL 0.3 → 1.3, 0.4 → 1.4, 0.2 → 1.2." in text
    assert json.loads(json.dumps(res)) == res  # the committed json holds every run


def test_modes_are_checked(capsys):
    with pytest.raises(SystemExit):
        vs_trl.main(["--modes", "sync,fast", "--only", "ours"])
    assert "--modes: fast: expected sync and/or async" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vs_trl.main(["--repeats", "0", "--only", "ours"])
    assert "--repeats: 0: expected 1 or more runs of each side" in capsys.readouterr().err


def test_the_committed_results_name_no_machines_folders(tmp_path):
    out, model = str(tmp_path / "run"), str(tmp_path / "model")
    res = {"final": f"{out}/ours_sync/final", "flags": ["--actor.model_name_or_path", model, f"{out}/d"]}
    got = vs_trl.portable(res, {out: "<out>", model: "<model>"})
    assert got == {"final": "<out>/ours_sync/final", "flags": ["--actor.model_name_or_path", "<model>", "<out>/d"]}
    committed = json.loads((ROOT / "benchmarks" / "results" / "bench_vs_trl.json").read_text())

    def strings(obj):
        if isinstance(obj, dict):
            return [s for v in obj.values() for s in strings(v)]
        return [s for v in obj for s in strings(v)] if isinstance(obj, list) else [obj] if isinstance(obj, str) else []

    absolute = [s for s in strings(committed) if re.search(r"(^|[\s=])/[A-Za-z]", s)]
    assert not absolute, absolute  # every folder is a placeholder (<out>, <model>, <repo>)


def test_the_committed_table_is_the_committed_jsons():
    # bench_vs_trl.md is report() of the run that wrote bench_vs_trl.json, byte for byte
    res = json.loads((ROOT / "benchmarks" / "results" / "bench_vs_trl.json").read_text(encoding="utf-8"))
    assert vs_trl.report(res) == (ROOT / "benchmarks" / "results" / "bench_vs_trl.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_trl_side_runs_in_its_own_process_and_reports_its_step_clocks(tmp_path):
    """``run_trl`` on the tiny model (2 steps): the worker starts as the benchmark's own file with
    ``--trl-worker``, trains, saves the model and writes one begin/end line per optimizer step."""
    from types import SimpleNamespace

    pytest.importorskip("trl")
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    model = build_tiny_model(str(tmp_path / "tiny"))
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    q = SimpleNamespace(seed=0, steps=2, group_size=4, prompts_per_step=2, lr=1e-5, max_new_tokens=8, temperature=0.7)
    r = vs_trl.run_trl(q, model, str(train), tmp_path / "trl")
    assert r["steps"] == 2 and 0 < r["startup_s"] <= r["training_stage_s"] <= r["process_wall_s"]
    assert (tmp_path / "trl" / "final" / "config.json").is_file()
