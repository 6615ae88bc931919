"""``avspo-reward-audit``: how often the verifier is wrong, before its errors inflate collapse.

A noisy verifier puts false signals into the groups: a false negative on a correct answer turns a
mixed group all-wrong, a false positive does the opposite. Two modes:

* ``--input DATA.jsonl`` (rows with ``solution`` and ``answer``, e.g. MATH-500 or a prepared file):
  each reference solution is scored against its own answer (every miss is a false negative) and
  against another problem's different answer (every hit is a false positive).
* ``--completions FILE.jsonl`` (rows with ``completion``, ``answer`` and a human ``label``
  true/false): false-negative / false-positive rates against the human labels.

Prints the rates and the status breakdown; writes every failing example to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from ..data.io import read_jsonl, write_jsonl
from .pool import VerifierPool
from .verify import STATUSES


def _score(pool, completions, golds, desc):
    from tqdm import tqdm

    futures = [pool.submit(c, g) for c, g in zip(completions, golds)]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="avspo-reward-audit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="rows with 'solution' and 'answer' (reference audit)")
    src.add_argument("--completions", help="rows with 'completion', 'answer', boolean 'label' (human-label audit)")
    ap.add_argument(
        "--out-dir",
        default="reward_audit",
        help="where report.json, false_negatives.jsonl and false_positives.jsonl go",
    )
    ap.add_argument("--workers", type=int, default=None, help="verifier processes (default: CPU count)")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-sample verification timeout, seconds")
    ap.add_argument("--limit", type=int, default=None, help="audit only the first N rows")
    args = ap.parse_args(argv)
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
