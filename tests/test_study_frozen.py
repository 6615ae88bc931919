"""Main computes what the frozen GPU study computes. The study's runs come from one commit
(``experiments/remedies_gpu/FROZEN``) and pair by a settings hash that covers what changes results
but not the source (``study/fingerprint.py``): a change on main that changes what a run computes must
bump ``LOOP_SEMANTICS`` (its runs then never pair with the frozen study's). This test holds main to
that: every arm of the study, two seeds, a few steps on the tiny model (CPU, fp32, the stacked engine),
run by the frozen commit's tree and by this checkout in separate processes on the same model and data
(``tests/study_golden.py``), must sample, score, train and evaluate alike."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# float numbers of an update: equal within rounding (the same code may reduce in another order); every
# other value (tokens, rewards, advantages' counts, evaluations) exactly
ROUNDED = {"loss", "entropy", "grad_norm", "token_adv_abs_mean"}


def _frozen_tree(dest: Path) -> Path:
    commit = (ROOT / "experiments" / "remedies_gpu" / "FROZEN").read_text(encoding="utf-8").strip()
    archive = dest / "frozen.tar"
    r = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), commit], capture_output=True, text=True
    )
    if r.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"git archive {commit}: {r.stderr.strip()}")
        pytest.skip(f"this checkout cannot archive the frozen commit {commit} (a shallow clone?): {r.stderr.strip()}")
    tree = dest / "frozen"
    with tarfile.open(archive) as t:
        t.extractall(tree, filter="data")
    return tree


def _golden(tree: Path, assets: dict, out: Path) -> dict:
    """The driver of this checkout run against ``tree``'s package (its study file, its tests' rewards)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "tests")]),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    study_file = tree / "experiments" / "remedies_gpu" / "run.py"
    cmd = [sys.executable, str(TESTS / "study_golden.py"), str(study_file), *assets.values(), str(out)]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def _differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    name = path.rsplit(".", 1)[-1]
    if isinstance(a, float) and isinstance(b, float) and name in ROUNDED:
        if math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7) or (math.isnan(a) and math.isnan(b)):
            return []
    elif a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return []
    return [f"{path}: frozen {a!r}, main {b!r}"]


@pytest.mark.slow
def test_main_computes_what_the_frozen_study_computes(study_assets, tmp_path):
    tree = _frozen_tree(tmp_path)
    frozen = _golden(tree, study_assets, tmp_path / "frozen.json")
    main = _golden(ROOT, study_assets, tmp_path / "main.json")
    # each tree computed its own (not this checkout's installed package twice)
    assert frozen.pop("_package") == str((tree / "avspo_openrlhf").resolve())
    assert main.pop("_package") == str((ROOT / "avspo_openrlhf").resolve())
    assert sorted(frozen) == sorted(main) and len(frozen) == 22  # 11 arms x 2 seeds
    steps = {name: r["steps"] for name, r in main.items()}
    assert min(steps.values()) >= 2 and all(r["per_problem"] for r in main.values()), steps  # trained, evaluated
    diff = _differences(frozen, main)
    assert not diff, (
        "main computes otherwise than the frozen study (bump LOOP_SEMANTICS and freeze anew, or restore):\n  "
        + "\n  ".join(diff[:20])
    )
