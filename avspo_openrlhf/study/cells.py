"""One (method, seed) cell of a study: ``avspo-train`` on the quickstart's flags, then the held-out
evaluation of its final model, both through the quickstart's public functions."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from avspo_openrlhf import atomic
from avspo_openrlhf.cli import quickstart as qs
from avspo_openrlhf.report import read_metrics


@dataclass
class Cell:
    """What one trained and evaluated run left: the held-out summary of its final model, its
    per-step training metrics and in-training evaluations, and its wall time."""

    after: dict
    rows: list[dict]
    evals: list[dict]
    t0: float  # when this invocation started the cell
    train_s: float  # training wall time of this invocation (0 when the final model was there)
    resumed: bool  # training continued from a checkpoint of a killed run: its wall time is not comparable


def train_and_evaluate(qargs, model: str, train: str, heldout: str, run_dir: Path) -> Cell:
    """Train ``model`` on ``train`` with the quickstart's flags for ``qargs`` into ``run_dir`` (unless
    its final model is there; a checkpoint there is resumed), then evaluate the final model on
    ``heldout`` (once: an evaluation already there is read)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "log.txt"
    resumed = (run_dir / "ckpt").exists()
    t0 = time.time()
    if not (run_dir / "final" / "config.json").exists():
        train_cmd = [
            sys.executable,
            "-m",
            "avspo_openrlhf.cli.train",
            *qs.train_flags(qargs, model, train, run_dir, heldout),
        ]
        qs.run_command(train_cmd, log)
    train_s = time.time() - t0
    after = qs.evaluate_heldout(str(run_dir / "final"), heldout, run_dir / "eval_after", qargs, log)
    rows, evals = read_metrics(str(run_dir / "report" / "metrics.jsonl"))
    return Cell(after, rows, evals, t0, train_s, resumed)


def per_problem(eval_dir: Path) -> dict[str, float]:
    """Each held-out problem's accuracy (the mean over its samples) in an evaluation folder."""
    return {r["unique_id"]: sum(r["correct"]) / len(r["correct"]) for r in qs.eval_records(eval_dir)}


def write_json(path: Path, obj) -> None:
    """Write atomically: a report running beside a study never reads half a file."""
    atomic.write_json(path, obj, indent=1)


def check_flags(cells: dict[str, object], model: str, train: str, heldout: str, run_dir: Path) -> list[str]:
    """Each cell's ``avspo-train`` flags (``{name: quickstart options}``) parsed and validated as a run
    would, nothing started (avspo-train prints what it refuses); returns the names refused."""
    from avspo_openrlhf.cli.train import parse

    refused = []
    for name, qargs in cells.items():
        try:
            parse(qs.train_flags(qargs, model, train, run_dir, heldout))
        except SystemExit:
            refused.append(name)
    return refused


def study_parser(
    description: str, out: str, methods: list[str], seeds: list[int] | None, publish: str
) -> argparse.ArgumentParser:
    """The options every study has; ``publish`` says what its ``--publish`` folder receives; ``seeds``
    None: each method's planned seeds unless ``--seeds`` names them."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)
    p.add_argument("--out", default=out, help="run folder (rerun to resume)")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=seeds,
        help="seeds to run for every chosen method (default: "
        + (" ".join(map(str, seeds)) if seeds is not None else "each method's planned seeds")
        + ")",
    )
    p.add_argument("--methods", nargs="+", default=methods, choices=methods)
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
    p.add_argument("--report-only", action="store_true", help="the tables and plots from the finished runs only")
    p.add_argument("--publish", help=publish)
    p.add_argument(
        "--check-flags",
        action="store_true",
        help="validate every method's avspo-train flags as a run "
        "would, train nothing, and exit (non-zero: a method's flags are refused)",
    )
    return p
