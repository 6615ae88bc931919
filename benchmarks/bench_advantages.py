"""Time AVSPO against GRPO on the same rewards (docs/algorithm.md#advantages).

Stratified strategy, gate open, 40% collapsed groups (half all-right, half all-wrong), G = 8.
Both estimators go through `group_advantages`, so both include the NaN check and the ACR stats
every training step logs anyway; "bare" is the textbook GRPO (torch.std_mean, normalize) for
reference.
Prints the median time of interleaved repeats and the ratios, all measured in this one run; with
``--out PREFIX`` also writes PREFIX.md (the table docs/architecture.md shows, naming the CPU, torch,
threads and dtype) and PREFIX.json.

    python benchmarks/bench_advantages.py [--sizes 4096 65536] [--repeats 200] [--threads 1] \
        [--out benchmarks/results/bench_advantages]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from avspo_openrlhf.algo import group_advantages
from avspo_openrlhf.cpu.dtype import cpu_kind


def make_rewards(n: int, g: int, collapsed: float, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(n, g, generator=gen) < 0.5).float()
    r[:, 0], r[:, 1] = 0.0, 1.0  # start every group mixed
    m = int(n * collapsed)
    r[: m // 2] = 1.0
    r[m // 2 : m] = 0.0
    return r[torch.randperm(n, generator=gen)]


def bare_grpo(r: torch.Tensor) -> torch.Tensor:
    std, mean = torch.std_mean(r, dim=1, correction=0)
    return (r - mean[:, None]) / (std[:, None] + 1e-6)


def _timed(fn, r, repeats):
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(r)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536], help="numbers of groups N")
    ap.add_argument("--group-size", type=int, default=8, help="completions per group G")
    ap.add_argument("--collapsed", type=float, default=0.4, help="fraction of collapsed groups")
    ap.add_argument("--repeats", type=int, default=300, help="timed calls per estimator")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--out", help="also write OUT.md and OUT.json (the published table)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cases = {
        "grpo": lambda r: group_advantages(r, "grpo"),
        "avspo": lambda r: group_advantages(r, "avspo", acr_gate=args.collapsed, tau_adapt=0.1),
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), G={args.group_size}, {args.collapsed:.0%} collapsed, stratified, gate open"
    )
    print(f"{'N':>7} {'bare us':>9} {'grpo us':>9} {'avspo us':>9} {'avspo/grpo':>11} {'avspo/bare':>11}")
    rows = []
    for n in args.sizes:
        r = make_rewards(n, args.group_size, args.collapsed)
        _, info = cases["avspo"](r)
        assert info["gate_open"] and abs(info["acr"] - args.collapsed) < 0.01
        times = {k: [] for k in cases}
        for _ in range(20):
            for fn in cases.values():
                fn(r)
        order = list(cases)
        rng = random.Random(0)
        for _ in range(args.repeats):
            # interleaved in a fresh random order each round, so drift and cache effects of the
            # previous call hit every estimator alike
            rng.shuffle(order)
            for k in order:
                t0 = time.perf_counter()
                cases[k](r)
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        # timed on its own: torch.std_mean's slow small-row path thrashes the cache for whatever
        # runs next, which would bias the interleaved comparison above
        med["bare"] = statistics.median(_timed(bare_grpo, r, args.repeats)) * 1e6
        print(
            f"{n:>7} {med['bare']:>9.1f} {med['grpo']:>9.1f} {med['avspo']:>9.1f} {med['avspo'] / med['grpo']:>10.3f}x {med['avspo'] / med['bare']:>10.3f}x"
        )
        rows.append({"n": n, "median_us": med})
    if args.out:
        record = {
            "cpu": cpu_kind(),
            "torch": torch.__version__,
            "threads": args.threads,
            "dtype": "fp32",
            "group_size": args.group_size,
            "collapsed": args.collapsed,
            "repeats": args.repeats,
            "rows": rows,
        }
        Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        Path(args.out + ".md").write_text(page(record), encoding="utf-8")


def _us(x: float) -> str:
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} µs"


def page(r: dict) -> str:
    """The published table: median time per call of each estimator, and AVSPO's ratio to ours."""
    lines = [
        f"Measured by `benchmarks/bench_advantages.py` on {r['cpu']}, torch {r['torch']}, {r['threads']} thread(s), "
        f"{r['dtype']} rewards, G = {r['group_size']}, {r['collapsed']:.0%} collapsed, median of {r['repeats']} calls:",
        "",
        "| N × G | bare GRPO | our GRPO | AVSPO | AVSPO / our GRPO |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in r["rows"]:
        m = row["median_us"]
        lines.append(
            f"| {row['n']} × {r['group_size']} | {_us(m['bare'])} | {_us(m['grpo'])} | {_us(m['avspo'])} | {m['avspo'] / m['grpo']:.2f}× |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
