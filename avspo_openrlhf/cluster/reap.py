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


def _running(p) -> bool:
    """Still to be stopped: neither gone nor a zombie. A zombie has exited and waits for its parent to
    reap it; the parent is often the launcher script, which reaps nothing while it runs this reaper in
    the foreground, so waiting for zombies to vanish cost every teardown the whole grace time."""
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_running(procs: list, timeout: float) -> list:
    """Poll until no process of ``procs`` runs (:func:`_running`) or ``timeout`` s pass; those still running."""
    import time

    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def _terminate(procs: list) -> None:
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass


def terminate_then_kill(procs: list, grace: float) -> list[str]:
    """SIGTERM to ``procs`` (psutil processes), SIGKILL to those still running after ``grace`` s;
    returns those killed ("pid name").

    Children first: a process that is no other's parent among ``procs`` gets SIGTERM at once, a
    parent once those children stopped (or half the grace passed). A supervisor stops its children
    itself on SIGTERM, one at a time: ``ray start --block`` gives each of its processes a second
    and outlived a 10 s grace in every Slurm teardown; with its children gone it exits at once."""
    import psutil

    def parent(p) -> int | None:
        try:
            return p.ppid()
        except psutil.Error:
            return None

    parents = {parent(p) for p in procs}
    children = [p for p in procs if p.pid not in parents]
    supervisors = [p for p in procs if p.pid in parents]
    _terminate(children)
    _wait_running(children, grace / 2)
    _terminate(supervisors)
    alive = _wait_running(procs, grace / 2)
    killed = []
    for p in alive:
        try:
            killed.append(f"{p.pid} {p.name()}")
            p.kill()
        except psutil.Error:
            pass
    _wait_running(alive, 5)
    return killed


def reap(tag: str, grace: float = 10.0) -> tuple[int, list[str]]:
    """Terminate the tagged processes, kill what is left after ``grace`` s; the number found and
    those killed."""
    procs = tagged(tag)
    return len(procs), terminate_then_kill(procs, grace)


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
    n, killed = reap(a.tag, a.grace)
    # the ones that ignored SIGTERM: each one costs every teardown the whole grace time
    late = f" ({len(killed)} killed after {a.grace:g} s: {', '.join(killed)})" if killed else ""
    print(f"[reap] {os.uname().nodename}: stopped {n} process(es) of job {a.tag}{late}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
