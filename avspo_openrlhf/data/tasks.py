"""Prompt templates, the synthetic arithmetic task, and Level3-500 selection."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

PAPER_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = ("paper", "user", "plain", "none")


def make_prompt(problem: str, template: str = "paper"):
    """``paper``: chat messages with the paper's system prompt (OpenRLHF applies the tokenizer's
    chat template with ``--data.apply_chat_template``); ``user``: one user message asking for a
    boxed answer, no system prompt (small instruct models such as SmolLM2-135M answer far more
    often this way); ``plain``: one string for base models without a chat template; ``none``: the
    bare problem."""
    if template == "paper":
        return [{"role": "system", "content": PAPER_SYSTEM_PROMPT}, {"role": "user", "content": problem}]
    if template == "user":
        return [{"role": "user", "content": f"{problem} Put the final answer in \\boxed{{}}."}]
    if template == "plain":
        return f"Question: {problem}\n{PAPER_SYSTEM_PROMPT}\nAnswer:"
    if template == "none":
        return problem
    raise ValueError(f"unknown template {template!r}; choose from {TEMPLATES}")


# ── synthetic arithmetic ──
# Difficulty levels chosen so a 135M instruct model gets all-right, mixed and all-wrong groups
# (SmolLM2-135M: single-digit addition ~0.4 mean reward, two-digit addition ~0.05).


def _add1(rng):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"What is {a} + {b}?", a + b


def _mul1(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"What is {a} * {b}?", a * b


def _add2(rng):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a} + {b}?", a + b


def _multi(rng):
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    return f"What is {a} * {b} + {c}?", a * b + c


ARITH_LEVELS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "add1": _add1,
    "mul1": _mul1,
    "add2": _add2,
    "multi": _multi,
}


def synthetic_arithmetic(n: int, levels: Sequence[str] = tuple(ARITH_LEVELS), seed: int = 0) -> list[dict]:
    """``n`` problems cycling through ``levels``, seeded; exact integer answers."""
    unknown = set(levels) - set(ARITH_LEVELS)
    if unknown:
        raise ValueError(f"unknown arithmetic levels {sorted(unknown)}; choose from {list(ARITH_LEVELS)}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        level = levels[i % len(levels)]
        problem, answer = ARITH_LEVELS[level](rng)
        rows.append(
            {
                "problem": problem,
                "answer": str(answer),
                "source": "synthetic_arith",
                "level": level,
                "subject": "arithmetic",
                "unique_id": f"arith/{seed}/{i}",
                "solution": "",
                "datasource": level,  # OpenRLHF's per-source key: per-level ACR and eval metrics
            }
        )
    return rows


# ── Level3-500 ──


def level3_proxy(math_train_rows: list[dict], n: int = 500, seed: int = 0) -> list[dict]:
    """PROXY for Level3-500: a seeded draw of ``n`` MATH-train problems tagged "Level 3". The
    paper's set is selected by a model's accuracy (see :func:`select_by_accuracy`)."""
    pool = [r for r in math_train_rows if r.get("level") == "Level 3"]
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} Level 3 problems, asked for {n}")
    return [{**r, "source": "level3_proxy"} for r in random.Random(seed).sample(pool, n)]


def select_by_accuracy(
    rows: list[dict],
    sample_fn: Callable[[list[dict], int], list[list[str]]],
    score_fn: Callable[[list[str], list[str]], list[float]],
    k: int = 8,
    band: tuple[float, float] = (0.3, 0.5),
    n: int = 500,
    seed: int = 0,
) -> list[dict]:
    """Level3-500 selection: sample ``k`` completions per problem with ``sample_fn(rows, k)``,
    score them with ``score_fn(completions, golds)``, keep problems whose accuracy lies in
    ``band`` (inclusive), and draw ``n`` of them with ``seed``. Each kept row gets its
    ``selector_accuracy``. Raises if fewer than ``n`` problems fall in the band."""
    completions = sample_fn(rows, k)
    flat = [c for cs in completions for c in cs]
    golds = [r["answer"] for r, cs in zip(rows, completions) for _ in cs]
    scores = score_fn(flat, golds)
    kept, pos = [], 0
    for row, cs in zip(rows, completions):
        acc = sum(scores[pos : pos + len(cs)]) / len(cs)
        pos += len(cs)
        if band[0] <= acc <= band[1]:
            kept.append({**row, "source": "level3_500", "selector_accuracy": acc})
    if len(kept) < n:
        raise ValueError(f"only {len(kept)} problems have accuracy in {band}; asked for {n} (sample more problems)")
    return random.Random(seed).sample(kept, n)
