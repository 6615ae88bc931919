"""The quickstart default study's table (``avspo_openrlhf.study.quickstart_default``): one row per
seed and the CPU and precision lines every study writes; the committed results.md is the table of
the committed results.json."""

from __future__ import annotations

import json
from pathlib import Path

from avspo_openrlhf.study import quickstart_default

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "experiments" / "quickstart_default"


def _seed(cpu: str, **extra) -> dict:
    gain = {lv: (0.1, 0.02, 0.2) for lv in ("all", "add1", "mul1", "add2")}
    return {
        "wall_min": 6.0,
        "before": {"pass@1": 0.3, "truncation_rate": 0.45},
        "after": {"pass@1": 0.45, "truncation_rate": 0.1},
        "gain_ci95": gain,
        "cpu": cpu,
        "precision": {"rollout engine": "float32", "policy": "float32"},
        **extra,
    }


def test_a_row_per_seed_then_the_machines_and_precisions():
    text = quickstart_default.table({1: _seed("B"), 0: _seed("A", train_s=250.4, first_step_s=55.6, mode="sync")})
    rows = [line for line in text.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert rows[0] == (
        "| 0 | 6.0 min | 250 s (56 s), sync | 30.0 % → 45.0 % | **+10.0 [+2.0, +20.0]** | +10.0 [+2.0, +20.0] "
        "| +10.0 [+2.0, +20.0] | +10.0 [+2.0, +20.0] | 45 % → 10 % |"
    )
    assert rows[1].startswith("| 1 | 6.0 min | — |")  # a run from before the training stage was timed
    assert "\nCPU: A (1 run); B (1 run).\n" in text
    assert text.endswith("\nPrecision: policy float32; rollout engine float32.\n")
    assert "±" not in text


def test_the_committed_table_is_the_committed_jsons():
    published = json.loads((FOLDER / "results.json").read_text(encoding="utf-8"))
    text = quickstart_default.table({int(seed): r for seed, r in published.items()})
    assert text == (FOLDER / "results.md").read_text(encoding="utf-8")


def _first_run():
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_run", ROOT / "benchmarks" / "first_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_first_run_reads_setup_breakdown():
    log = "==> torch\nnoise\n\nsetup.sh took 190 s:\n    32 s  torch (CPU wheel)\n   101 s  CPU stack (requirements.txt)\n\nDone.\n"
    assert _first_run().setup_breakdown(log) == (
        190,
        [("torch (CPU wheel)", 32), ("CPU stack (requirements.txt)", 101)],
    )
    assert _first_run().setup_breakdown("no breakdown") == (None, [])


def test_committed_first_run_page_is_its_json():
    results = ROOT / "benchmarks" / "results"
    if not (results / "first_run.json").exists():
        import pytest

        pytest.skip("no first-run measurement committed")
    r = json.loads((results / "first_run.json").read_text())
    assert (results / "first_run.md").read_text() == _first_run().page(r)
