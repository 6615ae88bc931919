"""Stop every process one launcher job started on this node, and nothing else.

    python -m avspo_openrlhf.cluster.reap --tag JOBID.RESTART [--grace 10]

avspo.sbatch starts Ray (``ray_node.sh``) and the trainer with ``AVSPO_JOB_TAG=<tag>`` in their
environment; every process they start inherits it: Ray's GCS, raylet, agents and workers, vLLM and
DeepSpeed actors, the reward verifiers' worker processes. ``ray stop --force`` cannot be used instead: it
stops every Ray of the user on the node (another job's, on a shared node), and misses children that
are not named like Ray's (a forkserver whose parent died escapes Slurm's ``proctrack/linuxproc``).
Only processes of the calling user are touched. SIGTERM first, SIGKILL after ``--grace`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys


def tagged(tag: str) -> list:
    """This user's processes whose environment holds ``AVSPO_JOB_TAG=<tag>`` (never this one or its
    ancestors: the reaper itself runs inside the job)."""
    import psutil

    me = psutil.Process()
    spare = {me.pid, *(p.pid for p in me.parents())}
    uid = os.getuid()
    out = []
    for p in psutil.process_iter(["pid", "uids"]):
        if p.pid in spare or p.info["uids"] is None or p.info["uids"].real != uid:
            continue
        try:
            if p.environ().get("AVSPO_JOB_TAG") == tag:
                out.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def terminate_then_kill(procs: list, grace: float) -> None:
    """SIGTERM to ``procs`` (psutil processes), SIGKILL to those still there after ``grace`` s."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def reap(tag: str, grace: float = 10.0) -> int:
    """Terminate the tagged processes, kill what is left after ``grace`` s; the number found."""
    procs = tagged(tag)
    terminate_then_kill(procs, grace)
    return len(procs)


def sweep_temp(folder: str = "/tmp") -> list[str]:
    """Remove this user's ``ray_avspo_<job>`` temp dirs in ``folder`` that no process of that job
    uses any more on this node (a teardown cut short by Slurm's SIGKILL leaves one behind)."""
    import glob
    import shutil

    import psutil

    live = set()
    for p in psutil.process_iter():
        try:
            tag = p.environ().get("AVSPO_JOB_TAG")
        except (psutil.Error, OSError):
            continue
        if tag:
            live.add(tag.split(".")[0])
    removed = []
    for d in glob.glob(os.path.join(folder, "ray_avspo_*")):
        job = d.rsplit("_", 1)[1]
        if os.path.isdir(d) and os.stat(d).st_uid == os.getuid() and job not in live:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="reap", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", help="the job's AVSPO_JOB_TAG (avspo.sbatch: JOBID.RESTART)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--sweep-temp", metavar="DIR", help="instead: remove unused ray_avspo_<job> dirs in DIR")
    a = p.parse_args(argv)
    if a.sweep_temp:
        print(f"[reap] removed {len(sweep_temp(a.sweep_temp))} unused Ray temp dir(s)", flush=True)
        return 0
    if not (a.tag or "").strip():
        p.error("--tag must not be empty (it would match nothing, or everything)")
    n = reap(a.tag, a.grace)
    print(f"[reap] {os.uname().nodename}: stopped {n} process(es) of job {a.tag}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
