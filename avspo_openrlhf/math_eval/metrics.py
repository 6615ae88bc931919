"""Benchmark metrics (pure Python + numpy): pass@k, majority vote, breakdowns, multiple choice."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from math import comb

import numpy as np


def pass_at_k(n: np.ndarray | int, c: np.ndarray | int, k: int) -> np.ndarray:
    """Unbiased pass@k (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)`` per problem, with ``n``
    samples of which ``c`` are correct. Computed as a stable product; ``k <= n`` is required."""
    n, c = np.atleast_1d(np.asarray(n, dtype=np.int64)), np.atleast_1d(np.asarray(c, dtype=np.int64))
    if k < 1 or (n < k).any():
        raise ValueError(f"pass@{k} needs 1 <= k <= n for every problem")
    if ((c < 0) | (c > n)).any():
        raise ValueError("need 0 <= c <= n")
    out = np.ones(n.shape, dtype=np.float64)
    fail = n - c >= k  # otherwise every k-subset holds a correct sample
    # C(n-c, k)/C(n, k) = prod_{i=n-c+1..n} (1 - k/i)
    for idx in np.nonzero(fail)[0]:
        i = np.arange(n[idx] - c[idx] + 1, n[idx] + 1, dtype=np.float64)
        out[idx] = 1.0 - np.prod(1.0 - k / i)
    return out


def pass_at_k_exact(n: int, c: int, k: int) -> float:
    """The same estimator with exact binomials (reference for tests)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_vote(answers: list[str | None], correct: list[bool]) -> bool:
    """maj@n: the most frequent extracted answer (ties: the first to reach the count) is correct iff
    a sample with that answer was verified correct. Samples without an answer do not vote."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    return any(ok for a, ok in zip(answers, correct) if a == winner)


_MC_PATTERNS = [
    re.compile(r"\\boxed\{\s*\(?([A-Za-z])\)?\s*\}"),
    re.compile(r"answer is:?\s*\(?([A-Za-z])\)?(?![A-Za-z])", re.IGNORECASE),
    re.compile(r"answer:\s*\(?([A-Za-z])\)?(?![A-Za-z])", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-Za-z])\)?\s*$"),
]


def extract_choice(completion: str, num_choices: int) -> str | None:
    """The option letter a completion picks: last ``\\boxed{X}``, else "answer is (X)", else
    "Answer: X", else a bare letter; letters beyond the options do not count."""
    valid = {chr(ord("A") + i) for i in range(num_choices)}
    for pat in _MC_PATTERNS:
        found = [m.group(1).upper() for m in pat.finditer(completion)]
        found = [f for f in found if f in valid]
        if found:
            return found[-1]
    return None


def summarize(records: list[dict], ks: list[int] | None = None) -> dict:
    """Benchmark summary from per-problem records (``correct`` list, ``answers``, ``statuses``,
    ``retries``, ``lengths``, ``truncated``, ``level``, ``subject``); ``ks`` default: powers of 2 up to n."""
    if not records:
        return {"num_problems": 0}
    n = np.array([len(r["correct"]) for r in records])
    c = np.array([sum(r["correct"]) for r in records])
    out: dict = {"num_problems": len(records), "samples_per_problem": int(n.min())}
    out["pass@1"] = float(np.mean(c / n))
    for k in ks or [2**i for i in range(1, 8)]:
        if k > 1 and k <= n.min():
            out[f"pass@{k}"] = float(pass_at_k(n, c, k).mean())
    if n.min() > 1:
        out[f"maj@{int(n.min())}"] = float(np.mean([majority_vote(r["answers"], r["correct"]) for r in records]))
    statuses = Counter(s for r in records for s in r["statuses"])
    out["statuses"] = dict(sorted(statuses.items()))
    # the verifier's timing: final timeouts, and attempts retried after overrunning the timeout (a
    # busy machine shows here first; records written before retries were recorded count 0)
    out["verify_timeouts"] = statuses.get("timeout", 0)
    out["verify_retries"] = int(sum(sum(r.get("retries") or ()) for r in records))
    lengths = [x for r in records for x in r.get("lengths", [])]
    out["mean_response_tokens"] = float(np.mean(lengths)) if lengths else None
    trunc = [bool(x) for r in records for x in r.get("truncated", [])]
    out["truncation_rate"] = float(np.mean(trunc)) if trunc else None
    for key in ("level", "subject"):
        groups: dict[str, list[float]] = defaultdict(list)
        for r in records:
            if r.get(key) is not None:
                groups[str(r[key])].append(sum(r["correct"]) / len(r["correct"]))
        if len(groups) > 1:
            out[f"pass@1_by_{key}"] = {g: float(np.mean(v)) for g, v in sorted(groups.items())}
    return out
