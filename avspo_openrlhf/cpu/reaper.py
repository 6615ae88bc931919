"""The CPU backend's Ray processes die with the driver, however the driver dies.

Ray stops what it started from the driver's exit hooks; ``kill -9`` (what the OOM killer sends)
runs none, and ``ray::DashboardAgent`` / ``ray::RuntimeEnvAgent`` (the agent that ran jobs POSTed
to it) outlived the driver. :func:`start_reaper` forks a small watcher, in its own session so a
terminal's Ctrl-C does not reach it: every ``poll_s`` it records the driver's descendants (PID and
start time, so a reused PID is never touched); once the driver is gone it sends them SIGTERM,
then SIGKILL to any still there after ``grace_s``, and exits. Only processes this driver started
are touched, never another run's or another user's Ray.

    python -m avspo_openrlhf.cpu.reaper DRIVER_PID   # what start_reaper runs
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def start_reaper(poll_s: float = 1.0, grace_s: float = 5.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "avspo_openrlhf.cpu.reaper", str(os.getpid()), str(poll_s), str(grace_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def watch(driver_pid: int, poll_s: float, grace_s: float) -> int:
    import psutil

    me = os.getpid()
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return 0
    seen: dict[int, float] = {}
    while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
        try:
            for p in driver.children(recursive=True):
                if p.pid != me:
                    seen.setdefault(p.pid, p.create_time())
        except psutil.Error:
            pass
        time.sleep(poll_s)
    from avspo_openrlhf.cluster.reap import terminate_then_kill

    left = []
    for pid, started in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started:  # the same process, not a reused PID
                left.append(p)
        except psutil.Error:
            continue
    terminate_then_kill(left, grace_s)
    return 0


if __name__ == "__main__":
    pid, poll, grace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    sys.exit(watch(pid, poll, grace))
