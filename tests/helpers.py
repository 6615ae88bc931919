"""Shared test helpers: where the shared data lives, the tiny model's assets, the metrics page's names,
a child process that explains itself when it hangs."""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_file(name: str) -> str:
    """Path of a file in ../shared/data; skipped off CI when absent, a failure on CI."""
    path = SHARED_DATA / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing on CI")
        pytest.skip(f"{path} not available")
    return str(path)


def small_study(**changes):
    """The study loop's settings for tests on the tiny model (a few tokens, a small budget), with
    ``changes``: each test file states only what it needs otherwise."""
    import dataclasses

    from avspo_openrlhf.study.spec import StudySettings

    base = StudySettings(
        group_size=4,
        prompts_per_step=2,
        max_new_tokens=8,
        temperature=0.7,
        lr=1e-3,
        token_budget=150,
        reward="study_reward:parity",
        acr={"tau_init": 0.25, "window": 2},
        eval_n=2,
        mid_eval_tokens=40,
        mid_eval_problems=4,
        ckpt_every=2,
        micro_batch=4,
        gen_batch=16,
    )
    return dataclasses.replace(base, **changes)


def tiny_assets(root: Path, n_prompts: int = 32) -> dict:
    """The tiny random model and ``n_prompts`` arithmetic prompts under ``root`` (``cpu.tiny.tiny_assets``)."""
    from avspo_openrlhf.cpu import tiny

    return tiny.tiny_assets(str(root), n_prompts)


METRICS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented_metrics(text: str | None = None) -> re.Pattern:
    """Every name docs/metrics.md writes in backticks, as one pattern: ``*`` is any suffix,
    ``<level>`` one path part (``acr_by_level/<level>`` matches ``acr_by_level/add1``)."""
    text = METRICS_PAGE.read_text(encoding="utf-8") if text is None else text
    # the page's renaming rule (``acr_<view>`` becomes ``acr/<view>``, ``<remedy>/*`` keeps its name)
    # would match any name: TRL's and verl's names are mapped back instead (undocumented_metrics)
    names = {n for n in re.findall(r"`([A-Za-z0-9_/<>*.-]+)`", text) if not re.search(r"^<[^>]+>/\*$|<view>|<name>", n)}
    parts = [re.sub(r"<[^>/]+>", "[^/]+", re.escape(n).replace(r"\*", ".*")) for n in names]
    return re.compile("|".join(sorted(parts)))


def undocumented_metrics(keys) -> list[str]:
    """The logged names docs/metrics.md does not list (a front-end's logs checked against the page).
    A TRL/verl name ``acr/<x>`` counts as listed when the controller's name it comes from is
    (``acr_<x>`` or ``<x>``: the page's renaming rule, integrations.framework_metrics)."""
    pattern = documented_metrics()

    def listed(k: str) -> bool:
        x = k.removeprefix("acr/")
        return any(pattern.fullmatch(n) for n in {k, *((f"acr_{x}", x) if k.startswith("acr/") else ())})

    return sorted(k for k in set(keys) if not listed(k))


def stacks_then_kill(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """A Python child that ran past its time: SIGABRT first, so that faulthandler
    (``PYTHONFAULTHANDLER=1``, which run_tests.sh exports) writes every thread's stack to its stderr
    before it dies; SIGKILL if it is still there after ``grace`` s. A hang then names where it hung
    instead of a bare timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_or_show_stacks(cmd: list[str], timeout: float, env: dict) -> tuple[int, str, str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` whose timeout fails the test with the
    child's thread stacks and output (:func:`stacks_then_kill`) rather than a bare TimeoutExpired.
    Returns (returncode, stdout, stderr)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired as still:  # alive, or a process it started holds the pipes
                proc.kill()
                proc.wait()
                out, err = (
                    b.decode(errors="replace") if isinstance(b, bytes) else b or ""
                    for b in (still.output, still.stderr)
                )
            pytest.fail(
                f"{' '.join(cmd[:4])} ... still ran after {timeout:g} s; its stderr (every thread's stack last) "
                f"and stdout:\n{err[-8000:]}\n--- stdout ---\n{out[-3000:]}"
            )
    return proc.returncode, out, err
