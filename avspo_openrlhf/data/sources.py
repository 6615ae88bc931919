"""Benchmark sources and their conversion to the project's one jsonl schema.

Every prepared row has::

    problem    str   the question text (never empty)
    answer     str   the gold final answer (for MMLU-Pro: the option letter)
    source     str   benchmark name (math_train, math500, gsm8k, ...)
    level      str | None    difficulty ("Level 3", "1", "add1", ...)
    subject    str | None    subject / category
    unique_id  str   stable id within the source
    solution   str   reference solution when the source has one ("" otherwise)
    choices    list[str]     answer options (MMLU-Pro only)
    prompt     list[dict] | str   the chat messages (or plain text) from the chosen template

Each source names its Hugging Face dataset (for online preparation) and a converter from one raw
row (the hub's field names; local files in the same format work offline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rewards.extract import last_boxed


class BadRow(ValueError):
    """A raw row that cannot be converted; the loader adds file and line."""


def _text(row: dict, key: str) -> str:
    if key not in row:
        raise BadRow(f"missing field {key!r}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRow(f"field {key!r} must be a string or number, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise BadRow(f"field {key!r} is empty")
    return text


def _opt(row: dict, key: str) -> str | None:
    v = row.get(key)
    return None if v is None else str(v)


def _math(row: dict, source: str) -> dict:
    solution = _text(row, "solution")
    answer = row.get("answer")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        answer = last_boxed(solution)
        if answer is None:
            raise BadRow("no 'answer' field and no \\boxed{} answer in 'solution'")
    else:
        answer = _text(row, "answer")
    level = row.get("level")
    return {
        "problem": _text(row, "problem"),
        "answer": answer,
        "source": source,
        "level": None if level is None else (str(level) if str(level).startswith("Level") else f"Level {level}"),
        "subject": _opt(row, "subject") or _opt(row, "type"),
        "unique_id": _opt(row, "unique_id") or "",
        "solution": solution,
    }


def _gsm8k(row: dict, source: str) -> dict:
    full = _text(row, "answer")
    if "####" not in full:
        raise BadRow("GSM8K 'answer' has no '#### <number>' line")
    return {
        "problem": _text(row, "question"),
        "answer": full.rsplit("####", 1)[1].strip().replace(",", ""),
        "source": source,
        "level": None,
        "subject": None,
        "unique_id": "",
        "solution": full,
    }


def _question_answer(qkey: str, akey: str, idkey: str | None = None, solkey: str | None = None):
    def convert(row: dict, source: str) -> dict:
        answer = row.get(akey)
        if isinstance(answer, list):  # OlympiadBench: final_answer is a one-element list
            if not answer:
                raise BadRow(f"field {akey!r} is an empty list")
            answer = ", ".join(str(a) for a in answer)
            row = {**row, akey: answer}
        if isinstance(answer, float) and answer.is_integer():  # AMC stores 142.0
            row = {**row, akey: int(answer)}
        return {
            "problem": _text(row, qkey),
            "answer": _text(row, akey),
            "source": source,
            "level": _opt(row, "level"),
            "subject": _opt(row, "subject") or _opt(row, "type"),
            "unique_id": (_opt(row, idkey) if idkey else None) or "",
            "solution": (_opt(row, solkey) if solkey else None) or "",
        }

    return convert


def _mmlu_pro(row: dict, source: str) -> dict:
    options = row.get("options")
    if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
        raise BadRow("field 'options' must be a non-empty list of strings")
    letter = _text(row, "answer").upper()
    if len(letter) != 1 or not "A" <= letter < chr(ord("A") + len(options)):
        raise BadRow(f"answer {letter!r} is not one of the {len(options)} option letters")
    question = _text(row, "question")
    listed = "\n".join(f"({chr(ord('A') + i)}) {o}" for i, o in enumerate(options))
    return {
        "problem": f"{question}\n\nOptions:\n{listed}\n\nAnswer with the letter of the correct option.",
        "answer": letter,
        "source": source,
        "level": None,
        "subject": _opt(row, "category"),
        "unique_id": _opt(row, "question_id") or "",
        "solution": "",
        "choices": options,
    }


@dataclass(frozen=True)
class Source:
    name: str
    hub_id: str
    hub_configs: tuple[str | None, ...]
    split: str
    convert: Callable[[dict, str], dict[str, Any]]
    note: str = ""


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)

SOURCES: dict[str, Source] = {
    s.name: s
    for s in [
        Source(
            "math_train",
            "EleutherAI/hendrycks_math",
            MATH_SUBJECTS,
            "train",
            _math,
            "MATH train, 7,500; answer = last \\boxed{} of the solution",
        ),
        Source("math_test", "EleutherAI/hendrycks_math", MATH_SUBJECTS, "test", _math, "MATH test, 5,000"),
        Source("math500", "HuggingFaceH4/MATH-500", (None,), "test", _math, "MATH-500 (Lightman et al.)"),
        Source("gsm8k", "openai/gsm8k", ("main",), "test", _gsm8k, "GSM8K test, 1,319"),
        Source(
            "minerva",
            "math-ai/minervamath",
            (None,),
            "test",
            _question_answer("question", "answer"),
            "Minerva-Math, 272",
        ),
        Source(
            "olympiadbench",
            "Hothan/OlympiadBench",
            ("OE_TO_maths_en_COMP",),
            "train",
            _question_answer("question", "final_answer", "id", "solution"),
            "OlympiadBench, English open-ended math (675)",
        ),
        Source(
            "amc",
            "AI-MO/aimo-validation-amc",
            (None,),
            "train",
            _question_answer("problem", "answer", "id"),
            "AMC 2022-23, 83",
        ),
        Source(
            "aime24",
            "HuggingFaceH4/aime_2024",
            (None,),
            "train",
            _question_answer("problem", "answer", "id", "solution"),
            "AIME 2024, 30",
        ),
        Source(
            "mmlu_pro", "TIGER-Lab/MMLU-Pro", (None,), "test", _mmlu_pro, "MMLU-Pro (out of domain), multiple choice"
        ),
    ]
}
