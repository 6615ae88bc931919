"""Every end-to-end run in the suite is marked ``slow`` (``pyproject.toml``'s markers; ``bash run_tests.sh
-m "not slow"`` is the suite without them): a test that starts ``avspo-train``, the quickstart or a
study run in another process, or trains through the CPU pipeline's helpers, carries the marker, by
its decorator or its module's ``pytestmark``. Read from the tests' source, not timed."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# the helpers that train through avspo-train (tests/test_cpu_pipeline.py's _train, a study's cells)
E2E_CALLS = {"_train", "train_and_evaluate", "train_cpu"}
# the modules and scripts whose processes train
E2E_TARGETS = {"avspo_openrlhf.cli.train", "avspo_openrlhf.cli.quickstart", "quickstart.sh"}


def _marked_slow(node: ast.AST) -> bool:
    return "slow" in ast.unparse(node)


def unmarked_runs(source: str) -> list[str]:
    """The test functions of ``source`` that start an end-to-end run without the ``slow`` marker."""
    tree = ast.parse(source)
    module_slow = any(
        isinstance(n, ast.Assign)
        and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
        and _marked_slow(n.value)
        for n in tree.body
    )
    out = []
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test")):
            continue
        if module_slow or any(_marked_slow(d) for d in fn.decorator_list):
            continue
        for node in ast.walk(fn):
            called = isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id in E2E_CALLS)
                or (isinstance(node.func, ast.Attribute) and node.func.attr in E2E_CALLS)
            )
            target = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in E2E_TARGETS
            if called or target:
                out.append(fn.name)
                break
    return out


def test_every_end_to_end_run_is_marked_slow():
    found = {
        p.name: names
        for p in sorted(TESTS.glob("test_*.py"))
        if (names := unmarked_runs(p.read_text(encoding="utf-8")))
    }
    assert not found, f"end-to-end runs without @pytest.mark.slow: {found}"


def test_the_marker_check_sees_an_unmarked_run():
    source = """
import pytest

def test_fast():
    assert 1

def test_trains(tmp_path):
    _train(["--backend", "cpu"])

def test_quickstart():
    subprocess.run([sys.executable, "-m", "avspo_openrlhf.cli.quickstart"])

@pytest.mark.slow
def test_marked():
    _train([])
"""
    assert unmarked_runs(source) == ["test_trains", "test_quickstart"]
    assert unmarked_runs("import pytest\npytestmark = pytest.mark.slow\n" + source) == []
