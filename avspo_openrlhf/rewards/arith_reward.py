"""OpenRLHF reward file for the synthetic arithmetic task (``--reward.remote_url <this file>``).

Answers are integers, so no math-verify is needed: the answer is the last ``\\boxed{}`` of the
response or, failing that, its last integer (small models such as SmolLM2-135M often state the
result without boxing it; this is the documented rule of the CPU quickstart task, not of the math
benchmarks). Statuses: correct / wrong / no_answer / unparsable (a boxed answer that is not an
integer), logged as ``verify/<status>`` like the math reward.
"""

from __future__ import annotations

import re

import torch

from avspo_openrlhf.rewards.extract import last_boxed, response_from_query

STATUSES = ("correct", "wrong", "no_answer", "unparsable")
_INT = re.compile(r"-?\d[\d,]*")
MAX_DIGITS = 1000  # Python's int() refuses more than 4,300 digits; no answer here has 1,000


def arith_answer(response: str) -> tuple[str | None, str | None]:
    """``(answer, None)`` with the answer as a canonical integer string, or ``(None, status)`` with
    status ``no_answer`` / ``unparsable``."""
    boxed = last_boxed(response)
    if boxed is not None:
        text = boxed.replace(",", "").replace("$", "").strip()
        if not re.fullmatch(r"-?\d+", text) or len(text) > MAX_DIGITS:
            return None, "unparsable"
        return str(int(text)), None
    nums = _INT.findall(response)
    if not nums:
        return None, "no_answer"
    last = nums[-1].replace(",", "")
    if len(last) > MAX_DIGITS:
        return None, "unparsable"
    return str(int(last)), None


def score_arith(response: str, gold: str) -> str:
    pred, status = arith_answer(response)
    if pred is None:
        return status
    gold = str(gold).strip()
    try:
        if len(gold) > MAX_DIGITS + 1:
            raise ValueError(gold)
        return "correct" if int(pred) == int(gold) else "wrong"
    except ValueError:  # a gold answer that is not an integer
        return "unparsable"


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    statuses = [score_arith(response_from_query(q, p), lb) for q, p, lb in zip(queries, prompts, labels)]
    rewards = torch.tensor([float(s == "correct") for s in statuses])
    logs = {f"verify/{s}": torch.tensor([float(x == s) for x in statuses]) for s in STATUSES}
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": logs}
