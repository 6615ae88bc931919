"""Every code block of the docs runs, or says in the page why it does not.

The pages: the docs site's (``docs/*.md`` and the pages it mounts from beside their code) and the
README. A ``python`` or ``bash`` block runs here, on CPU and offline, unless its first line is

    # not run by the docs tests: <why>

which the reader sees in the block (a GPU command, a study that trains for hours, an install from the
package index). A block in a data language (``json``, ``bibtex``, ``text``: a file's content or an
output) is not code to run. A block with no language, or one that runs nothing and says no reason, fails.

Cheap enough for the suite on 2 cores: each page's Python blocks run in order as one script (a later
block uses the names of an earlier one) in one subprocess; each shell block runs with
``bash -euo pipefail`` in its own. Both run in a scratch folder where the repository's files are
linked and ``experiments/`` is a copy: a block that rewrites published pages writes there, and the test
fails if the copy then differs from the repository's (a published page is what its generator writes).
A hub model is replaced by the tiny random model (``avspo_openrlhf/cpu/tiny.py``) and ``.venv/bin/``
by the running interpreter's folder; ``SUBSTITUTIONS`` lists every other change made to a block before
it runs, and each must still find its text in the page.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "docs/*.md",
    "experiments/**/README.md",
    "eval/README.md",
    "datasets/README.md",
    "launch_scripts/configs/README.md",
]
RUN = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
DATA = {"json", "bibtex", "text"}
NOT_RUN = re.compile(r"#\s*not run by the docs tests:\s*(\S.*)")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
TINY = "@TINY_MODEL@"  # replaced by the tiny model's folder
# (page, text in a block, what the test runs instead; every occurrence): the hub model becomes the tiny
# one; TRL's examples take the page's own CPU settings (use_cpu, bf16 off) and one short step
CPU_STEP = "use_cpu=True, bf16=False, max_steps=1, max_completion_length=8"
SUBSTITUTIONS = [
    ("docs/trl.md", '"Qwen/Qwen2.5-0.5B-Instruct"', f'"{TINY}"'),
    ("docs/trl.md", 'report_to="tensorboard",', f'report_to="tensorboard", {CPU_STEP},'),  # the remedy example
    ("docs/trl.md", 'report_to="tensorboard")', f'report_to="tensorboard", {CPU_STEP})'),  # measuring only
]
# what a page's blocks must have written (globs, under the scratch folder)
WRITES = {
    "docs/trl.md": ["out/runs/*/events.out.tfevents.*"],  # report_to="tensorboard" logged
    "datasets/README.md": ["data/arith_train.jsonl"],
}
TIMEOUT_S = 300


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str

    @property
    def reason(self) -> str | None:
        first = next((ln.strip() for ln in self.code.splitlines() if ln.strip()), "")
        m = NOT_RUN.fullmatch(first)
        return m.group(1) if m else None

    @property
    def runs(self) -> bool:
        return self.lang in RUN and self.reason is None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    found = {p for pattern in PAGES for p in ROOT.glob(pattern) if p.is_file() and "runs" not in p.parts}
    return sorted(p.relative_to(ROOT).as_posix() for p in found)


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a page, dedented to their fence, with the fence's line number."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines() if text is None else text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: a code block is never closed"
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n"))
        i += 1
    return out


ALL = [b for page in pages() for b in blocks(page)]
PYTHON_PAGES = sorted({b.page for b in ALL if b.runs and RUN[b.lang] == "python"})
SHELL = [b for b in ALL if b.runs and RUN[b.lang] == "bash"]


def prepared(block: Block, scratch: Path) -> str:
    code = block.code.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    for page, old, new in SUBSTITUTIONS:
        if page == block.page and old in code:
            code = code.replace(old, new)
    return code.replace(TINY, str(scratch / "tiny_model"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The repository's files linked into a scratch folder, ``experiments/`` copied, the tiny model built."""
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("docs_snippets")
    for entry in ROOT.iterdir():
        if entry.name in ("experiments", "data", "runs", "out", "site", ".git"):
            continue
        (root / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "experiments", root / "experiments", ignore=shutil.ignore_patterns("runs"))
    build_tiny_model(str(root / "tiny_model"))
    return root


def _env(scratch: Path) -> dict:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="offline",
        DS_ACCELERATOR="cpu",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _run(cmd: list[str], scratch: Path, what: str) -> str:
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=_env(scratch), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} ran past {TIMEOUT_S} s")
    assert proc.returncode == 0, (
        f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _published_unchanged(scratch: Path, what: str) -> None:
    """The scratch copy of ``experiments/`` still equals the repository's, file by file."""
    changed = [
        p.relative_to(scratch).as_posix()
        for p in sorted((scratch / "experiments").rglob("*"))
        if p.is_file() and not filecmp.cmp(p, ROOT / p.relative_to(scratch), shallow=False)
    ]
    assert not changed, f"{what} rewrote published files differently from the repository's: {changed}"


def _wrote(page: str, scratch: Path) -> None:
    for pattern in WRITES.get(page, []):
        assert list(scratch.glob(pattern)), f"{page}'s blocks ran but wrote nothing matching {pattern}"


def test_the_parser_finds_blocks_languages_and_reasons():
    text = "a\n\n```bash\n# not run by the docs tests: needs 8 GPUs\nx\n```\n\n1. item\n\n    ```python\n    y = 1\n    ```\n"
    found = blocks("page.md", text)
    assert [(b.line, b.lang, b.reason, b.runs) for b in found] == [
        (3, "bash", "needs 8 GPUs", False),
        (10, "python", None, True),
    ]
    assert found[1].code == "y = 1\n"


def test_every_block_runs_or_says_why_not():
    assert len(ALL) > 30, "found no code blocks"
    unknown = [f"{b} (```{b.lang})" for b in ALL if b.lang not in RUN and b.lang not in DATA]
    assert not unknown, f"blocks with no language or one this test does not know (python, bash or data): {unknown}"
    mute = [str(b) for b in ALL if b.lang in DATA and b.reason is not None]
    assert not mute, f"data blocks carry no not-run note: {mute}"
    for page, old, _ in SUBSTITUTIONS:  # a substitution that no longer applies would run the page as written
        assert any(b.page == page and b.runs and old in b.code for b in ALL), f"{page}: no runnable block has {old!r}"
    assert PYTHON_PAGES and SHELL


@pytest.mark.slow
@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_the_python_blocks_of_a_page_run(page, scratch):
    code = "\n".join(f"# {b}\n{prepared(b, scratch)}" for b in ALL if b.page == page and b.runs and b.lang == "python")
    script = scratch / f"snippets_{page.replace('/', '_')}.py"
    script.write_text(code, encoding="utf-8")
    _run([sys.executable, str(script)], scratch, f"{page}'s Python blocks")
    _wrote(page, scratch)


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL, ids=str)
def test_a_shell_block_runs(block, scratch):
    _run(["bash", "-euo", "pipefail", "-c", prepared(block, scratch)], scratch, f"the block at {block}")
    _published_unchanged(scratch, f"the block at {block}")
    _wrote(block.page, scratch)


def _pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", path.read_text(encoding="utf-8"), re.M)
    return {name.lower(): version for name, version in found}


def test_the_install_lines_of_the_pages_take_the_stacks_versions():
    """What docs/trl.md and docs/verl.md install outside setup.sh (the ``trl`` extra, the files of a clean
    virtualenv) names the versions the CPU stack runs and the tests test, and the CPU torch line the pin."""
    stack = _pins(ROOT / "requirements.txt")
    verl_deps = _pins(ROOT / "requirements-verl-deps.txt")
    assert verl_deps and all(stack.get(name, v) == v for name, v in verl_deps.items()), verl_deps
    assert {"ray", "transformers", "peft", "torchdata"} <= set(verl_deps)
    extra = re.search(r"^trl = \[(.*)\]", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)
    extra_pins = dict(re.findall(r'"([A-Za-z0-9_.\-]+)==([^"]+)"', extra))
    assert extra_pins == {"trl": _pins(ROOT / "requirements-trl.txt")["trl"], "tensorboard": stack["tensorboard"]}
    for page in ("docs/trl.md", "docs/verl.md", "docs/install.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        cpu_torch = f"pip install torch=={stack['torch']} --index-url https://download.pytorch.org/whl/cpu"
        assert cpu_torch in text, f"{page} gives no CPU torch line ({cpu_torch})"
