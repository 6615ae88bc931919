"""A remedies study's task: its problems (a training pool and a held-out set, disjoint), their levels
and the reward that scores a completion, in one place. The built-in arithmetic task is
``GPURemediesStudy.make_data``'s; a user's task is a jsonl with a prompt field, an answer field and
an optional level field (:class:`Task`), written into the rows the study loop reads
(``problem``, ``answer``, ``level``, ``unique_id`` = ``<split>/<level>/<k>``). A problem's level is its
row's ``level`` field (:func:`level_of`), the one rule the loop's level-weighted pass@1, the reports'
per-level and paired tables and the CPU study read; a report maps a run's per-problem records to levels
through the rows it scored (:func:`levels_by_id`).

Reward names, one space with ``avspo-train``'s ``--reward.remote_url avspo:NAME``: ``arith`` (the last
integer, ``rewards.arith_reward``), ``math`` (math-verify), the same with the ``avspo:`` prefix, or a
user's function ``module:function`` (importable from the current folder) or ``path/to/file.py:function``,
called as ``function(completion, answer) -> float``. A reward's values must lie in its declared range
(``ACRConfig.reward_range``, 0..1 by default): a value outside it stops the run, naming it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf.data.io import DataError, iter_raw, write_jsonl

BUILTIN_REWARDS = ("arith", "math")


class TaskError(ValueError):
    """A task that no run can use (its file, its fields, its reward): said in one line."""


def read_rows(path: str) -> list[dict]:
    """A jsonl of problems in the loop's fields: each row needs ``problem`` and ``answer``; a bad row
    names file and line."""
    rows = []
    for i, row in iter_raw(path):
        if isinstance(row, Exception):
            raise DataError(f"{path}:{i}: {row}")
        if not isinstance(row, dict) or "problem" not in row or "answer" not in row:
            raise DataError(f"{path}:{i}: a row needs 'problem' and 'answer'")
        row.setdefault("unique_id", f"{Path(path).stem}/{len(rows)}")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no problems")
    return rows


def level_of(row: dict) -> str:
    """A problem's level: its row's ``level`` field, "" for a row without one."""
    return str(row.get("level", ""))


def levels_by_id(rows: Iterable[dict]) -> dict[str, str]:
    """``unique_id -> level`` (:func:`level_of`) of the problems a study scores."""
    return {r["unique_id"]: level_of(r) for r in rows}


def normalize_reward(name: str) -> str:
    """The one spelling of a reward name: ``avspo:arith`` is ``arith``; a ``file.py:function`` path
    made absolute (run processes may start elsewhere). Refuses a name no run can mean."""
    if name.startswith("avspo:"):
        name = name.removeprefix("avspo:")
        if name not in BUILTIN_REWARDS:
            raise TaskError(f"--reward avspo:{name}: unknown; the built-in rewards are {', '.join(BUILTIN_REWARDS)}")
    if name in BUILTIN_REWARDS:
        return name
    where, _, fn = name.rpartition(":")
    if not where or not fn:
        raise TaskError(f"--reward {name}: not arith, math, avspo:NAME, module:function or file.py:function")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise TaskError(f"--reward {name}: no such file: {where}")
        return f"{Path(where).resolve()}:{fn}"
    return name


def _user_function(name: str) -> Callable[[str, str], float]:
    where, _, fn = name.rpartition(":")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(
                f"avspo_reward_{hashlib.sha1(where.encode()).hexdigest()[:8]}", where
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, OSError) as e:
        raise TaskError(f"--reward {name}: cannot import {where} ({type(e).__name__}: {e})") from None
    one = getattr(module, fn, None)
    if not callable(one):
        raise TaskError(f"--reward {name}: {where} has no function {fn!r}")
    return one


def reward_source(name: str) -> str | None:
    """The content hash of a user's reward's source file (two runs with an edited reward under one
    name do not pair); None for a built-in reward (its code is the package's)."""
    if name in BUILTIN_REWARDS:
        return None
    where = name.rpartition(":")[0]
    path = where if where.endswith(".py") else getattr(importlib.util.find_spec(where), "origin", None)
    if not path or not Path(path).is_file():
        raise TaskError(f"--reward {name}: cannot find the source of {where}")
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def reward_function(name: str) -> Callable[[list[str], list[str]], list[float]]:
    """``(completions, answers) -> rewards`` for the task: ``arith`` (integer answers,
    ``rewards.arith_reward``), ``math`` (math-verify in a pool of processes with a per-sample timeout),
    or a user's ``function(completion, answer)``. Its range is checked where the rewards are read
    (the controller refuses a reward outside ``acr.reward_range`` at the step; :meth:`Task.check_reward`
    before any run)."""
    if name == "arith":
        from avspo_openrlhf.rewards.arith_reward import score_arith

        return lambda texts, golds: [float(score_arith(t, g) == "correct") for t, g in zip(texts, golds)]
    if name == "math":
        from avspo_openrlhf.rewards.pool import VerifierPool

        pool = VerifierPool()
        return lambda texts, golds: [float(r.status == "correct") for r in pool.score(texts, golds)]
    one = _user_function(name)
    return lambda texts, golds: [float(one(t, g)) for t, g in zip(texts, golds)]


@dataclass(frozen=True)
class Task:
    """A user's task: the problems of ``train`` (a jsonl), held out ``heldout`` or else a seeded share of
    the training file (distinct problems, none in training), with the fields named here."""

    train: str
    heldout: str | None = None
    heldout_share: float = 0.2  # without --heldout: this share of the distinct problems, held out
    prompt_field: str = "problem"
    answer_field: str = "answer"
    level_field: str | None = None  # None: one level, "all"
    reward: str = "arith"
    reward_range: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self):
        if not 0 < self.heldout_share < 1:
            raise TaskError(f"--heldout-share must be in (0, 1), got {self.heldout_share}")
        lo, hi = self.reward_range
        if not lo < hi:
            raise TaskError(f"--reward-range: LO < HI, got {lo:g} {hi:g}")
        for path in (self.train, self.heldout):
            if path is not None and not Path(path).is_file():
                raise TaskError(f"--task: no such file: {path}")

    def read(self, path: str) -> list[dict]:
        """The user's rows as ``{problem, answer, level}``; a row without a field names file, line and field."""
        fields = {"prompt": self.prompt_field, "answer": self.answer_field, "level": self.level_field}
        rows = []
        for i, row in iter_raw(path):
            if isinstance(row, Exception):
                raise TaskError(f"{path}:{i}: {row}")
            for flag, f in fields.items():
                if f is not None and (not isinstance(row, dict) or row.get(f) in (None, "")):
                    raise TaskError(f"{path}:{i}: the row has no {f!r} (--{flag}-field)")
            level = str(row[self.level_field]) if self.level_field else "all"
            if "/" in level:
                raise TaskError(f"{path}:{i}: a level may not hold '/', got {level!r}")
            rows.append({"problem": str(row[self.prompt_field]), "answer": str(row[self.answer_field]), "level": level})
        if not rows:
            raise TaskError(f"{path}: no problems")
        return rows

    def prepare(self, out: Path, heldout_max: int | None = None) -> tuple[str, str, tuple[str, ...]]:
        """The training pool and the held-out set in the loop's rows (``out/train.jsonl``,
        ``out/heldout.jsonl``, its first ``heldout_max`` problems), and the held-out levels; a held-out
        problem that is also a training problem is refused (given files) or never drawn (a split)."""
        train = self.read(self.train)
        if self.heldout is not None:
            heldout = self.read(self.heldout)
            both = {r["problem"] for r in train} & {r["problem"] for r in heldout}
            if both:
                raise TaskError(
                    f"--heldout: {len(both)} held-out problems are training problems too (e.g. {sorted(both)[0][:60]!r})"
                )
        else:
            distinct = sorted({r["problem"] for r in train})
            random.Random(0).shuffle(distinct)
            held = set(distinct[: max(1, round(self.heldout_share * len(distinct)))])
            if len(held) == len(distinct):
                raise TaskError(
                    f"--task {self.train}: {len(distinct)} distinct problems cannot be split; add --heldout"
                )
            heldout = [r for r in train if r["problem"] in held]
            train = [r for r in train if r["problem"] not in held]
        heldout = heldout[:heldout_max]
        levels = tuple(dict.fromkeys(r["level"] for r in heldout))
        count: dict[str, int] = {}
        for r in heldout:  # an id per level, as the built-in arithmetic's (read by people, not by the report)
            r["unique_id"] = f"heldout/{r['level']}/{count.setdefault(r['level'], 0)}"
            count[r["level"]] += 1
        for k, r in enumerate(train):
            r["unique_id"] = f"train/{r['level']}/{k}"
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(train, str(out / "train.jsonl"))
        write_jsonl(heldout, str(out / "heldout.jsonl"))
        return str(out / "train.jsonl"), str(out / "heldout.jsonl"), levels

    def check_reward(self, rows: list[dict], n: int = 8) -> str:
        """The reward on the first ``n`` problems, each scored on its own answer and on an empty completion:
        it imports, it returns numbers inside its range; what it gave, in words."""
        name, (lo, hi) = normalize_reward(self.reward), self.reward_range
        if name in BUILTIN_REWARDS:
            score = reward_function(name)

            def one(t: str, g: str) -> float:
                return score([t], [g])[0]
        else:
            one = _user_function(name)  # its raw value: reward_function's float() would hide a wrong type
        rows = rows[:n]
        golds = [r["answer"] for r in rows]
        tried = {"right": [f"The answer is {g}." for g in golds], "empty": [""] * len(rows)}
        got = {}
        for what, texts in tried.items():
            for t, g in zip(texts, golds):
                try:
                    v = one(t, g)
                except Exception as e:  # noqa: BLE001  the user's function: its own error, named
                    raise TaskError(f"--reward {self.reward}: raised {type(e).__name__}: {e}") from None
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and lo <= v <= hi):
                    raise TaskError(
                        f"--reward {self.reward}: returned {v!r} for the completion {t[:60]!r} (answer {g!r}), "
                        f"outside its range [{lo:g}, {hi:g}] (--reward-range)"
                    )
                got.setdefault(what, []).append(float(v))
        right, empty = got["right"], got["empty"]
        return (
            f"reward {self.reward} on {len(rows)} problems: {sum(right) / len(right):.2f} on 'The answer is "
            f"<answer>.', {sum(empty) / len(empty):.2f} on an empty completion (range {self.reward_range[0]:g}.."
            f"{self.reward_range[1]:g})"
        )
