"""Final-answer extraction from a model completion (pure Python, no sympy).

Order of the documented fallbacks, first hit wins:
1. ``boxed``: the last balanced, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces
   allowed), or ``\\boxed 5`` (space form). ``boxed_multi``: when the closing part boxes several
   answers (``\\boxed{1}, \\boxed{2}``), they are one answer, joined with ", " and verified as a whole
   (see :func:`final_boxes` for the rule);
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
# a chat-template marker that may end a decoded completion
_SPECIAL_END_RE = re.compile(r"(?:<\|[^|>]{1,40}\|>|</s>|<eos>)$")


def _strip_special_tail(text: str) -> str:
    """Trailing whitespace and chat-template markers removed, in linear time (a single regex
    ``(marker|\\s)+$`` backtracks quadratically: 7.9 s on 30k spaces followed by a word)."""
    while True:
        text = text.rstrip()
        m = _SPECIAL_END_RE.search(text, max(0, len(text) - 48))
        if m is None:
            return text
        text = text[: m.start()]


def _brace_pairs(text: str) -> dict[int, int]:
    """Every unescaped ``{`` at index i that is closed, mapped to its ``}``: one pass with a stack
    (scanning from each box to the end was quadratic on many unclosed boxes: 30 s on 98k chars)."""
    pairs, stack = {}, []
    for i, c in enumerate(text):
        if c in "{}" and i > 0 and text[i - 1] == "\\":
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _balanced_from(text: str, start: int, pairs: dict[int, int] | None = None) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``, or None if unbalanced."""
    end = (_brace_pairs(text) if pairs is None else pairs).get(start)
    return None if end is None else text[start + 1 : end]


def last_boxed(text: str) -> str | None:
    """Content of the last balanced, non-empty ``\\boxed{...}`` (or ``\\fbox``) in ``text``."""
    pairs = _brace_pairs(text)
    for m in reversed(list(_BOX_RE.finditer(text))):
        inner = _balanced_from(text, m.end() - 1, pairs)
        if inner is not None and inner.strip():
            return inner.strip()
    spaced = _BOX_SPACE_RE.findall(text)
    return spaced[-1] if spaced else None


# Text allowed between two boxes of one final answer: separators, math-mode delimiters, spacing
# macros, "and"/"or", and a short left-hand side such as "x =" or "n_2 =". Anything else (a
# sentence, a blank line) means the earlier box was an intermediate result.
_CONNECTOR_RE = re.compile(
    r"(?:\s|[,;&~$]|\\[()\[\]]|\\q?quad\b|\\[,;:! ]|\\\\|\\(?:text|mathrm|textbf|mbox)\s*\{\s*(?:and|or|,)?\s*\}"
    r"|\b(?:and|or)\b|[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=)*",
    re.IGNORECASE,
)
MAX_JOIN_GAP = 64  # characters between two joined boxes, at most
_LHS_RE = re.compile(r"^\s*([A-Za-z](?:_\{?\w{1,3}\}?)?)\s*=(?!=)\s*(.*)$", re.DOTALL)


def all_boxes(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every balanced, non-empty box, in text order."""
    out, pairs = [], _brace_pairs(text)
    for m in _BOX_RE.finditer(text):
        inner = _balanced_from(text, m.end() - 1, pairs)
        if inner is not None and inner.strip():
            out.append((m.start(), m.end() + len(inner) + 1, inner.strip()))
    return out


def _same_value(a: str, b: str) -> bool:
    """Two boxes state one value: equal up to spaces, or ``x = 5`` beside ``5`` (one side has no
    left-hand side, or both have the same one)."""

    def split(s):
        m = _LHS_RE.match(s)
        return (m.group(1), m.group(2)) if m else ("", s)

    (la, ra), (lb, rb) = split(a), split(b)
    if re.sub(r"\s+", "", ra) != re.sub(r"\s+", "", rb):
        return False
    return la == lb or not la or not lb


def final_boxes(text: str) -> list[str]:
    """The boxed answers of the completion's closing part, oldest first, each value once.

    The last box and every box before it that is separated from the next one by connector text
    only (commas, ``and``/``or``, ``\\quad``, ``$``, a left-hand side like ``y =``; at most
    :data:`MAX_JOIN_GAP` characters, no sentence) belong to one final answer. A repeated value
    counts once (``\\boxed{x=5} ... \\boxed{5}`` is one answer). A box further back is an
    intermediate result and is ignored. The caller verifies the boxes *together*, so listing
    alternatives (``\\boxed{3} or \\boxed{5}``) never matches a single gold value.
    """
    boxes = all_boxes(text)
    if not boxes:
        return []
    first = len(boxes) - 1
    while first > 0:
        gap = text[boxes[first - 1][1] : boxes[first][0]]
        if len(gap) > MAX_JOIN_GAP or "\n\n" in gap or not _CONNECTOR_RE.fullmatch(gap):
            break
        first -= 1
    values: list[str] = []
    for _, _, content in boxes[first:]:
        if not any(_same_value(content, v) for v in values):
            values.append(content)
    return values


def extract_answer(text: str, multi_box: bool = True) -> tuple[str | None, str]:
    """``(answer, method)``; ``(None, "none")`` when nothing answer-like is found.

    ``multi_box=False`` keeps only the last box (the rule before multi-answer extraction; used by
    the audit to count what the rule changes)."""
    if multi_box:
        values = final_boxes(text)
        if len(values) > 1:
            return ", ".join(values), "boxed_multi"
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
    return _strip_special_tail(response).lstrip()
