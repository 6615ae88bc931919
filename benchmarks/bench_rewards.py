"""Verifier throughput and latency on the 5,000 MATH test reference solutions.

For 1 worker, samples go one at a time, so each latency is one verification plus the pool's IPC;
for N workers, all samples are submitted at once and the throughput is the wall-clock rate.
Reports verifications/s/core, p50/p99 latency, the fractions of final timeouts and of samples
retried after overrunning the timeout once (both 0 on a healthy machine: the timeout counts the
worker's CPU time from when it begins the sample), and hangs (a future not resolved within the
per-sample timeout bound). Target: >= 200/s/core, p99 < 50 ms, 0 hangs.

    python benchmarks/bench_rewards.py [--data ../shared/data/math_test.jsonl] [--workers 2] \
        [--out benchmarks/results/bench_rewards]

``--out PREFIX`` also writes PREFIX.md (the table docs/architecture.md shows, naming the CPU) and
PREFIX.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from avspo_openrlhf.cpu.dtype import cpu_kind
from avspo_openrlhf.data.io import load_local
from avspo_openrlhf.rewards import VerifierPool

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "math_test.jsonl"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="MATH-format jsonl (solution, answer from its \\boxed{})")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="N for the parallel run")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-sample timeout, seconds")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    ap.add_argument("--out", help="also write OUT.md and OUT.json (the published table)")
    args = ap.parse_args()
    rows = load_local(args.data, "math_test", skip_bad_rows=True).rows[: args.limit]
    sols, golds = [r["solution"] for r in rows], [r["answer"] for r in rows]
    print(f"{len(rows)} reference solutions from {args.data}; timeout {args.timeout:g} s")
    print(
        f"{'workers':>7} {'verif/s':>8} {'/s/core':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'correct':>8} {'timeouts':>8} "
        f"{'retried':>8} {'hangs':>5}"
    )
    out = []
    for workers, sequential in ((1, True), (args.workers, False)):
        with VerifierPool(workers, args.timeout) as pool:
            pool.score(sols[:20], golds[:20])  # warm the workers
            lat, results, hangs = [], [], 0
            t0 = time.perf_counter()
            if sequential:
                for s, g in zip(sols, golds):
                    t = time.perf_counter()
                    results.append(pool.submit(s, g).result(timeout=8 * args.timeout + 5))
                    lat.append(time.perf_counter() - t)
            else:
                futs = [(time.perf_counter(), pool.submit(s, g)) for s, g in zip(sols, golds)]
                for _, f in futs:
                    try:
                        # two attempts per sample, each at most 4x the timeout in wall-clock time
                        results.append(f.result(timeout=8 * args.timeout * len(futs) / workers + 5))
                    except TimeoutError:
                        hangs += 1
                # per-sample service time is measured in the sequential run; here: throughput
            wall = time.perf_counter() - t0
        n = len(results)
        rate = n / wall
        timeouts = sum(r.status == "timeout" for r in results) / max(1, n)
        retried = sum(r.retries > 0 for r in results) / max(1, n)
        correct = sum(r.status == "correct" for r in results) / max(1, n)
        p50 = f"{statistics.median(lat) * 1e3:7.1f}" if lat else "      -"
        p99 = f"{pct(lat, 0.99) * 1e3:7.1f}" if lat else "      -"
        mx = f"{max(lat) * 1e3:7.1f}" if lat else "      -"
        print(
            f"{workers:>7} {rate:8.0f} {rate / workers:8.0f} {p50} {p99} {mx} {correct:8.2%} {timeouts:8.2%} "
            f"{retried:8.2%} {hangs:>5}"
        )
        out.append(
            {
                "workers": workers,
                "sequential": sequential,
                "per_s": rate,
                "correct": correct,
                "timeouts": timeouts,
                "retried": retried,
                "hangs": hangs,
                "latency_ms": None
                if not lat
                else {"p50": statistics.median(lat) * 1e3, "p99": pct(lat, 0.99) * 1e3, "max": max(lat) * 1e3},
            }
        )
    if args.out:
        record = {
            "cpu": cpu_kind(),
            "solutions": len(rows),
            "data": Path(args.data).name,
            "timeout_s": args.timeout,
            "rows": out,
        }
        Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        Path(args.out + ".md").write_text(page(record), encoding="utf-8")


def page(r: dict) -> str:
    """The published table: throughput, latency and outcomes, one worker at a time and all at once."""
    lines = [
        f"Measured by `benchmarks/bench_rewards.py` on {r['cpu']}: the {r['solutions']:,} reference solutions of "
        f"`{r['data']}`, timeout {r['timeout_s']:g} s:",
        "",
        "| workers | verifications/s | per worker | p50 | p99 | max | correct | timeouts | hangs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in r["rows"]:
        lat = row["latency_ms"]
        p = [f"{lat[k]:.1f} ms" for k in ("p50", "p99", "max")] if lat else ["–"] * 3
        how = "one at a time" if row["sequential"] else "all submitted"
        lines.append(
            f"| {row['workers']} ({how}) | {row['per_s']:.0f} | {row['per_s'] / row['workers']:.0f} | {' | '.join(p)} | "
            f"{row['correct']:.2%} | {row['timeouts']:.2%} | {row['hangs']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
