"""``avspo-reward-audit``: how often the verifier is wrong, before its errors inflate collapse.

A noisy verifier puts false signals into the groups: a false negative on a correct answer turns a
mixed group all-wrong, a false positive does the opposite. Two modes:

* ``--input DATA.jsonl`` (rows with ``solution`` and ``answer``, e.g. MATH-500 or a prepared file):
  each reference solution is scored against its own answer (every miss is a false negative) and
  against another problem's different answer (every hit is a false positive).
* ``--completions FILE.jsonl`` (rows with ``completion``, ``answer`` and a human ``label``
  true/false): false-negative / false-positive rates against the human labels.

Prints the rates and the status breakdown; writes every failing example to ``--out-dir``.

``--second-opinion`` compares the project's verdict with math-verify's own extraction on the full
completion, on ``--completions`` (no label needed), ``--records`` (``avspo-eval`` output: a
``records.jsonl`` or a folder holding them) or ``--input`` (reference solutions). It reports the
disagreements by category (several boxes, no answer marker, matrix, relation, units, interval,
multi-value, other) with counts and examples, and what the multi-box rule changed against the
last-box-only rule, so you can see where the two verifiers part on your data before trusting the ACR.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

from avspo_openrlhf.data.io import read_jsonl, write_jsonl
from avspo_openrlhf.rewards.extract import all_boxes, extract_answer, final_boxes, last_boxed
from avspo_openrlhf.rewards.pool import VerifierPool
from avspo_openrlhf.rewards.verify import STATUSES


def _score(pool, completions, golds, desc, verifier="project"):
    from tqdm import tqdm

    futures = [pool.submit(c, g, verifier) for c, g in zip(completions, golds)]
    return [f.result() for f in tqdm(futures, desc=desc, unit="sample", file=sys.stderr)]


def _breakdown(results) -> dict[str, int]:
    counts = collections.Counter(r.status for r in results)
    return {s: counts.get(s, 0) for s in STATUSES}


def audit_references(rows: list[dict], pool: VerifierPool) -> tuple[dict, list[dict], list[dict]]:
    """Score each row's ``solution`` against its own and against another row's different answer."""
    rows = [r for r in rows if r.get("solution")]
    if not rows:
        raise ValueError("no row has a 'solution' to audit")
    own = _score(pool, [r["solution"] for r in rows], [str(r["answer"]) for r in rows], "own answers")
    # pair each row with the next row whose answer string differs
    others = []
    for i, r in enumerate(rows):
        j = next(
            (
                j % len(rows)
                for j in range(i + 1, i + len(rows))
                if str(rows[j % len(rows)]["answer"]) != str(r["answer"])
            ),
            None,
        )
        others.append(None if j is None else str(rows[j]["answer"]))
    pairs = [(r, o) for r, o in zip(rows, others) if o is not None]
    mism = _score(pool, [r["solution"] for r, _ in pairs], [o for _, o in pairs], "mismatched answers")
    fn = [
        dict(r, status=res.status, extracted=res.pred, detail=res.detail)
        for r, res in zip(rows, own)
        if res.status != "correct"
    ]
    fp = [
        dict(r, other_answer=o, status=res.status, extracted=res.pred)
        for (r, o), res in zip(pairs, mism)
        if res.status == "correct"
    ]
    report = {
        "n": len(rows),
        "false_negative_rate": len(fn) / len(rows),
        "false_positive_rate": len(fp) / max(1, len(pairs)),
        "status_own": _breakdown(own),
        "status_mismatched": _breakdown(mism),
    }
    return report, fn, fp


def audit_labelled(rows: list[dict], pool: VerifierPool) -> tuple[dict, list[dict], list[dict]]:
    """Score model completions against human correctness labels."""
    for i, r in enumerate(rows):
        if not isinstance(r.get("label"), bool) or "completion" not in r or "answer" not in r:
            raise ValueError(f"row {i + 1}: needs 'completion', 'answer' and a boolean 'label'")
    res = _score(pool, [r["completion"] for r in rows], [str(r["answer"]) for r in rows], "labelled completions")
    pos = [(r, x) for r, x in zip(rows, res) if r["label"]]
    neg = [(r, x) for r, x in zip(rows, res) if not r["label"]]
    fn = [dict(r, status=x.status, extracted=x.pred) for r, x in pos if x.status != "correct"]
    fp = [dict(r, status=x.status, extracted=x.pred) for r, x in neg if x.status == "correct"]
    report = {
        "n": len(rows),
        "false_negative_rate": len(fn) / max(1, len(pos)),
        "false_positive_rate": len(fp) / max(1, len(neg)),
        "status": _breakdown(res),
    }
    return report, fn, fp


CATEGORIES = ("several_boxes", "no_answer_marker", "matrix", "relation", "units", "interval", "multi_value", "other")
_RELATION_RE = re.compile(r"(?<![<>!])=|<|>|\\le\b|\\ge\b|\\leq|\\geq|\\neq?\b|\\in\b")
_UNITS_RE = re.compile(r"\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z]|\^\s*\{?\\circ|%|\\\$|\bdegrees?\b")
_INTERVAL_RE = re.compile(r"\\infty|^\s*(?:\\left)?[\[(][^,]+,[^,]+(?:\\right)?[\])]\s*$")


def disagreement_category(completion: str, gold: str) -> str:
    """The first of :data:`CATEGORIES` that describes a completion/gold pair (for grouping the
    disagreements of two verifiers)."""
    if len({b for _, _, b in all_boxes(completion)}) >= 2:
        return "several_boxes"
    pred, method = extract_answer(completion)
    if not method.startswith("boxed"):
        return "no_answer_marker"
    both = f"{gold} {pred}"
    if "matrix" in both:
        return "matrix"
    if _RELATION_RE.search(both):
        return "relation"
    if _UNITS_RE.search(both):
        return "units"
    if _INTERVAL_RE.search(gold) or _INTERVAL_RE.search(pred or ""):
        return "interval"
    if "," in gold:
        return "multi_value"
    return "other"


def audit_second_opinion(
    completions: list[str], golds: list[str], pool: VerifierPool, examples: int = 5
) -> tuple[dict, list[dict]]:
    """The project's verdict vs math-verify's full-text verdict on the same pairs; and the
    project's verdict vs its last-box-only rule (what multi-answer extraction changed)."""
    ours = _score(pool, completions, golds, "project verdicts")
    theirs = _score(pool, completions, golds, "math-verify full text", "math_verify")
    last = _score(pool, completions, golds, "last box only", "last_box")
    by_cat = {c: {"project_only_correct": 0, "math_verify_only_correct": 0, "examples": []} for c in CATEGORIES}
    disagreements = []
    for c, g, a, b in zip(completions, golds, ours, theirs):
        if (a.status == "correct") == (b.status == "correct"):
            continue
        cat = disagreement_category(c, g)
        side = "project_only_correct" if a.status == "correct" else "math_verify_only_correct"
        row = {
            "category": cat,
            "who_says_correct": side.split("_only")[0],
            "answer": g,
            "project_status": a.status,
            "project_extracted": a.pred,
            "math_verify_status": b.status,
            "math_verify_extracted": b.pred,
            "completion_tail": c[-400:],
        }
        by_cat[cat][side] += 1
        if len(by_cat[cat]["examples"]) < examples:
            by_cat[cat]["examples"].append(row)
        disagreements.append(row)
    several = sum(len(final_boxes(c)) > 1 for c in completions)
    flips_up = sum(a.status == "correct" and x.status != "correct" for a, x in zip(ours, last))
    flips_down = sum(a.status != "correct" and x.status == "correct" for a, x in zip(ours, last))
    report = {
        "n": len(completions),
        "agree": len(completions) - len(disagreements),
        "disagree": len(disagreements),
        "project_only_correct": sum(d["who_says_correct"] == "project" for d in disagreements),
        "math_verify_only_correct": sum(d["who_says_correct"] == "math_verify" for d in disagreements),
        "by_category": {c: v for c, v in by_cat.items() if v["project_only_correct"] or v["math_verify_only_correct"]},
        "multi_box": {
            "completions_with_several_final_boxes": several,
            "completions_with_several_boxes_anywhere": sum(len({b for *_, b in all_boxes(c)}) > 1 for c in completions),
            "flips_wrong_to_correct_vs_last_box": flips_up,
            "flips_correct_to_wrong_vs_last_box": flips_down,
        },
        "status_project": _breakdown(ours),
        "status_math_verify": _breakdown(theirs),
    }
    return report, disagreements


def read_records(path: str) -> tuple[list[str], list[str]]:
    """Completions and gold answers from ``avspo-eval`` records (a ``records.jsonl`` or a folder
    searched for them); boolean/choice benchmarks without a string answer are skipped."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(p.rglob("records.jsonl"))
    if not files:
        raise ValueError(f"{path}: no records.jsonl found")
    comps, golds = [], []
    for f in files:
        for i, r in enumerate(read_jsonl(str(f))):
            if "completions" not in r or "answer" not in r:
                raise ValueError(f"{f}:{i + 1}: an avspo-eval record needs 'completions' and 'answer'")
            comps += [str(c) for c in r["completions"]]
            golds += [str(r["answer"])] * len(r["completions"])
    return comps, golds


def _print_second_opinion(report: dict) -> None:
    n = max(1, report["n"])
    print(
        f"{report['n']} completions: the project and math-verify (full text) agree on {report['agree']} "
        f"({100 * report['agree'] / n:.1f} %); project-only correct {report['project_only_correct']}, "
        f"math-verify-only correct {report['math_verify_only_correct']}"
    )
    for cat, v in report["by_category"].items():
        print(
            f"  {cat:18s} project-only {v['project_only_correct']:5d}   math-verify-only {v['math_verify_only_correct']:5d}"
        )
    mb = report["multi_box"]
    print(
        f"several final boxes: {mb['completions_with_several_final_boxes']}; verdicts changed by the multi-box rule: "
        f"{mb['flips_wrong_to_correct_vs_last_box']} wrong -> correct, {mb['flips_correct_to_wrong_vs_last_box']} "
        "correct -> wrong"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="avspo-reward-audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="rows with 'solution' and 'answer' (reference audit)")
    src.add_argument("--completions", help="rows with 'completion', 'answer', boolean 'label' (human-label audit)")
    src.add_argument(
        "--records", help="avspo-eval records: a records.jsonl or a folder of them (with --second-opinion)"
    )
    ap.add_argument(
        "--second-opinion",
        action="store_true",
        help="compare the project's verdicts with math-verify's full-text extraction; report disagreements by "
        "category (writes report.json and disagreements.jsonl)",
    )
    ap.add_argument("--examples", type=int, default=5, help="examples kept per disagreement category")
    ap.add_argument(
        "--out-dir",
        default="reward_audit",
        help="where report.json, false_negatives.jsonl and false_positives.jsonl go",
    )
    ap.add_argument("--workers", type=int, default=None, help="verifier processes (default: CPU count)")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-sample verification timeout, seconds")
    ap.add_argument("--limit", type=int, default=None, help="audit only the first N rows")
    args = ap.parse_args(argv)
    if args.records and not args.second_opinion:
        ap.error("--records needs --second-opinion")
    if args.second_opinion:
        if args.records:
            comps, golds = read_records(args.records)
        else:
            rows = read_jsonl(args.input or args.completions)
            key = "solution" if args.input else "completion"
            for i, r in enumerate(rows):
                if args.input and "answer" not in r and isinstance(r.get(key), str):
                    r["answer"] = last_boxed(r[key])  # raw MATH rows: the gold is the solution's last box
                if key not in r or r.get("answer") is None:
                    ap.error(f"{args.input or args.completions}:{i + 1}: needs '{key}' and 'answer'")
            comps, golds = [str(r[key]) for r in rows], [str(r["answer"]) for r in rows]
        comps, golds = comps[: args.limit], golds[: args.limit]
        with VerifierPool(args.workers, args.timeout) as pool:
            report, rows = audit_second_opinion(comps, golds, pool, args.examples)
        os.makedirs(args.out_dir, exist_ok=True)
        write_jsonl(rows, os.path.join(args.out_dir, "disagreements.jsonl"))
        with open(os.path.join(args.out_dir, "report.json"), "w") as f:
            json.dump(report, f, indent=2)
        _print_second_opinion(report)
        print(f"report: {args.out_dir}/report.json   every disagreement: {args.out_dir}/disagreements.jsonl")
        return 0
    rows = read_jsonl(args.input or args.completions)[: args.limit]
    with VerifierPool(args.workers, args.timeout) as pool:
        report, fn, fp = (audit_references if args.input else audit_labelled)(rows, pool)
    os.makedirs(args.out_dir, exist_ok=True)
    write_jsonl(fn, os.path.join(args.out_dir, "false_negatives.jsonl"))
    write_jsonl(fp, os.path.join(args.out_dir, "false_positives.jsonl"))
    with open(os.path.join(args.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    print(f"failing examples: {args.out_dir}/false_negatives.jsonl ({len(fn)}), false_positives.jsonl ({len(fp)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
