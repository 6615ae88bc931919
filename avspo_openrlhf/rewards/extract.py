"""Final-answer extraction from a model completion (pure Python, no sympy).

Order of the documented fallbacks, first hit wins:
1. ``boxed``: the last balanced, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces
   allowed), or ``\\boxed 5`` (space form);
2. ``phrase``: the last "final answer is X" / "the answer is X" / "Answer: X" (to the end of the
   line or sentence; surrounding ``$`` and a trailing period are dropped);
3. ``hash``: GSM8K's ``#### X``.
"""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SPACE_RE = re.compile(r"\\boxed\s+([^\s${}]+)")
_PHRASE_RE = re.compile(r"(?:final answer is|the answer is|answer\s*:)\s*(.+?)(?:\n|$|\.(?:\s|$))", re.IGNORECASE)
_HASH_RE = re.compile(r"####\s*([^\n]+)")
# chat-template markers that may trail a decoded completion
_SPECIAL_TAIL_RE = re.compile(r"(?:<\|[^|>]{1,40}\|>|</s>|<eos>|\s)+$")


def _balanced_from(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``, or None if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{" and text[i - 1] != "\\":
            depth += 1
        elif c == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last balanced, non-empty ``\\boxed{...}`` (or ``\\fbox``) in ``text``."""
    for m in reversed(list(_BOX_RE.finditer(text))):
        inner = _balanced_from(text, m.end() - 1)
        if inner is not None and inner.strip():
            return inner.strip()
    spaced = _BOX_SPACE_RE.findall(text)
    return spaced[-1] if spaced else None


def extract_answer(text: str) -> tuple[str | None, str]:
    """``(answer, method)``; ``(None, "none")`` when nothing answer-like is found."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    phrases = _PHRASE_RE.findall(text)
    if phrases:
        ans = phrases[-1].strip().strip("$").strip()
        if ans:
            return ans, "phrase"
    hashes = _HASH_RE.findall(text)
    if hashes:
        return hashes[-1].strip().replace(",", ""), "hash"
    return None, "none"


def response_from_query(query: str, prompt: str) -> str:
    """The generated part of OpenRLHF's ``query`` (decoded prompt + response, special tokens kept).

    The prompt's own text (e.g. "put your final answer within \\boxed{}") must not be mistaken
    for an answer, so the prompt is cut off: exactly when the query starts with it, else after
    the last occurrence of its tail (decoding can change whitespace at the start).
    """
    if prompt and query.startswith(prompt):
        response = query[len(prompt) :]
    else:
        tail = prompt.strip()[-64:]
        pos = query.rfind(tail) if tail else -1
        response = query[pos + len(tail) :] if pos >= 0 else query
    return _SPECIAL_TAIL_RE.sub("", response).lstrip()
