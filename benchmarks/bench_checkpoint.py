"""What a study run's checkpoint costs the training loop: written in the foreground (``torch.save``,
what ``study/loop.py`` did: the K runs of a stacked batch stalled 30-40 s every 10 steps on an H200)
against taken as a snapshot and written in the background (``loop.snapshot`` + the loop's writer
thread: the loop waits only for the copy to host memory). Each run's checkpoint holds what the
loop's does: its weights and two AdamW moments (fp32), for K runs of one model shape with random
weights. Interleaved repeats; prints the medians and the ratio, all from this one run, with the device.

    python benchmarks/bench_checkpoint.py                                  # tiny shape, K = 2, CPU
    python benchmarks/bench_checkpoint.py --shape smollm2 --k 2            # SmolLM2-135M's shape (~1.6 GB a run)
    python benchmarks/bench_checkpoint.py --shape smollm2 --k 12 --device cuda --json results/bench_checkpoint_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stacked import build  # noqa: E402

from avspo_openrlhf.cli.quickstart import cpu_kind  # noqa: E402
from avspo_openrlhf.study import loop  # noqa: E402


def states(shape: str, k: int, device: str) -> list[dict]:
    """K checkpoints shaped like the loop's: weights and AdamW's two moments, on ``device``."""
    _, models = build(shape, k, device)
    out = []
    for m in models:
        w = {n: p.detach().float() for n, p in m.state_dict().items()}
        moments = {n: (torch.randn_like(p), torch.rand_like(p)) for n, p in w.items()}
        out.append({"model": w, "optimizer": moments, "state": {"step": 10, "curve": [{"step": i} for i in range(10)]}})
    return out


def foreground(cks: list[dict], folder: Path) -> float:
    t = time.perf_counter()
    for i, ck in enumerate(cks):
        torch.save(ck, folder / f"run{i}.pt.tmp")
        (folder / f"run{i}.pt.tmp").replace(folder / f"run{i}.pt")
    return time.perf_counter() - t


def background(cks: list[dict], folder: Path) -> tuple[float, float]:
    """(seconds the loop waits: the snapshots, seconds until every write is on disk)."""
    t = time.perf_counter()
    pending = [loop.save_in_background(loop.snapshot(ck), folder / f"run{i}.pt") for i, ck in enumerate(cks)]
    stall = time.perf_counter() - t
    for f in pending:
        f.result()
    return stall, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny", choices=["tiny", "smollm2"])
    p.add_argument("--k", type=int, default=2, help="runs checkpointing at one step (a stacked batch)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary folder; the disk is part of the number)")
    p.add_argument("--json", help="also write the numbers here")
    a = p.parse_args(argv)
    cks = states(a.shape, a.k, a.device)
    gb = sum(t.numel() * 4 for t in {t.data_ptr(): t for t in cks[0]["model"].values()}.values()) * 3 / 1e9
    fg, stall, done = [], [], []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for _ in range(a.repeats):
            fg.append(foreground(cks, Path(d)))
            s, w = background(cks, Path(d))
            stall.append(s)
            done.append(w)
    res = {
        "shape": a.shape,
        "k": a.k,
        "gb_per_run": round(gb, 3),
        "precision": "fp32 weights and AdamW moments",
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else cpu_kind(),
        "foreground_s": statistics.median(fg),
        "background_stall_s": statistics.median(stall),
        "background_written_s": statistics.median(done),
        "stall_ratio": statistics.median(stall) / statistics.median(fg),
    }
    print(
        f"{a.k} run(s) of {a.shape} ({gb:.2f} GB each) on {res['device']}: written in the foreground "
        f"{res['foreground_s']:.2f} s; in the background the loop waits {res['background_stall_s']:.2f} s "
        f"(x{res['stall_ratio']:.2f}), on disk after {res['background_written_s']:.2f} s (medians of {a.repeats})"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
