"""Wait until every node of a SLURM allocation has joined the Ray cluster with its GPUs.

    python -m avspo_openrlhf.cluster.ray_wait --address HEAD_IP:PORT --nodes n1 n2 --gpus-per-node 8 --timeout 600

Polls ``ray.nodes()`` (not a fixed ``sleep``) every ``--interval`` seconds. Exits 0 once every
expected host is alive with at least ``--gpus-per-node`` GPUs; exits 1 at the timeout with one line
naming the nodes that never joined (or joined without their GPUs). Hosts are compared by their
short name, so ``gpu01`` matches ``gpu01.cluster.local``.

The timeout holds whatever the head does: one ``ray.init`` against a port that is open but not a
working GCS retries for ~12 minutes inside Ray (``RAY_NUM_REDIS_GET_RETRIES`` attempts of ~36 s), so
the port is probed with a plain socket first and ``ray.init`` runs with the remaining time as its
own deadline.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time


def _short(host: str) -> str:
    return host.split(".", 1)[0].lower()


def missing_nodes(expected: list[str], nodes: list[dict], gpus_per_node: float) -> dict[str, str]:
    """``{host: why}`` for every expected host that is not alive in ``nodes`` (``ray.nodes()``
    records) with ``gpus_per_node`` GPUs."""
    alive: dict[str, float] = {}
    for n in nodes:
        if n.get("Alive", n.get("alive", False)):
            host = _short(str(n.get("NodeManagerHostname", "")))
            alive[host] = max(alive.get(host, 0.0), float(n.get("Resources", {}).get("GPU", 0.0)))
    out = {}
    for h in expected:
        got = alive.get(_short(h))
        if got is None:
            out[h] = "not joined"
        elif got < gpus_per_node:
            out[h] = f"joined with {got:g} of {gpus_per_node:g} GPUs"
    return out


def listening(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``HOST:PORT``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):  # refused, unreachable, or not HOST:PORT
        return False


def _init_within(address: str, seconds: float) -> None:
    """``ray.init(address)`` that gives up after ``seconds`` (it would retry for minutes)."""
    import ray

    err: list = []

    def run():
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            err.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(max(seconds, 1.0))
    if t.is_alive():
        print(
            f"[ray_wait] error: {address} accepts connections but did not answer as a Ray head within "
            f"{seconds:.0f} s (another process on the port, or a GCS that failed to start)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)  # the init thread cannot be interrupted
    if err:
        raise err[0]


def wait(address: str, expected: list[str], gpus_per_node: float, timeout: float, interval: float = 5.0) -> int:
    import ray

    deadline = time.monotonic() + timeout
    connected, last = False, {h: "not joined" for h in expected}
    while True:
        try:
            if not connected:
                if not listening(address):
                    raise ConnectionRefusedError("nothing listening")
                _init_within(address, deadline - time.monotonic())
                connected = True
            nodes = ray.nodes()
            last = missing_nodes(expected, nodes, gpus_per_node)
        except Exception as e:  # noqa: BLE001 - the head may not be up yet; keep polling until the deadline
            last = {h: f"head unreachable ({type(e).__name__})" for h in expected}
        if not last:
            ips = sorted({str(n.get("NodeManagerAddress")) for n in nodes if n.get("Alive", n.get("alive"))})
            print(
                f"[ray_wait] all {len(expected)} node(s) joined with {gpus_per_node:g} GPU(s) each; "
                f"node addresses: {' '.join(ips)}",
                flush=True,
            )
            if connected:
                ray.shutdown()
            return 0
        if time.monotonic() >= deadline:
            why = ", ".join(f"{h} ({w})" for h, w in last.items())
            print(
                f"[ray_wait] error: after {timeout:g} s, {len(last)} of {len(expected)} node(s) missing from the "
                f"Ray cluster at {address}: {why}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        print(f"[ray_wait] waiting for {len(last)} node(s): {', '.join(sorted(last))}", flush=True)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="ray_wait", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="HEAD_IP:PORT of the Ray head (GCS)")
    p.add_argument("--nodes", nargs="+", required=True, help="hostnames that must join (scontrol show hostnames)")
    p.add_argument("--gpus-per-node", type=float, default=0, help="GPUs each node must bring")
    p.add_argument("--timeout", type=float, default=600, help="seconds before the job fails")
    p.add_argument("--interval", type=float, default=5, help="seconds between polls")
    a = p.parse_args(argv)
    return wait(a.address, a.nodes, a.gpus_per_node, a.timeout, a.interval)


if __name__ == "__main__":
    sys.exit(main())
