"""The launchers on a real one-node Slurm (tests/slurm/one_node_slurm.sh: Debian's slurmctld/slurmd/munge,
a node named gpu01 on a host named otherwise, 8 fake GPUs, partitions `low` (GraceTime 60 s),
`nograce` (GraceTime 0) and `high` that preempts both with PreemptMode=REQUEUE).

What fakes cannot show: a real Ray cluster started by the job, real Slurm signals (USR1 to the batch
step or to every step, a preemption's SIGTERM during its grace time, scancel), requeue, GPU counts as
Slurm gives them to each step, processes left on the node. One test trains the tiny model end to end
(USR1 -> checkpoint -> requeue -> resume, then a preemption -> checkpoint -> requeue -> resume, every
step exactly once); the others use tests/slurm/fake_trainer.sh, which records what the trainer would
see (flags, Ray's resources through a real ray.init) and plays a trainer that finishes, crashes,
stops on STOP or ignores it.

Needs root (apt-get, the daemons); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "launch_scripts" / "slurm"
SETUP = Path(__file__).parent / "slurm" / "one_node_slurm.sh"
FAKE_TRAINER = Path(__file__).parent / "slurm" / "fake_trainer.sh"
NODE, HOST = "gpu01", socket.gethostname().split(".")[0]


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root here (apt-get, slurmctld, slurmd)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("no Slurm and no apt-get to install it")
    t = time.time()
    r = subprocess.run(["bash", str(SETUP), "up"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"one-node Slurm up in {time.time() - t:.0f} s: {r.stdout.strip()}")
    subprocess.run(["scancel", "--user", "root"], capture_output=True)
    yield
    subprocess.run(["scancel", "--user", "root"], capture_output=True)


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_", "AVSPO_", "FAKE_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        AVSPO_PYTHON=sys.executable,
        AVSPO_LOG_DIR=str(tmp / "logs"),
        AVSPO_JOIN_TIMEOUT="120",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _fake_env(tmp: Path, mode: str, **extra) -> dict:
    return _env(tmp, AVSPO_TRAIN_CMD=str(FAKE_TRAINER), FAKE_TRAIN=mode, **extra)


def _submit(tmp: Path, env: dict, *opts: str, name: str = "t", train_flags: tuple = ()) -> int:
    cmd = ["bash", str(SLURM / "submit.sh"), "tiny_cpu_smoke", "--out", str(tmp / "run"), "--name", name, *opts]
    if train_flags:
        cmd += ["--", *train_flags]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(re.search(r"Submitted batch job (\d+)", r.stdout).group(1))


def _sbatch(tmp: Path, env: dict, *opts: str, cwd: Path | None = None) -> int:
    """Plain sbatch of avspo.sbatch (no submit.sh), as a user would type it."""
    r = subprocess.run(["sbatch", "--parsable", *opts, str(SLURM / "avspo.sbatch"), "tiny_cpu_smoke"],
                       capture_output=True, text=True, env=env, cwd=cwd or tmp, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return int(r.stdout.strip().split(";")[0])


def _job(job: int) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _wait(job: int, until, timeout: float, what: str) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = _job(job)
        if j and until(j):
            return j
        time.sleep(0.5)
    raise AssertionError(f"job {job}: not {what} within {timeout:.0f} s: {_job(job)}")


def _ended(job: int, timeout: float = 240) -> dict:
    return _wait(job, lambda j: j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout, "ended")


def _requeued(job: int, restarts: int, timeout: float = 240) -> dict:
    """Wait for the requeue, then start it now (a requeued job waits 120 s by default)."""
    j = _wait(job, lambda j: int(j["Restarts"]) >= restarts and j["JobState"] == "PENDING", timeout, "requeued")
    # not at once: slurmd still finishes the previous attempt, and a batch job launched meanwhile
    # fails ("Job N already killed, do not launch batch job")
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
    return j


def _running(job: int, timeout: float = 120) -> dict:
    return _wait(job, lambda j: j["JobState"] == "RUNNING", timeout, "running")


def _log(tmp: Path, job: int, name: str = "t", which: str = "launcher") -> str:
    p = tmp / "logs" / f"{name}-{job}" / f"{which}.log"
    return p.read_text(errors="replace") if p.exists() else ""


def _records(tmp: Path) -> list[dict]:
    p = tmp / "run" / "fake_train.json"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _wait_for(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"not {what} within {timeout:.0f} s")


def _left_behind(job: int) -> list[str]:
    """Processes of any attempt of this job still on the node (AVSPO_JOB_TAG=<job>.<restart>)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("AVSPO_JOB_TAG", "").split(".")[0] == str(job):
                out.append(" ".join(p.cmdline())[:120])
        except (psutil.Error, OSError):
            continue
    return out


def _clean_after(job: int, timeout: float = 30, temp_dir: bool = True) -> None:
    deadline = time.time() + timeout
    while _left_behind(job) and time.time() < deadline:
        time.sleep(0.5)
    assert not _left_behind(job), _left_behind(job)
    if temp_dir:
        assert not Path(f"/tmp/ray_avspo_{job}").exists()  # Ray's temp dir removed with the job


def _tiny(tmp: Path, n_prompts: int = 32) -> tuple[str, ...]:
    from helpers import tiny_assets

    a = tiny_assets(tmp / "assets", n_prompts)
    return ("--actor.model_name_or_path", a["model"], "--data.prompt_dataset", a["data"])


def test_smoke_config_trains_and_every_interruption_resumes_exactly(slurm, tmp_path):
    """The CPU smoke config through submit.sh: the job starts Ray (the head on gpu01, a host named
    otherwise), trains; USR1 to the batch step -> checkpoint -> requeue -> resume; a preemption by a
    `high` job (SIGTERM to the steps, 60 s grace, no user signal configured) -> checkpoint -> requeue
    -> resume; finishes with every step logged exactly once, DONE, COMPLETED, nothing left."""
    from avspo_openrlhf.cpu.models import model_is_complete
    from avspo_openrlhf.report import read_metrics

    env = _env(tmp_path)
    # A trained step takes 0.2-0.5 s here and an interruption reaches the trainer 1-2 s after the
    # signal, so the run needs steps to spare after each one: 40 (4 prompts a step, one epoch; the two
    # stops came at steps 4 and 7 on an idle machine, and a second test worker beside it makes them later).
    n = 40
    train_flags = (*_tiny(tmp_path, 4 * n), "--run.max_steps", str(n))
    # --no-check: submit.sh's check (avspo-train --dry-run) has its own tests (test_launch.py); here it
    # would only start the stack once more before the job
    job = _submit(tmp_path, env, "--time", "00:40:00", "--no-check", train_flags=train_flags)
    metrics = tmp_path / "run" / "report" / "metrics.jsonl"

    def steps() -> list[int]:
        return [r["step"] for r in read_metrics(str(metrics))[0]] if metrics.exists() else []

    t0 = time.time()

    def mark(event: str) -> list[int]:
        """Printed as it happens, so a failure anywhere shows when each interruption came, at which step."""
        s = steps()
        print(f"{time.time() - t0:6.1f}s {event}: steps {s[-1] if s else 0}")
        return s

    _wait_for(lambda: len(steps()) >= 2, 600, "at step 2")
    mark("USR1 sent")
    j = _job(job)
    assert j["TRES"].split("mem=")[1].split(",")[0] != "2000M"  # --exclusive --mem=0: the node's memory
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True)
    _requeued(job, 1)
    first = mark("requeued (1)")
    _running(job, 300)
    mark("running again")
    _wait_for(lambda: len(steps()) >= len(first) + 2, 600, "two steps after the first resume")
    mark("high job submitted")
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 2"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    _requeued(job, 2, timeout=300)
    mark("requeued (2)")
    _ended(int(high), 120)
    second = mark("high job ended")
    j = _ended(job, 900)
    mark("ended")
    took = time.time() - t0
    log, train = _log(tmp_path, job), _log(tmp_path, job, which="train")
    assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", (j, log[-3000:])
    assert steps() == list(range(1, n + 1)), steps()  # every step once: no step lost or repeated
    assert len(first) < len(second) < n  # two real interruptions, each after progress
    assert (tmp_path / "run" / "DONE").exists() and model_is_complete(str(tmp_path / "run" / "final"))
    assert f"head {NODE} (" in log and "node addresses:" in log  # Slurm name gpu01, Ray's host name
    head_ip = re.search(r"head \S+ \(([\d.]+)\)", log).group(1)
    assert not head_ip.startswith("127.") and f"node addresses: {head_ip}" in log  # the address Ray chose
    assert "USR1 (time limit near" in log
    assert "the job's steps were signalled (a preemption's SIGTERM" in log
    assert log.count("the trainer checkpointed and stopped") == 2 and log.count("requeueing job") == 2
    assert train.count("stopped after a checkpoint") == 2
    _clean_after(job)
    print(f"smoke job {job}: {n} steps, 2 interruptions, {took:.0f} s")


def test_gpu_count_is_what_a_job_step_gets(slurm, tmp_path):
    """--exclusive gives the batch step every GPU of the node (8); Ray and the trainer must get the
    job's request. Three ways to ask: --gpus-per-node, --gres, submit.sh --gpus-per-node."""
    cases = [("--exclusive", "--gpus-per-node=2"), ("--exclusive", "--gres=gpu:1"), ("--gres=gpu:3",)]
    for i, opts in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        env = _fake_env(d, "ok", AVSPO_OUT=str(d / "run"), AVSPO_REPO=str(ROOT))
        job = _sbatch(d, env, "-o", str(d / "out.txt"), *opts)
        j = _ended(job)
        assert j["JobState"] == "COMPLETED", (j, _log(d, job, "avspo"))
        want = int(re.search(r"(\d+)$", opts[-1]).group(1))
        (rec,) = _records(d)
        assert rec["resources"].get("GPU", 0) == want, (opts, rec["resources"])
        argv = rec["argv"]
        assert argv[argv.index("--actor.num_gpus_per_node") + 1] == str(want), opts
        assert argv[argv.index("--vllm.num_engines") + 1] == str(want), opts
        _clean_after(job)


def test_a_crash_fails_the_job_once_and_keeps_rays_logs(slurm, tmp_path):
    job = _submit(tmp_path, _fake_env(tmp_path, "crash"), "--no-check")
    j = _ended(job)
    log = _log(tmp_path, job)
    assert j["JobState"] == "FAILED" and j["ExitCode"] == "1:0" and j["Restarts"] == "0", (j, log)
    assert "avspo-train exited with 1; not requeued" in log
    assert list((tmp_path / "logs" / f"t-{job}").glob("ray-logs-0.tar.gz"))
    _clean_after(job)


def test_a_crash_after_a_stop_request_is_not_requeued(slurm, tmp_path):
    """SLURM_REAL M4: a trainer that fails after USR1 was requeued, and failed again, in a loop."""
    job = _submit(tmp_path, _fake_env(tmp_path, "crash_on_stop"), "--no-check")
    _wait_for(lambda: _records(tmp_path), 120, "training")
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True)
    j = _ended(job)
    assert j["JobState"] == "FAILED" and j["Restarts"] == "0", (j, _log(tmp_path, job))
    time.sleep(3)
    assert _job(job)["Restarts"] == "0"
    _clean_after(job)


def test_a_trainer_that_ignores_stop_is_terminated_and_requeued_once(slurm, tmp_path):
    env = _fake_env(tmp_path, "ignore_stop", AVSPO_STOP_GRACE="4", FAKE_SECONDS="12")
    job = _submit(tmp_path, env, "--no-check")
    _wait_for(lambda: _records(tmp_path), 120, "training")
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True)
    _requeued(job, 1)
    j = _ended(job)  # the second attempt runs its 12 s and finishes
    log = _log(tmp_path, job)
    assert j["JobState"] == "COMPLETED" and j["Restarts"] == "1", (j, log)
    assert "did not stop within 4s of the stop request; terminated" in log
    _clean_after(job)


def test_usr1_while_the_job_starts_is_not_lost(slurm, tmp_path):
    """SLURM_REAL M3: a USR1 during start-up waited for the join check, then the trainer deleted STOP."""
    job = _submit(tmp_path, _fake_env(tmp_path, "until_stop", FAKE_SECONDS="3"), "--no-check")
    _wait_for(lambda: "restart 0:" in _log(tmp_path, job), 120, "started")  # a USR1 before bash runs is dropped
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True)
    _requeued(job, 1)
    j = _ended(job)
    log = _log(tmp_path, job)
    assert j["JobState"] == "COMPLETED", (j, log)
    assert "stop requested before training started" in log or "USR1 while the job was starting" in log, log
    assert len(_records(tmp_path)) == 1  # the first attempt never started the trainer
    _clean_after(job)


def test_usr1_to_every_step_checkpoints_instead_of_killing_ray(slurm, tmp_path):
    """`scancel --signal=USR1 JOB` without --batch (what most users type) reaches every step: it used
    to kill the Ray head with nothing checkpointed (SLURM_REAL M5)."""
    job = _submit(tmp_path, _fake_env(tmp_path, "until_stop", FAKE_SECONDS="5"), "--no-check")
    _wait_for(lambda: _records(tmp_path), 120, "training")
    subprocess.run(["scancel", "--signal=USR1", str(job)], check=True)
    _requeued(job, 1)
    j = _ended(job)
    log = _log(tmp_path, job)
    assert j["JobState"] == "COMPLETED", (j, log)
    assert "the job's steps were signalled" in log and "the trainer checkpointed and stopped" in log
    assert "Ray head on" not in log  # the head survived the USR1
    _clean_after(job)


def test_scancel_mid_run_tears_everything_down(slurm, tmp_path):
    job = _submit(tmp_path, _fake_env(tmp_path, "until_stop"), "--no-check")
    _wait_for(lambda: _records(tmp_path), 120, "training")
    assert _left_behind(job)
    subprocess.run(["scancel", str(job)], check=True)
    j = _ended(job)
    assert j["JobState"] == "CANCELLED" and j["Restarts"] == "0"
    # Slurm may SIGKILL the teardown after KillWait (10 s here) before it removed Ray's temp dir;
    # the processes are gone either way, and the next launcher job removes the dir
    _clean_after(job, timeout=40, temp_dir=False)
    if Path(f"/tmp/ray_avspo_{job}").exists():
        nxt = _submit(tmp_path, _fake_env(tmp_path, "ok"), "--no-check", "--out", str(tmp_path / "run2"))
        assert _ended(nxt)["JobState"] == "COMPLETED"
        assert not Path(f"/tmp/ray_avspo_{job}").exists()
        _clean_after(nxt)


def test_preemption_without_grace_requeues_and_leaves_nothing(slurm, tmp_path):
    """GraceTime 0: no time to checkpoint; Slurm requeues the job, which resumes from its last
    periodic checkpoint; the killed attempt leaves no process behind."""
    job = _submit(
        tmp_path, _fake_env(tmp_path, "until_stop", FAKE_SECONDS="10"), "--no-check", "--partition", "nograce"
    )
    _wait_for(lambda: _records(tmp_path), 120, "training")
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    _requeued(job, 1)
    _ended(int(high), 60)
    j = _ended(job)
    assert j["JobState"] == "COMPLETED" and j["Restarts"] == "1", (j, _log(tmp_path, job))
    assert len(_records(tmp_path)) == 2
    _clean_after(job)


def test_a_head_that_dies_fails_the_job_in_seconds(slurm, tmp_path):
    """SLURM_REAL H3: the GCS port taken by another process; the launcher polled the dead head for
    10 minutes. Now the job fails as soon as the head exits, with the end of its log."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        env = _fake_env(tmp_path, "ok", AVSPO_PORT_BASE=str(port))
        t0 = time.time()
        job = _submit(tmp_path, env, "--no-check")
        j = _ended(job, 180)
    took = time.time() - t0
    log = _log(tmp_path, job)
    assert j["JobState"] == "FAILED", (j, log)
    assert f"the Ray head on {NODE} exited" in log, log
    assert took < 90, took
    assert not _records(tmp_path)
    _clean_after(job)


def test_two_jobs_on_one_node_keep_their_own_ray(slurm, tmp_path):
    """Two jobs share the node (plain sbatch, --oversubscribe, from a folder outside the repository
    with no logs/): the first one's teardown must not touch the second one's Ray, which checks its
    cluster again before it finishes."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    opts = ("--oversubscribe", "-c", "1", "--mem=3000")
    ja = _sbatch(a, _fake_env(a, "until_stop", FAKE_SECONDS="4", AVSPO_OUT=str(a / "run")), *opts)
    jb = _sbatch(b, _fake_env(b, "until_stop", FAKE_SECONDS="25", FAKE_RECHECK="1", AVSPO_OUT=str(b / "run")), *opts)
    assert _ended(ja)["JobState"] == "COMPLETED", _log(a, ja, "avspo")
    assert _job(jb)["JobState"] == "RUNNING"
    jb_state = _ended(jb)
    assert jb_state["JobState"] == "COMPLETED", (jb_state, _log(b, jb, "avspo"), (b / f"avspo-{jb}.out").read_text())
    assert len(_records(b)) == 2  # start and end: its Ray answered after the other job's teardown
    assert (a / f"avspo-{ja}.out").exists()  # the default output lands in the submit folder
    _clean_after(ja)
    _clean_after(jb)


def test_login_node_dry_run_and_a_finished_run(slurm, tmp_path):
    """On a node with scontrol but outside any allocation, --dry-run prints the job (SLURM_REAL H1);
    resubmitting a finished run is refused before anything is queued (SLURM_REAL L4)."""
    env = _env(tmp_path)
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "tiny_cpu_smoke", "--dry-run", "--no-check", "--out",
                        str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "avspo_openrlhf.cluster.ray_wait" in r.stdout and "--signal=B:USR1@300" in r.stdout
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "DONE").touch()
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "tiny_cpu_smoke", "--no-check", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "already finished (DONE)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Submitted" not in r.stdout


def test_reaper_spares_other_jobs_and_itself():
    """The teardown's process selection (cluster/reap.py) on processes started here: only the tag."""
    from avspo_openrlhf.cluster.reap import reap, tagged

    env = {**os.environ, "AVSPO_JOB_TAG": "424242.0"}
    mine = subprocess.Popen(["sleep", "60"], env=env)
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, "AVSPO_JOB_TAG": "424243.0"})
    try:
        from avspo_openrlhf.cluster.reap import sweep_temp

        tmp = Path(tempfile.mkdtemp())
        (tmp / "ray_avspo_424242").mkdir()  # its job still has a process here: kept
        (tmp / "ray_avspo_999999").mkdir()  # nobody's any more: removed
        assert sweep_temp(str(tmp)) == [str(tmp / "ray_avspo_999999")]
        assert (tmp / "ray_avspo_424242").exists()
        assert [p.pid for p in tagged("424242.0")] == [mine.pid]
        assert reap("424242.0", grace=5) == (1, [])  # sleep stops on SIGTERM: none killed
        mine.wait(5)  # gone (the reaper collected its exit status: it is this test's child)
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()


def test_the_reaper_waits_for_running_processes_not_for_zombies():
    """A process that exited but whose parent has not reaped it (the launcher script's own children
    while it runs the reaper in the foreground) is stopped: waiting for it to vanish cost every
    teardown its whole grace time. A process that ignores SIGTERM still runs, and is killed."""
    import psutil

    from avspo_openrlhf.cluster.reap import _wait_running, terminate_then_kill

    pid_file = Path(tempfile.mkdtemp()) / "pid"
    # the parent runs a foreground sleep: it reaps no child until that ends
    parent = subprocess.Popen(["bash", "-c", f"sleep 100 & echo $! > {pid_file}; sleep 60"], start_new_session=True)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; exec sleep 100"])  # SIGTERM stays ignored
    try:
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.05)
        child = psutil.Process(int(pid_file.read_text()))
        child.terminate()
        child_stopped = _wait_running([child], timeout=60)
        assert child_stopped == [] and child.status() == psutil.STATUS_ZOMBIE
        time.sleep(0.2)  # its trap is set
        s = psutil.Process(stubborn.pid)
        s.terminate()
        assert _wait_running([s], timeout=0.5) == [s]  # SIGTERM ignored: still running
        terminate_then_kill([s], grace=0.5)
        assert stubborn.wait(5) == -9
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()
        stubborn.kill()


def test_the_reaper_stops_children_before_their_supervisor(tmp_path):
    """A supervisor stops its own children on SIGTERM, one at a time (``ray start --block``: it
    outlived a 10 s grace in every teardown); the reaper stops the children first, so the supervisor
    finds nothing left to stop and nobody needs SIGKILL."""
    from avspo_openrlhf.cluster.reap import reap

    seen = tmp_path / "seen"
    supervisor = textwrap.dedent(
        f"""
        import signal, subprocess, sys, time
        child = subprocess.Popen(["sleep", "100"])
        def stop(*_):
            open({str(seen)!r}, "w").write("child running" if child.poll() is None else "child stopped")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(seen)!r} + ".ready", "w").close()
        while True:
            time.sleep(0.05)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", supervisor], env={**os.environ, "AVSPO_JOB_TAG": "424244.0"})
    try:
        _wait_for(lambda: Path(f"{seen}.ready").exists(), 30, "the supervisor and its child")
        assert reap("424244.0", grace=20) == (2, [])
        assert seen.read_text() == "child stopped"
    finally:
        p.kill()
