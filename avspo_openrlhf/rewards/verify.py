"""Verify one completion against a gold answer with math-verify, always returning a status.

Statuses: ``correct`` (reward 1), ``wrong``, ``no_answer`` (nothing to extract), ``unparsable``
(extracted, but math-verify cannot read it, or over the length cap), ``timeout`` (set by the
process pool: two attempts each overran its timeout), ``error`` (an exception; its text is kept).
Only ``correct`` earns reward 1.

This function has no timeout of its own: math-verify's timeouts use SIGALRM, which does not work
in threads or async actors. :class:`~avspo_openrlhf.rewards.pool.VerifierPool` runs it in worker
processes and kills a worker that overruns.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from .extract import extract_answer

# math-verify warns on every call that its own (SIGALRM) timeout is disabled: we enforce ours.
logging.getLogger("math_verify").setLevel(logging.ERROR)

STATUSES = ("correct", "wrong", "no_answer", "unparsable", "timeout", "error")
MAX_COMPLETION_CHARS = 32_000  # the tail is kept: final answers come last
MAX_ANSWER_CHARS = 1_000


@dataclass(frozen=True)
class VerifyResult:
    status: str
    pred: str | None = None  # the extracted answer
    detail: str = ""  # why (error text, cap hit, ...)
    retries: int = 0  # attempts retried after overrunning the pool's timeout (0 or 1)

    @property
    def reward(self) -> float:
        return 1.0 if self.status == "correct" else 0.0


def _as_math(answer: str) -> str:
    # Raw gold like `2\sqrt{3}` is mis-parsed silently unless it is in math mode.
    a = answer.strip()
    return a if a.startswith("$") else f"${a}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    from math_verify import parse

    return parse(_as_math(gold), parsing_timeout=None)


def verify_answer(
    completion: str,
    gold: str,
    max_completion_chars: int = MAX_COMPLETION_CHARS,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    multi_box: bool = True,
) -> VerifyResult:
    """Score ``completion`` against ``gold`` (no timeout here; see the module docstring).

    Several boxes closing the completion are one answer verified as a whole
    (:func:`~avspo_openrlhf.rewards.extract.final_boxes`); ``multi_box=False`` keeps the last box only.
    """
    try:
        from math_verify import parse, verify

        if not isinstance(completion, str) or not isinstance(gold, str):
            return VerifyResult(
                "error",
                detail=f"expected str completion and gold, got {type(completion).__name__}, {type(gold).__name__}",
            )
        if not gold.strip():
            return VerifyResult("error", detail="empty gold answer")
        if len(gold) > max_answer_chars:
            return VerifyResult("error", detail=f"gold answer longer than {max_answer_chars} chars")
        pred, _ = extract_answer(completion[-max_completion_chars:], multi_box)
        if pred is None:
            return VerifyResult("no_answer")
        if len(pred) > max_answer_chars:
            return VerifyResult("unparsable", pred[:200], f"answer longer than {max_answer_chars} chars")
        gold_parsed = _parse_gold(gold)
        if not gold_parsed:
            return VerifyResult("error", pred, f"gold answer unparsable: {gold[:200]!r}")
        pred_parsed = parse(_as_math(pred), parsing_timeout=None)
        if not pred_parsed:
            return VerifyResult("unparsable", pred)
        ok = verify(gold_parsed, pred_parsed, timeout_seconds=None)
        return VerifyResult("correct" if ok else "wrong", pred)
    except Exception as e:  # noqa: BLE001 - every failure becomes an explicit status
        return VerifyResult("error", detail=f"{type(e).__name__}: {e}"[:500])


def verify_full_text(
    completion: str,
    gold: str,
    max_completion_chars: int = MAX_COMPLETION_CHARS,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    multi_box: bool = True,  # unused: math-verify extracts by itself
) -> VerifyResult:
    """A second opinion: math-verify's own extraction on the whole completion (its default LaTeX +
    expression configs), against the same gold. No timeout here either (run it in the pool)."""
    try:
        from math_verify import parse, verify

        if not isinstance(completion, str) or not isinstance(gold, str) or not gold.strip():
            return VerifyResult("error", detail="needs a str completion and a non-empty str gold")
        gold_parsed = _parse_gold(gold)
        if not gold_parsed:
            return VerifyResult("error", detail=f"gold answer unparsable: {gold[:200]!r}")
        pred_parsed = parse(completion[-max_completion_chars:], parsing_timeout=None)
        if not pred_parsed:
            return VerifyResult("no_answer")
        ok = verify(gold_parsed, pred_parsed, timeout_seconds=None)
        return VerifyResult("correct" if ok else "wrong", str(pred_parsed[-1])[:200])
    except Exception as e:  # noqa: BLE001
        return VerifyResult("error", detail=f"{type(e).__name__}: {e}"[:500])


# What a pool worker can run on (completion, gold): the project's verdict, the project's verdict
# with the last box only, and math-verify's full-text second opinion.
VERIFIERS = {
    "project": verify_answer,
    "last_box": functools.partial(verify_answer, multi_box=False),
    "math_verify": verify_full_text,
}
