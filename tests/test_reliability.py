"""Faults an operator or a second user causes: a second writer on a run or evaluation folder, a
lock left by a killed process, the Ray services of a CPU run reached from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import FIXTURES
from test_preflight import GOOD, _fails, _flags, _rows

from avspo_openrlhf.folder_lock import LOCK_NAME, FolderBusy, lock_folder, release_folder

HOLD = textwrap.dedent(
    """
    import sys, time
    from avspo_openrlhf.folder_lock import lock_folder
    lock_folder(sys.argv[1], sys.argv[2])
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(folder, what="avspo-train"):
    """Another process holding ``folder`` (as a second training or evaluation would)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), what], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_and_a_dead_holder_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    holder = _holder(folder)
    try:
        with pytest.raises(FolderBusy) as e:
            lock_folder(str(folder), "avspo-train")
        assert f"PID {holder.pid}" in str(e.value) and "one avspo-train per folder" in str(e.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # the OOM killer: no cleanup runs
        holder.wait()
    assert (folder / LOCK_NAME).exists()  # the stale file stays; its lock died with the process
    lock_folder(str(folder), "avspo-train")
    assert f"PID {os.getpid()}" in (folder / LOCK_NAME).read_text()
    release_folder(str(folder))


def test_avspo_train_refuses_a_run_folder_in_use_before_ray(tmp_path, capsys):
    holder = _holder(tmp_path / "ckpt")
    try:
        msg = _fails(capsys, _flags(tmp_path, _rows(tmp_path, GOOD)))
    finally:
        holder.kill()
        holder.wait()
    assert f"{tmp_path / 'ckpt'} is in use by avspo-train (host" in msg and f"PID {holder.pid}" in msg


def test_avspo_eval_refuses_an_output_folder_in_use(tmp_path):
    comps = tmp_path / "comps.jsonl"
    comps.write_text(json.dumps({"unique_id": "x", "completions": ["\\boxed{1}"]}) + "\n")
    out = tmp_path / "eval"
    holder = _holder(out, "avspo-eval")
    try:
        r = subprocess.run([sys.executable, "-m", "avspo_openrlhf.evaluation.cli", "--completions", str(comps),
                            "--benchmarks", "gsm8k", "--data", f"gsm8k={FIXTURES / 'gsm8k_20.jsonl'}", "--output",
                            str(out)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err[-1].startswith("avspo-eval: error: ") and "in use by avspo-eval" in err[-1]
    assert not (out / "gsm8k").exists()  # nothing written


def _listening(pids: set[int]) -> list:
    import psutil

    return [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]


PROBE = textwrap.dedent(
    """
    import json, sys, psutil
    from avspo_openrlhf.ray_auth import enable_token_auth
    assert enable_token_auth() == "token"  # what avspo-train does first, before Ray is imported
    import ray
    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs
    install_gpu_module_stubs()
    from avspo_openrlhf.cpu.backend import init_ray
    init_ray()
    ray.get(ray.remote(lambda: 1).remote())
    me = psutil.Process()
    pids = sorted(p.pid for p in me.children(recursive=True))
    gcs = ray.get_runtime_context().gcs_address
    print("PROBE " + json.dumps({"pids": pids, "gcs": gcs}), flush=True)
    sys.stdin.readline()  # until the test has probed
    ray.shutdown()
    """
)


def test_the_cpu_backends_ray_refuses_callers_without_the_runs_token(tmp_path):
    """Ray listens on every interface (GCS, raylet and worker gRPC, the agents' HTTP servers) and
    its job agent runs any entrypoint POSTed to it. The CPU backend turns on Ray's token
    authentication with a token only its own processes hold: a job POSTed to every listening port
    runs nothing, and a client without the token cannot join the cluster."""
    import http.client
    import urllib.error
    import urllib.request

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    err = open(tmp_path / "probe.err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            stderr=err, env=env, cwd=tmp_path)  # fmt: skip
    try:
        line = "-"
        while line and not line.startswith("PROBE "):  # Ray and wandb print their own lines first
            line = proc.stdout.readline()
        assert line, (tmp_path / "probe.err").read_text()[-3000:]
        info = json.loads(line.removeprefix("PROBE "))
        socks = _listening(set(info["pids"]))
        assert socks, "no listening socket found for the run's Ray processes"
        marker = tmp_path / "pwned"
        job = json.dumps({"entrypoint": f"touch {marker}", "submission_id": "probe"}).encode()
        statuses = {}
        for c in socks:
            host = "127.0.0.1" if c.laddr.ip in ("0.0.0.0", "::") else c.laddr.ip
            url = f"http://{host}:{c.laddr.port}/api/job_agent/jobs/"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=job, method="POST"), timeout=5) as r:
                    statuses[c.laddr.port] = r.status
            except urllib.error.HTTPError as e:
                statuses[c.laddr.port] = e.code
            except (OSError, ValueError, http.client.HTTPException):  # a gRPC port: not HTTP
                statuses[c.laddr.port] = None
        assert not any(s is not None and 200 <= s < 300 for s in statuses.values()), statuses
        assert 401 in statuses.values(), statuses  # the agents answered, and refused
        # a Ray client without the token is refused by the GCS
        join = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={info['gcs']!r})"],
                              capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip
        assert join.returncode != 0 and "auth" in (join.stdout + join.stderr).lower(), join.stderr[-2000:]
        time.sleep(1)
        assert not marker.exists()
    finally:
        try:
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
        err.close()
