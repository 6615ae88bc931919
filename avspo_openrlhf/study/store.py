"""The remedies studies' runs as the repository keeps them, the CPU study's (``study/remedies.py``,
``avspo-train`` cells) and the GPU study's (``study/remedies_gpu.py``, the study loop) alike: one
file per finished run, ``<published>/runs/<method>_seed<k>.json`` (its per-problem records packed),
read back together with the runs of a run folder (``<out>/<method>_seed<k>/result.json``); whether
runs pair (one settings hash, else the fields that differ; a problem read at its row's level); and the order in which a study starts its
runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from avspo_openrlhf.atomic import atomic_write
from avspo_openrlhf.study import compare, tables
from avspo_openrlhf.study.fingerprint import settings_difference


def run_file(published: Path, method: str, seed: int) -> Path:
    return published / "runs" / f"{method}_seed{seed}.json"


# a run's per-problem records and the samples each holds (None: the run's n): packed when published
PER_PROBLEM = {"per_problem": None, "per_problem_greedy": 1}


def publish_run(r: dict, published: Path, n: int) -> Path:
    """Write run ``r`` into ``published`` (atomically: a report beside a running study never reads
    half a file), its per-problem accuracies packed as counts of ``n`` samples (greedy: of one); a
    failed run's record has none."""
    return write_run(r, run_file(published, r["method"], r["seed"]), n)


def write_run(r: dict, path: Path, n: int) -> Path:
    """Run ``r`` as one file at ``path``, as :func:`publish_run` keeps it (atomically, packed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    packed = {**r, **{k: tables.pack_per_problem(r[k], m or n) for k, m in PER_PROBLEM.items() if r.get(k) is not None}}
    atomic_write(path, json.dumps(packed, indent=None))
    return path


def read_run(path: Path) -> dict:
    """One run file as :func:`write_run` keeps it, its per-problem records unpacked."""
    r = json.loads(path.read_text(encoding="utf-8"))
    return {**r, **{k: tables.unpack_per_problem(r[k]) for k in PER_PROBLEM if isinstance(r.get(k), dict)}}


def read_runs(published: Path) -> list[dict]:
    """The runs ``published`` holds, their per-problem records unpacked, in file order (a run without
    them is read as it is: :func:`collect` refuses it, naming it)."""
    return [read_run(f) for f in sorted((published / "runs").glob("*.json"))]


def collect(out: Path, published: Path | None) -> list[dict]:
    """Every finished run: the published ones, then those of ``out`` not published yet (one per
    method and seed; a study publishes a run when it finishes, so the published copy is the last
    word). Refused, naming the run and the key, when a result lacks a key of ``compare.RESULT_SCHEMA``."""
    runs: dict[tuple[str, int], dict] = {}
    if published is not None:
        runs = {(r["method"], r["seed"]): r for r in read_runs(published)}
    # a finished run's result, or the record of a run that failed for good (compare.FAIL_ATTEMPTS)
    for f in sorted([*out.glob("*_seed*/result.json"), *out.glob("*_seed*/failed.json")]):
        r = json.loads(f.read_text(encoding="utf-8"))
        runs.setdefault((r["method"], r["seed"]), r)
    results = list(runs.values())
    compare.check_results(results, f"{published or out}")
    return results


def seed_major(groups: list[list[str]], planned: dict[str, int], seeds: list[int] | None) -> list[tuple[str, int]]:
    """The runs in the order they start: group by group, seed by seed, every method of the group at
    one seed before the next seed (partial results hold whole seeds). ``seeds`` None: each method's
    ``planned`` seeds (0 .. planned - 1); a list: those seeds for every method."""
    out = []
    for group in groups:
        top = max((planned[m] for m in group), default=0)
        for s in seeds if seeds is not None else range(top):
            out += [(m, s) for m in group if seeds is not None or s < planned[m]]
    return out


class StudyError(ValueError):
    """A study's runs cannot be compared as they are (mixed settings): the message says why."""


def check_pairable(results: list[dict]) -> dict | None:
    """The settings record the runs share, or :class:`StudyError` naming the fields where two groups
    of runs differ (runs without a record come from before the corrected design and are refused)."""
    old = [f"{r['method']} seed {r['seed']}" for r in results if "settings_hash" not in r]
    if old:
        raise StudyError(
            f"{len(old)} runs carry no settings record (made before the corrected design; not "
            f"comparable): {', '.join(old[:5])}{' ...' if len(old) > 5 else ''}"
        )
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(r["settings_hash"], []).append(r)
    if len(groups) > 1:
        (h1, g1), (h2, g2) = sorted(groups.items(), key=lambda kv: -len(kv[1]))[:2]
        diff = settings_difference(g1[0]["settings"], g2[0]["settings"])
        raise StudyError(
            f"runs of different settings cannot be paired: {len(g1)} runs of {h1} (e.g. {g1[0]['method']} "
            f"seed {g1[0]['seed']}) and {len(g2)} of {h2} (e.g. {g2[0]['method']} seed {g2[0]['seed']}) "
            f"differ in {'; '.join(diff) or 'their hash only'}. Publish each into its own folder."
        )
    return results[0]["settings"] if results else None


def level_lookup(levels: Mapping[str, str]) -> Callable[[str], str]:
    """``unique_id -> level`` over the problems a report reads (``task.levels_by_id`` of its held-out
    rows): an id it does not hold, a run scored on other problems, is named, not paired under a wrong level."""

    def level(unique_id: str) -> str:
        try:
            return levels[unique_id]
        except KeyError:
            raise StudyError(
                f"a run scored problem {unique_id!r}, which is not among the {len(levels)} problems this "
                "report reads: its results come from another held-out set"
            ) from None

    return level
