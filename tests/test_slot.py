"""The GPU study's slot scripts (experiments/remedies_gpu/device_bundle.sh and slot.sh) rehearsed on the
CPU: a bundle of a commit that holds this checkout's files, staged, then two calls of runs of a small
study on the tiny model, the second resuming from the runs the first returned, as if they had been
published between slots. The runs must come from the bundled commit, never from the checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HERE = "experiments/remedies_gpu"
STUDY = f"{HERE}/slot_rehearsal.py"  # inside the frozen tree, as the real study is
# 2 arms x 2 seeds of the tiny model: what the slot does, in seconds (3 prompts a step: the engine check
# needs a mixed, an all-wrong and an all-right group)
STUDY_TEXT = """import sys

from avspo_openrlhf.study.spec import Arm, StudySettings
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy

STUDY = GPURemediesStudy(
    levels=("add1", "mul1"),
    train_prompts=8,
    heldout_per_level=6,
    validation_per_level=2,
    settings=StudySettings(
        group_size=4, prompts_per_step=3, max_new_tokens=8, lr=1e-3, token_budget=150, reward="arith",
        acr={"tau_init": 0.25, "window": 2}, eval_n=2, mid_eval_tokens=40, mid_eval_problems=4,
        ckpt_every=2, micro_batch=4, gen_batch=16,
    ),
    arms={"GRPO": Arm("grpo"), "AVSPO": Arm("avspo", {"strategy": "stratified"})},
    seeds={"GRPO": 2, "AVSPO": 2},
    primary=("GRPO", "AVSPO"),
    second_base="AVSPO",
)

if __name__ == "__main__":
    sys.exit(STUDY.main())
"""


def git(cwd: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def checkout_copy(dest: Path, files: list[str] | None = None) -> Path:
    """A repository at ``dest`` whose one commit holds this checkout's files as they are now (tracked
    and untracked-not-ignored: what travels to the device), or only ``files`` of them."""
    listed = git(REPO, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for name in files or [n for n in listed if n]:
        if (REPO / name).is_file():  # a tracked file deleted in the checkout is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "the checkout as it is")
    return dest


def script(root: Path, name: str, *args: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / HERE / name), *args],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def exported(out: Path) -> dict[str, dict]:
    with tarfile.open(out / "runs.tar.gz") as t:
        return {m.name: json.load(t.extractfile(m)) for m in t.getmembers()}


def test_the_scripts_fail_fast_on_a_missing_part(tmp_path):
    root = checkout_copy(tmp_path / "repo", [f"{HERE}/device_bundle.sh", f"{HERE}/slot.sh"])
    r = script(root, "device_bundle.sh", env={})
    assert r.returncode == 2 and "no commit given and experiments/remedies_gpu/FROZEN is absent" in r.stderr
    (root / HERE / "FROZEN").write_text("abc\n")
    r = script(root, "device_bundle.sh", env={})
    assert r.returncode == 2 and "FROZEN must hold one 40-hex commit" in r.stderr
    r = script(root, "device_bundle.sh", "0" * 40, env={})
    assert r.returncode == 2 and "is no commit of" in r.stderr
    env = {"AVSPO_SLOT": str(tmp_path / "slot"), "OUT": str(tmp_path / "out")}
    for args, msg in [
        (("runs", "5"), "nothing staged in"),
        (("runs", "soon"), "MINUTES (the call's time for runs) first"),
        (("stage",), "no .gpu_bundle/COMMIT and tree.tar.gz here"),
        (("stage", "--fast"), "stage: unknown flag --fast"),
        (("unpack",), "usage: slot.sh stage"),
    ]:
        r = script(root, "slot.sh", *args, env=env, timeout=30)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


@pytest.mark.slow
def test_a_slot_rehearsed_on_the_cpu(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / STUDY).parent.mkdir(parents=True)
    (root / STUDY).write_text(STUDY_TEXT)
    commit = git(checkout_copy(root), "rev-parse", "HEAD")
    (root / HERE / "README.md").unlink()  # a checkout's deletion: listed by git, not carried
    r = script(root, "device_bundle.sh", commit, env={"AVSPO_BUNDLE_MODEL": "none"})
    assert r.returncode == 0, r.stderr
    assert 'transfer 1 (slot.sh stage): carry [".gpu_bundle/tree.tar.gz", ".gpu_bundle/wheels", ' in r.stdout
    assert (root / ".gpu_bundle" / "COMMIT").read_text().strip() == commit
    # the checkout moves on after the freeze: nothing may import it from here
    with open(root / "avspo_openrlhf" / "__init__.py", "a") as f:
        f.write('\nraise ImportError("the checkout, not the frozen commit")\n')
    slot, outs = tmp_path / "slot", [tmp_path / f"out{i}" for i in range(4)]
    env = {"AVSPO_SLOT": str(slot), "AVSPO_STUDY": STUDY}

    has_check = (root / "avspo_openrlhf" / "study" / "engine_check.py").is_file()
    check = ("--check-model", "tiny", "--check-dtype", "fp32") if has_check else ("--no-check",)
    if not has_check:
        warnings.warn(
            "no avspo_openrlhf/study/engine_check.py in this checkout: the slot is staged without its check",
            stacklevel=1,
        )
    r = script(root, "slot.sh", "stage", *check, env={**env, "OUT": str(outs[0])})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "staged the frozen tree of" in r.stdout and (slot / "tree" / STUDY).is_file()
    if has_check:
        assert json.loads((outs[0] / "engine_check.json").read_text())["ok"] is True
    r = script(root, "slot.sh", "stage", *check, env={**env, "OUT": str(outs[1])})  # a second call redoes nothing
    assert r.returncode == 0 and "is staged already" in r.stdout, r.stderr
    assert (outs[1] / "engine_check.json").is_file() == has_check
    r = script(root, "slot.sh", "runs", "5", env={**env, "OUT": str(outs[1])}, timeout=30)
    assert r.returncode == 2 and "staged for --model smollm2" in r.stderr

    r = script(
        root, "slot.sh", "runs", "5", "--model", "tiny", "--k", "2", "--seeds", "0", env={**env, "OUT": str(outs[2])}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    first = exported(outs[2])
    assert sorted(first) == ["AVSPO_seed0.json", "GRPO_seed0.json"]
    assert all(run["commit"] == commit for run in first.values())
    state = json.loads((outs[2] / "slot.json").read_text())
    assert state["commit"] == commit and state["runs_exported"] == sorted(first) and "CPU" in state["device"]
    assert state["status"] == "finished (exit 0)" and 0 < state["minutes"] < 5

    # between slots: the returned runs are published in the checkout as they came back, and the machine
    # forgets its runs (only the staged tree is kept)
    with tarfile.open(outs[2] / "runs.tar.gz") as t:
        t.extractall(root / HERE / "results" / "runs", filter="data")
    shutil.rmtree(slot / "runs")
    shutil.rmtree(slot / "published")
    r = script(root, "slot.sh", "runs", "5", "--model", "tiny", "--k", "2", env={**env, "OUT": str(outs[3])})
    assert r.returncode == 0, r.stdout + r.stderr
    second = exported(outs[3])
    assert sorted(second) == ["AVSPO_seed1.json", "GRPO_seed1.json"], "a published run was run again"
    assert all(run["commit"] == commit for run in second.values())


def test_the_frozen_commit_is_one_commit_named_where_the_study_says_it():
    """experiments/remedies_gpu/FROZEN holds the study's one commit, the README names it, and (in a clone
    with its history) it is a commit whose tree holds the study's code."""
    root = Path(__file__).resolve().parents[1]
    commit = (root / "experiments" / "remedies_gpu" / "FROZEN").read_text(encoding="utf-8").strip()
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    assert f"**Frozen commit: `{commit}`**" in (root / "experiments" / "remedies_gpu" / "README.md").read_text()
    if (root / ".git").exists():
        r = subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{commit}:avspo_openrlhf/study/loop.py"], capture_output=True
        )
        assert r.returncode == 0, f"{commit} is not a commit of this repository with the study loop"
    # a tag lives outside main's history (a clone of main may lack it): the README names the commit only
    assert not re.search(r"\btag `", (root / "experiments" / "remedies_gpu" / "README.md").read_text())
