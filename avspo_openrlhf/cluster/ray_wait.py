"""Wait until every node of a SLURM allocation has joined the Ray cluster with its GPUs.

    python -m avspo_openrlhf.cluster.ray_wait --address HEAD_IP:PORT --nodes n1 n2 --gpus-per-node 8 --timeout 600

Polls ``ray.nodes()`` (not a fixed ``sleep``) every ``--interval`` seconds. Exits 0 once every
expected host is alive with at least ``--gpus-per-node`` GPUs; exits 1 at the timeout with one line
naming the nodes that never joined (or joined without their GPUs). Hosts are compared by their
short name, so ``gpu01`` matches ``gpu01.cluster.local``.
"""

from __future__ import annotations

import argparse
import sys
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


def wait(address: str, expected: list[str], gpus_per_node: float, timeout: float, interval: float = 5.0) -> int:
    import ray

    deadline = time.monotonic() + timeout
    connected, last = False, {h: "not joined" for h in expected}
    while True:
        try:
            if not connected:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
                connected = True
            last = missing_nodes(expected, ray.nodes(), gpus_per_node)
        except Exception as e:  # noqa: BLE001 - the head may not be up yet; keep polling until the deadline
            last = {h: f"head unreachable ({type(e).__name__})" for h in expected}
        if not last:
            print(f"[ray_wait] all {len(expected)} node(s) joined with {gpus_per_node:g} GPU(s) each", flush=True)
            if connected:
                ray.shutdown()
            return 0
        if time.monotonic() >= deadline:
            why = ", ".join(f"{h} ({w})" for h, w in last.items())
            print(f"[ray_wait] error: after {timeout:g} s, {len(last)} of {len(expected)} node(s) missing from the "
                  f"Ray cluster at {address}: {why}", file=sys.stderr, flush=True)  # fmt: skip
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
