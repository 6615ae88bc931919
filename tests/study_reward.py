"""Rewards for the study loop's tests on the tiny random model (``StudySettings.reward``
``study_reward:<name>``; the tests put this folder on the path of the runs they start)."""

from __future__ import annotations

import os
import time

_CALLS = {"n": 0}


def parity(completion: str, answer: str) -> float:
    """1 for a completion of even length: the tiny model's random text gets mixed groups."""
    return float(len(completion) % 2 == 0)


def half_collapsed(completion: str, answer: str) -> float:
    """Every completion of an odd-answer problem is wrong (its group collapses all-wrong); the others
    as :func:`parity`: DAPO dynamic sampling has groups to drop and refill."""
    return 0.0 if int(answer) % 2 else parity(completion, answer)


def parity_then_hang(completion: str, answer: str) -> float:
    """:func:`parity`, but the process hangs at the reward call whose count reaches
    ``STUDY_TEST_HANG_AT`` (counted per completion: a step of P prompts x G makes P x G calls), so a
    test kills a run at a known point, after its checkpoints."""
    _CALLS["n"] += 1
    hang_at = int(os.environ.get("STUDY_TEST_HANG_AT", "0"))
    if hang_at and _CALLS["n"] >= hang_at:
        open(os.environ["STUDY_TEST_HUNG_FILE"], "w").close()
        time.sleep(3600)
    return parity(completion, answer)


def ten(completion: str, answer: str) -> float:
    """:func:`parity` on a 0..10 scale: outside the default reward range (0, 1)."""
    return 10.0 * parity(completion, answer)


def explode_on_999(completion: str, answer: str) -> float:
    """:func:`half_collapsed`, but a problem whose answer is 999 raises: a run whose data holds one
    fails mid-run (the others, sharing its settings, do not)."""
    if answer == "999":
        raise RuntimeError("the verifier crashed on answer 999")
    return half_collapsed(completion, answer)
