"""A newcomer's first run, timed: a fresh clone of this repository's HEAD, empty caches, then the
README's first command (``bash quickstart.sh``: setup.sh, then the quickstart), with each part's
seconds. Writes ``benchmarks/results/first_run.md`` (and ``.json``), which docs/quickstart.md shows.

    .venv/bin/python benchmarks/first_run.py   # about 10 minutes on 2 cores; commit first (it clones HEAD)

Empty caches: a temporary HOME (the model cache, vLLM's, Hugging Face's, pip's, wandb's) and a new
virtualenv; the machine's pip configuration (``~/.config/pip``) is kept, as a fresh machine of the
same kind has it, and ``PYTHONDONTWRITEBYTECODE`` is unset (Python's default: it caches bytecode).
Run it on an otherwise quiet machine: the times are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP_LINE = re.compile(r"^\s+(\d+) s  (.+)$")


def setup_breakdown(log: str) -> tuple[int | None, list[tuple[str, int]]]:
    """setup.sh's total and per-step seconds, from the breakdown it prints at its end."""
    total, steps, inside = None, [], False
    for line in log.splitlines():
        if m := re.match(r"^setup\.sh took (\d+) s:", line):
            total, steps, inside = int(m.group(1)), [], True
        elif inside and (m := SETUP_LINE.match(line)):
            steps.append((m.group(2), int(m.group(1))))
        elif inside:
            inside = False
    return total, steps


def page(r: dict) -> str:
    g = [100 * x for x in r["quickstart"]["gain_ci95"]["all"]]  # (gain, lo, hi) as fractions
    lines = [
        f"`.venv/bin/python benchmarks/first_run.py` at commit `{r['commit']}`, {r['date']}: a fresh clone, empty caches, "
        "Python's default bytecode caching (`PYTHONDONTWRITEBYTECODE` unset), `bash quickstart.sh`. "
        f"CPU: {r['cpu']}. Precision: {r['precision']}.",
        "",
        "| part | seconds |",
        "| --- | --- |",
        f"| **all (setup + quickstart)** | **{r['total_s']:.0f}** ({r['total_s'] / 60:.1f} min) |",
        f"| setup.sh | {r['setup_s']} |",
        *(f"| &nbsp;&nbsp;{name} | {s} |" for name, s in r["setup_steps"]),
        f"| quickstart | {r['quickstart_s']:.0f} |",
        *(f"| &nbsp;&nbsp;{name} | {s:.0f} |" for name, s in r["quickstart"]["stages_s"].items()),
        f"| &nbsp;&nbsp;&nbsp;&nbsp;of which training's start-up (to the first step) | {r['quickstart']['first_step_s']:.0f} |",
        "",
        f"Held-out pass@1 {100 * r['quickstart']['before']['pass@1']:.1f} % → {100 * r['quickstart']['after']['pass@1']:.1f} %: "
        f"gain {g[0]:+.1f} points [{g[1]:+.1f}, {g[2]:+.1f}] (95 % bootstrap interval, paired over problems).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "first_run"), help="results stem (.md, .json)"
    )
    p.add_argument("--keep", action="store_true", help="keep the clone and the temporary HOME")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from avspo_openrlhf.cpu.dtype import cpu_kind

    work = Path(tempfile.mkdtemp(prefix="avspo-first-run-"))
    clone, home = work / "clone", work / "home"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    pip_conf = Path.home() / ".config" / "pip"
    if pip_conf.is_dir():
        shutil.copytree(pip_conf, home / ".config" / "pip")
    home.mkdir(parents=True, exist_ok=True)
    # Python's own defaults, as on a fresh machine: this machine's shell sets PYTHONDONTWRITEBYTECODE=1,
    # with which every process would compile the stack's modules from source again (~8 s a process)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VIRTUAL_ENV", "AVSPO_", "XDG_CACHE", "HF_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["HOME"] = str(home)
    t0 = time.time()
    print(f"[first_run] bash quickstart.sh in a fresh clone ({clone}), HOME={home}", flush=True)
    proc = subprocess.run(["bash", "quickstart.sh"], cwd=clone, env=env, capture_output=True, text=True)
    total = time.time() - t0
    (work / "first_run.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
        print(f"[first_run] quickstart.sh failed ({proc.returncode}); log: {work / 'first_run.log'}", file=sys.stderr)
        return 1
    setup_s, steps = setup_breakdown(proc.stdout)
    summary = json.loads((clone / "runs" / "quickstart" / "summary.json").read_text())
    r = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_kind(),
        "precision": "; ".join(f"{k} {v}" for k, v in summary["precision"].items()),
        "total_s": round(total, 1),
        "setup_s": setup_s,
        "setup_steps": steps,
        "quickstart_s": round(summary["wall_min"] * 60, 1),
        "quickstart": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(r, indent=1) + "\n")
    Path(args.out + ".md").write_text(page(r))
    print(page(r))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
