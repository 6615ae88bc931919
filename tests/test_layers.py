"""The package's layers only go down: a module imports (at top level or inside a function) only
from its own layer or the ones below, and no two parts of one layer import each other. A new
import that climbs a stair fails here, naming the file and the line."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "avspo_openrlhf"

# lowest first; each entry: the top-level modules or subpackages of avspo_openrlhf in that layer
LAYERS = [
    (
        "base: small utilities",
        {"stats", "redaction", "ray_auth", "folder_lock", "swap", "startup", "startup_gc", "atomic", "__init__"},
    ),
    ("algo: the pure math of ACR and its remedies (torch only)", {"algo"}),
    ("the TRL and verl integrations: adapters directly over the pure math", {"integrations"}),
    ("rewards", {"rewards"}),
    ("data", {"data"}),
    ("reports and the pipeline simulator", {"report", "sim"}),
    ("trainer: the OpenRLHF integration", {"trainer"}),
    (
        "backends: CPU backend, benchmark evaluation, run-time replacements, cluster helpers",
        {"cpu", "math_eval", "install", "cluster"},
    ),
    ("applications: every console script and the quickstart", {"cli"}),
    ("studies: experiments run through the applications, their comparisons and tables", {"study"}),
]
LAYER_OF = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


# a string that is a whole dotted path into the package is an import made later (a Ray setup hook,
# importlib, an entry point): it counts like one
DOTTED = re.compile(r"avspo_openrlhf(\.\w+)+(:\w+)?")


def _imports(path: Path):
    """``(line, target unit)`` of every import of another part of the package in ``path``."""
    rel_parts = path.relative_to(PKG).parent.parts
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            names = [node.value.split(":")[0]]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = rel_parts[: len(rel_parts) - (node.level - 1)]
                names = [".".join(("avspo_openrlhf", *base, *([node.module] if node.module else [])))]
                if not node.module:
                    names = [f"{names[0]}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
                if node.module == "avspo_openrlhf":
                    names = [f"avspo_openrlhf.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "avspo_openrlhf" and len(parts) > 1:
                yield node.lineno, parts[1]


def _edges():
    for path in sorted(PKG.rglob("*.py")):
        src = _unit(path)
        for line, dst in _imports(path):
            if dst != src:
                yield path, line, src, dst


def test_every_part_of_the_package_has_a_layer():
    units = {_unit(p) for p in PKG.rglob("*.py")}
    assert units <= set(LAYER_OF), f"parts without a layer (add them to LAYERS): {sorted(units - set(LAYER_OF))}"


def test_imports_only_go_down():
    ups = [
        f"{path.relative_to(PKG.parent)}:{line}: {src} ({LAYERS[LAYER_OF[src]][0].split(':')[0]}) imports {dst} "
        f"({LAYERS[LAYER_OF[dst]][0].split(':')[0]})"
        for path, line, src, dst in _edges()
        if LAYER_OF[dst] > LAYER_OF[src]
    ]
    assert not ups, "imports that climb a layer:\n" + "\n".join(ups)


def test_no_loop_inside_a_layer():
    pairs = {(src, dst) for _, _, src, dst in _edges()}
    loops = sorted({tuple(sorted(p)) for p in pairs if (p[1], p[0]) in pairs})
    assert not loops, f"parts of one layer that import each other: {loops}"


def test_the_check_sees_a_stair_up(tmp_path, monkeypatch):
    """The check itself: an import of cli from the trainer layer is reported with its line."""
    fake = tmp_path / "avspo_openrlhf"
    (fake / "trainer").mkdir(parents=True)
    (fake / "cli").mkdir()
    (fake / "trainer" / "x.py").write_text(
        "import os\n\ndef f():\n    from avspo_openrlhf.cli.interrupt import INTERRUPT\n"
    )
    (fake / "cli" / "y.py").write_text("from ..trainer import x\n")
    (fake / "trainer" / "z.py").write_text(
        '"""Docstring naming avspo_openrlhf.cli.train is no import."""\n'
        'HOOK = "avspo_openrlhf.cli.interrupt.install_interrupt_handler"\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    edges = sorted((p.name, line, s, d) for p, line, s, d in _edges())
    assert edges == [("x.py", 4, "trainer", "cli"), ("y.py", 1, "cli", "trainer"), ("z.py", 2, "trainer", "cli")]
    assert [(name, line) for name, line, s, d in edges if LAYER_OF[d] > LAYER_OF[s]] == [("x.py", 4), ("z.py", 2)]


# ── the TRL and verl integrations: over the pure math alone ──

# what a TRL or verl user must not get by importing our adapters (OpenRLHF's stack)
HEAVY = ("openrlhf", "ray", "vllm", "deepspeed")


def test_the_integrations_sit_directly_above_the_algorithm_and_import_only_it():
    assert LAYER_OF["integrations"] == LAYER_OF["algo"] + 1
    below = {dst for _, _, src, dst in _edges() if src == "integrations"}
    assert below == {"algo"}, f"the integrations import {sorted(below - {'algo'})} besides algo"


def _heavy_imports(path: Path):
    """``(line, module)`` of every import of an OpenRLHF-stack module in ``path`` (any depth)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        for name in names:
            if name.split(".")[0] in HEAVY:
                yield node.lineno, name


def test_no_file_the_integrations_import_names_the_openrlhf_stack():
    files = sorted((PKG / "algo").rglob("*.py")) + sorted((PKG / "integrations").rglob("*.py"))
    found = [f"{p.relative_to(PKG.parent)}:{line}: {name}" for p in files for line, name in _heavy_imports(p)]
    assert not found, "imports of the OpenRLHF stack under algo/ or integrations/:\n" + "\n".join(found)


# runs in a fresh interpreter: imports argv[1] and reports every module of argv[3] (comma-separated
# top-level names) that a file under argv[2] imported (whoever imports it first is seen: the import
# statement's frame), and which modules of the package got loaded
WATCH = """
import importlib, json, sys
target, root, blocked = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))
hits = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            f = sys._getframe(1)
            while f is not None and (f.f_code.co_filename.startswith("<frozen") or "importlib" in f.f_code.co_filename):
                f = f.f_back
            if f is not None and f.f_code.co_filename.startswith(root):
                hits.append(f"{name} <- {f.f_code.co_filename}:{f.f_lineno}")
        return None

sys.meta_path.insert(0, Watch())
sys.path.insert(0, root)
importlib.import_module(target)
ours = sorted(m for m in sys.modules if m.split(".")[0] == "avspo_openrlhf")
print(json.dumps({"hits": hits, "ours": ours}))
"""


def _watch(target: str, root: Path, blocked) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WATCH, target, str(root), ",".join(blocked)],
        cwd=PKG.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["trl", "verl"])
def test_importing_an_integration_loads_nothing_of_the_openrlhf_stack(framework):
    """TRL and verl may bring vLLM or Ray along themselves; our adapters import none of OpenRLHF,
    Ray, vLLM or DeepSpeed, and no part of this package but the pure math and the adapters."""
    pytest.importorskip(framework)
    seen = _watch(f"avspo_openrlhf.integrations.{framework}", PKG, HEAVY)
    assert seen["hits"] == [], seen["hits"]
    assert f"avspo_openrlhf.integrations.{framework}" in seen["ours"]
    extra = [m for m in seen["ours"] if m != "avspo_openrlhf" and m.split(".")[1] not in ("algo", "integrations")]
    assert not extra, f"importing the {framework} integration loads {extra}"


def test_the_import_watch_sees_a_planted_import(tmp_path):
    (tmp_path / "planted.py").write_text("import os\n\ndef later():\n    pass\n\nimport wave\n")
    assert _watch("planted", tmp_path, ["wave"])["hits"] == [f"wave <- {tmp_path / 'planted.py'}:6"]
